//! `parallel.pipeline.output_broadcast`: the last stage's loss of every micro-batch reaches
//! every rank; off, nothing changes.

use crate::run_util::{self, small_gpt};

fn config(
    out: &std::path::Path,
    devices: usize,
    keys: &str,
    broadcast: bool,
) -> runtime::TrainConfig {
    let parallel = format!(
        "devices = {devices}\nmode = \"semi_auto\"\n{keys}\n[parallel.pipeline]\nstages = 2\nmicro_batches = 4\noutput_broadcast = {broadcast}"
    );
    small_gpt(
        out,
        "momentum",
        "",
        &parallel,
        &["train.max_steps=5".to_string()],
    )
}

/// With it on, every rank reports, for every step, the same four micro-batch losses (those
/// the last stage computed), whose mean is the step's loss; the step losses are those of the
/// run with it off, bit for bit, and that run reports no micro-batch losses.
#[test]
fn output_broadcast_gives_every_rank_the_last_stages_losses() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, devices, keys) in [
        ("2 stages", 2, "model_parallel = 1"),
        (
            "2 stages × data parallel 2",
            4,
            "data_parallel = 2\nmodel_parallel = 1",
        ),
        ("2 stages × model parallel 2", 4, "model_parallel = 2"),
    ] {
        let on = config(
            &tmp.path().join(format!("{devices}-{name}-on")),
            devices,
            keys,
            true,
        );
        let off = config(
            &tmp.path().join(format!("{devices}-{name}-off")),
            devices,
            keys,
            false,
        );
        let (_, on_report, on_run) = run_util::train_report(&on);
        let (_, off_report, off_run) = run_util::train_report(&off);
        let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&on_run.0),
            bits(&off_run.0),
            "{name}: losses unchanged"
        );
        assert!(off_report
            .ranks
            .iter()
            .all(|r| r.micro_batch_losses.is_empty()));
        let last = on_report.ranks.last().unwrap();
        assert_eq!(
            last.micro_batch_losses.len(),
            5,
            "{name}: one list per step"
        );
        for (rank, r) in on_report.ranks.iter().enumerate() {
            assert_eq!(
                r.micro_batch_losses, last.micro_batch_losses,
                "{name}: rank {rank} reports the last stage's micro-batch losses"
            );
        }
        for (step, (mbs, loss)) in last.micro_batch_losses.iter().zip(&on_run.0).enumerate() {
            assert_eq!(mbs.len(), 4, "{name}: step {step}");
            let mean = mbs.iter().map(|&x| x as f64).sum::<f64>() / 4.0;
            assert!(
                ((mean - *loss as f64) / *loss as f64).abs() < 1e-5,
                "{name}: step {step}: mean of {mbs:?} is not the step's loss {loss}"
            );
            assert!(
                mbs.iter().any(|&x| x != mbs[0]),
                "{name}: step {step}: the micro-batches' own losses, not one value: {mbs:?}"
            );
        }
    }
}
