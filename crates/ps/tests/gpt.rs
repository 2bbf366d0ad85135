//! The GPT in parameter-server mode: sync SGD over 2 workers equals data-parallel all-reduce
//! training on 2 ranks step for step, with the parameters split over 2 servers.

use std::path::{Path, PathBuf};

use runtime::{LaunchOptions, Session, TrainConfig};

use crate::util::run_in_process;

/// The bundled KJV text.
fn kjv() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/kjv/kjv.txt.gz")
}

/// A small GPT (2 blocks, 8 heads, width 32, 16 tokens, global batch 8, momentum) on the KJV
/// bytes for `steps` steps with `[parallel]` body `parallel` and `[ps]` body `ps` (none when
/// empty).
pub fn gpt_text(out: &Path, parallel: &str, ps: &str, steps: u64) -> String {
    let ps = match ps.is_empty() {
        true => String::new(),
        false => format!("[ps]\n{ps}\n"),
    };
    format!(
        r#"
[model]
name = "gpt"
layers = 2
heads = 8
hidden = 32
seq_len = 16
ffn_hidden = 64
[data]
format = "text"
path = "{data}"
batch_size = 8
steps_per_epoch = 20
[parallel]
{parallel}
{ps}
[train]
epochs = 1
max_steps = {steps}
optimizer = "momentum"
learning_rate = 0.01
momentum = 0.9
seed = 5
eval = false
per_print_times = 0
[output]
dir = "{out}"
"#,
        data = kjv().display(),
        out = out.display(),
    )
}

fn parse(text: &str) -> TrainConfig {
    TrainConfig::parse(text, None, &[], Path::new("/")).expect("a valid GPT config")
}

#[test]
fn sync_ps_gpt_matches_data_parallel_all_reduce_step_for_step() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 6;
    let dp_config = parse(&gpt_text(
        &dir.path().join("dp"),
        "mode = \"data_parallel\"\ndevices = 2",
        "",
        steps,
    ));
    let session = Session::new(&dp_config).expect("a DP session");
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    let dp = runtime::train_local(&session, &options)
        .expect("DP trains")
        .losses()
        .to_vec();
    let ps_config = parse(&gpt_text(
        &dir.path().join("ps"),
        "mode = \"parameter_server\"",
        "servers = 2\nworkers = 2",
        steps,
    ));
    let report = run_in_process(&ps_config, 2, 2);
    assert_eq!(report.losses.len(), dp.len());
    for (i, (a, b)) in report.losses.iter().zip(&dp).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5,
            "step {}: PS loss {a} vs DP {b}",
            i + 1
        );
    }
    // The losses move: a run that did not train would not match by accident.
    assert!(dp[0] - dp[dp.len() - 1] > 0.05, "{dp:?}");
}

#[test]
fn ps_gpt_refuses_evaluation_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let text = gpt_text(dir.path(), "mode = \"parameter_server\"", "workers = 2", 2)
        .replace("eval = false", "eval = true");
    let err = ps::compute::Compute::new(&parse(&text))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("train.eval"), "{err}");
}
