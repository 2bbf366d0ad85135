//! `tessera ckpt verify`: a checkpoint checked against its strategy.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use serde_json::json;

use super::flags::{check_input_dir, check_input_file, CHECKPOINT_DIR, STRATEGY_FILE};
use super::output::{path_str, print};

/// Arguments of `tessera ckpt verify`.
#[derive(Debug, Args)]
pub(super) struct VerifyArgs {
    /// Checkpoint directory (holding rank_<N>/).
    #[arg(long)]
    src: PathBuf,
    /// The strategy file.
    #[arg(long)]
    strategy: PathBuf,
    /// Also compare every replica's bytes.
    #[arg(long)]
    replicas: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera ckpt verify`; fails when any fault is found.
pub(super) fn verify(a: &VerifyArgs) -> anyhow::Result<()> {
    check_input_dir("--src", &a.src, CHECKPOINT_DIR)?;
    check_input_file("--strategy", &a.strategy, STRATEGY_FILE)?;
    let r = ckpt::verify_checkpoints(&a.src, &a.strategy, a.replicas)?;
    let mut text = format!(
        "{} files, {} parameters, {} slices checked, {} replica pairs compared\n",
        r.n_files, r.n_params, r.n_slices, r.n_replica_pairs
    );
    for f in &r.faults {
        text.push_str(&format!("FAULT {f}\n"));
    }
    text.push_str(if r.is_ok() { "OK\n" } else { "FAILED\n" });
    print(
        a.json,
        json!({
            "ok": r.is_ok(),
            "files": r.n_files,
            "parameters": r.n_params,
            "slices": r.n_slices,
            "replica_pairs": r.n_replica_pairs,
            "faults": r.faults.iter().map(|f| json!({"path": path_str(&f.path), "tensor": f.tensor, "rule": f.rule})).collect::<Vec<_>>(),
        }),
        text,
    )?;
    if !r.is_ok() {
        bail!("{} fault(s) found", r.faults.len());
    }
    Ok(())
}
