//! How `tessera ckpt` shows its work: a progress bar on stderr, and results on stdout as text
//! or as one JSON object.

use std::path::Path;

use ckpt::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;

use crate::stdout::write_stdout;

/// A progress bar on stderr: hidden when stderr is not a terminal or with `--quiet`.
pub(super) struct Bar(ProgressBar);

impl Bar {
    /// A bar, hidden when `quiet`.
    pub(super) fn new(quiet: bool) -> Bar {
        let bar = if quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
        };
        Bar(bar)
    }
}

impl Progress for Bar {
    fn start(&self, label: &str, total_bytes: u64) {
        self.0.set_length(total_bytes);
        self.0.set_position(0);
        self.0.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        self.0.set_message(label.to_string());
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

/// Prints `value` as pretty JSON when `json`, else `text`, to stdout.
pub(super) fn print(json: bool, value: Value, text: String) -> anyhow::Result<()> {
    if json {
        let mut s = serde_json::to_string_pretty(&value)?;
        s.push('\n');
        write_stdout(&s)
    } else {
        write_stdout(&text)
    }
}

/// A path as a JSON string.
pub(super) fn path_str(p: &Path) -> String {
    p.display().to_string()
}
