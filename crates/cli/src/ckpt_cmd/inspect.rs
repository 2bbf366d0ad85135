//! `tessera ckpt inspect`: the contents of one checkpoint, strategy or group-info file.

use std::path::PathBuf;

use ckpt::InspectedFile;
use clap::Args;
use serde_json::json;

use super::output::print;
use crate::stdout::outln;

/// Arguments of `tessera ckpt inspect`.
#[derive(Debug, Args)]
pub(super) struct InspectArgs {
    /// A checkpoint, strategy or group-info file.
    file: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera ckpt inspect`.
pub(super) fn inspect(a: &InspectArgs) -> anyhow::Result<()> {
    runtime::check_input_path(
        "file to inspect",
        &a.file,
        runtime::PathKind::File,
        "a file (a checkpoint, strategy or group-info file)",
    )?;
    let (file, detected) = ckpt::inspect_detected(&a.file)?;
    // Strategy and group-info listings have their own JSON; the detection goes beside it.
    if !matches!(file, InspectedFile::Checkpoint(_)) {
        if a.json {
            eprintln!("detected: {detected}");
        } else {
            outln!("detected: {detected}")?;
        }
    }
    match file {
        InspectedFile::Checkpoint(f) => {
            let mut text = format!(
                "{} ({} checkpoint, {} tensors)\ndetected: {detected}\n",
                f.path().display(),
                f.format(),
                f.tensors().len()
            );
            if !f.metadata().is_empty() {
                text.push_str(&format!("metadata: {:?}\n", f.metadata()));
            }
            if let Some(crc) = f.crc() {
                text.push_str(&format!("crc_num: {crc} (verified)\n"));
            }
            for t in f.tensors() {
                text.push_str(&format!(
                    "  {:<32} {:<9} {:<16} {:>10} bytes{}\n",
                    t.name,
                    t.ty.mindspore_name(),
                    format!("{:?}", t.shape),
                    t.n_bytes,
                    if t.n_chunks() > 1 {
                        format!(" in {} chunks", t.n_chunks())
                    } else {
                        String::new()
                    }
                ));
            }
            print(
                a.json,
                json!({
                    "kind": "checkpoint",
                    "format": f.format().to_string(),
                    "detected": detected,
                    "metadata": f.metadata(),
                    "crc": f.crc(),
                    "tensors": f.tensors().iter().map(|t| json!({
                        "name": t.name, "dtype": t.ty.mindspore_name(), "shape": t.shape,
                        "bytes": t.n_bytes, "chunks": t.n_chunks(),
                    })).collect::<Vec<_>>(),
                }),
                text,
            )
        }
        InspectedFile::Strategy(s) => crate::strategy_cmd::show_strategy(&s, a.json),
        InspectedFile::GroupInfo(g) => crate::strategy_cmd::show_group_info(&g, a.json),
    }
}
