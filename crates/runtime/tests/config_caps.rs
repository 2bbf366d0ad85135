//! Settings the run caps or reads per pipeline stage say so: `parallel.hsdp.shard_size` above
//! a parameter's replicas is capped with a warning naming the value and the replicas (checked
//! against what the parallel pass decides), a GPT split that does not match a stage's devices
//! names the per-stage count, and the warnings of one config are given to every run of it in
//! the process.

use std::path::Path;

use runtime::{Session, TrainConfig};

use crate::run_util;

/// The small GPT of `run_util` on `devices` devices in `semi_auto` with the `[parallel]` lines
/// `extra` and `[parallel.hsdp]` sharding every parameter (threshold 0) with `shard_size`.
fn gpt(out: &Path, devices: usize, extra: &str, shard_size: i64) -> TrainConfig {
    gpt_with(out, devices, extra, shard_size, &[])
}

/// [`gpt`] with command-line style `overrides`.
fn gpt_with(
    out: &Path,
    devices: usize,
    extra: &str,
    shard_size: i64,
    overrides: &[&str],
) -> TrainConfig {
    let parallel = format!(
        "devices = {devices}\nmode = \"semi_auto\"\n{extra}\n[parallel.hsdp]\nthreshold = 0\nshard_size = {shard_size}\n"
    );
    let mut all = vec!["train.max_steps=1".to_string()];
    all.extend(overrides.iter().map(|o| o.to_string()));
    run_util::small_gpt(out, "adam", "", &parallel, &all)
}

/// The warnings of `config` about `parallel.hsdp.shard_size`.
fn shard_size_warnings(config: &TrainConfig) -> Vec<String> {
    config
        .warnings()
        .into_iter()
        .filter(|w| w.contains("parallel.hsdp.shard_size"))
        .collect()
}

/// Every sharded trainable parameter of `config`'s training program: (its replicas, the ranks
/// it is sharded over).
fn shard_sizes(config: &TrainConfig) -> Vec<(usize, usize)> {
    let session = Session::new(config).expect("the session builds");
    session
        .train
        .params
        .iter()
        .filter_map(|p| {
            let shard = p.optimizer_shard()?;
            Some((shard.strategy_layout.replica_count(), shard.size))
        })
        .collect()
}

/// Two pipeline stages of 4 devices: `shard_size = 8` (a divisor of the 8 devices) is more
/// than any parameter's replicas, so every parameter is sharded over its 4; the warning says
/// so with the per-stage arithmetic.
#[test]
fn shard_size_above_the_stage_devices_is_reported_as_capped() {
    let tmp = tempfile::tempdir().unwrap();
    let staged = "[parallel.pipeline]\nstages = 2\nmicro_batches = 2";
    let config = gpt(tmp.path(), 8, staged, 8);
    let warned = shard_size_warnings(&config);
    assert_eq!(warned.len(), 1, "{:?}", config.warnings());
    for part in [
        "parallel.hsdp.shard_size = 8",
        "capped to 4",
        "8 devices / 2 stages = 4",
    ] {
        assert!(warned[0].contains(part), "{part}: {warned:?}");
    }
    let sizes = shard_sizes(&config);
    assert!(!sizes.is_empty());
    assert!(sizes.iter().all(|&s| s == (4, 4)), "{sizes:?}");
    // shard_size 4 is what the stages hold: no warning.
    let fits = gpt(tmp.path(), 8, staged, 4);
    assert!(
        shard_size_warnings(&fits).is_empty(),
        "{:?}",
        fits.warnings()
    );
}

/// dp 2 × mp 2 on 4 devices: the weights model_parallel splits have 2 replicas, the others 4.
/// `shard_size = 4` is capped to 2 for the split ones only, and the warning names both.
#[test]
fn shard_size_above_the_model_parallel_replicas_is_reported_as_capped() {
    let tmp = tempfile::tempdir().unwrap();
    let split = "data_parallel = 2\nmodel_parallel = 2";
    let config = gpt(tmp.path(), 4, split, 4);
    let warned = shard_size_warnings(&config);
    assert_eq!(warned.len(), 1, "{:?}", config.warnings());
    for part in [
        "parallel.hsdp.shard_size = 4",
        "capped to 2",
        "parallel.model_parallel = 2",
    ] {
        assert!(warned[0].contains(part), "{part}: {warned:?}");
    }
    let sizes = shard_sizes(&config);
    assert!(sizes.contains(&(2, 2)), "{sizes:?}");
    assert!(sizes.contains(&(4, 4)), "{sizes:?}");
    assert!(sizes.iter().all(|&(r, k)| k == r.min(4)), "{sizes:?}");
    // Within every parameter's replicas, or -1: no warning.
    for (extra, size) in [(split, 2), (split, -1), ("model_parallel = 1", 4)] {
        let quiet = gpt(tmp.path(), 4, extra, size);
        assert!(
            shard_size_warnings(&quiet).is_empty(),
            "{extra} {size}: {:?}",
            quiet.warnings()
        );
    }
}

/// `shard_size = 1` shards nothing: the warning says `[parallel.hsdp]` has no effect.
#[test]
fn shard_size_one_is_reported_as_having_no_effect() {
    let tmp = tempfile::tempdir().unwrap();
    let config = gpt(tmp.path(), 4, "model_parallel = 1", 1);
    let warned = shard_size_warnings(&config);
    assert_eq!(warned.len(), 1, "{:?}", config.warnings());
    assert!(
        warned[0].contains("parallel.hsdp.shard_size = 1") && warned[0].contains("no effect"),
        "{warned:?}"
    );
    assert!(shard_sizes(&config).is_empty());
    let two = gpt(tmp.path(), 4, "model_parallel = 1", 2);
    assert!(shard_size_warnings(&two).is_empty(), "{:?}", two.warnings());
    assert!(!shard_sizes(&two).is_empty());
}

/// A divisor of the devices that does not divide a parameter's replicas leaves it whole: 12
/// devices in 2 stages of 6 with `shard_size = 4` shard nothing over 4 ranks, and dp 6 × mp 2
/// on 12 devices leaves the 6-replica weights model_parallel splits whole while the others
/// (12 replicas) are sharded over 4. Both are reported.
#[test]
fn shard_size_not_dividing_the_replicas_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let batch = ["data.batch_size=24"];
    let staged = gpt_with(
        tmp.path(),
        12,
        "[parallel.pipeline]\nstages = 2\nmicro_batches = 2",
        4,
        &batch,
    );
    let warned = shard_size_warnings(&staged);
    assert_eq!(warned.len(), 1, "{:?}", staged.warnings());
    for part in [
        "parallel.hsdp.shard_size = 4 does not divide",
        "12 devices / 2 stages = 6",
        "left whole",
    ] {
        assert!(warned[0].contains(part), "{part}: {warned:?}");
    }
    assert!(
        shard_sizes(&staged).iter().all(|&(_, k)| k != 4),
        "{:?}",
        shard_sizes(&staged)
    );
    let split = gpt_with(
        tmp.path(),
        12,
        "data_parallel = 6\nmodel_parallel = 2",
        4,
        &batch,
    );
    let warned = shard_size_warnings(&split);
    assert_eq!(warned.len(), 1, "{:?}", split.warnings());
    for part in [
        "parallel.hsdp.shard_size = 4 does not divide the replicas",
        "parallel.model_parallel = 2",
        "6 replicas",
    ] {
        assert!(warned[0].contains(part), "{part}: {warned:?}");
    }
    let sizes = shard_sizes(&split);
    assert!(sizes.contains(&(12, 4)), "{sizes:?}");
    assert!(sizes.iter().all(|&(r, _)| r != 6), "{sizes:?}");
}

/// With pipeline stages, a GPT split that does not match the devices names the per-stage count
/// and the keys it comes from.
#[test]
fn gpt_split_mismatch_names_the_devices_per_stage() {
    let tmp = tempfile::tempdir().unwrap();
    let config = gpt(
        tmp.path(),
        8,
        "data_parallel = 4\nmodel_parallel = 2\n[parallel.pipeline]\nstages = 2\nmicro_batches = 2",
        -1,
    );
    let err = Session::new(&config).unwrap_err();
    match err {
        runtime::RuntimeError::Config { key, reason } => {
            assert_eq!(key, "parallel.data_parallel", "{reason}");
            assert!(
                reason.contains(
                    "4 × 1 × 2 must equal the devices per pipeline stage \
                     (parallel.devices 8 / parallel.pipeline.stages 2 = 4)"
                ),
                "{reason}"
            );
        }
        other => panic!("{other}"),
    }
    // Without stages the count is the devices' own.
    let flat = gpt(tmp.path(), 4, "data_parallel = 4\nmodel_parallel = 2", -1);
    let err = Session::new(&flat).unwrap_err().to_string();
    assert!(err.contains("must equal the 4 devices"), "{err}");
    assert!(!err.contains("pipeline"), "{err}");
}

/// The parameter-server mode's config warnings are the config's, not the process's: a second
/// config read in the same process (a second run from Python, a second session in a test)
/// reports them again.
#[test]
fn parameter_server_warnings_are_given_to_every_run() {
    let ps = [
        "parallel.mode=\"parameter_server\"",
        "ps.staleness=3",
        "parallel.hsdp.threshold=0",
    ];
    for run in 0..2 {
        let config = crate::config::parse_with(crate::config::MINIMAL, &ps).unwrap();
        let warnings = config.warnings();
        for needle in ["ps.staleness", "[parallel.hsdp]"] {
            assert!(
                warnings.iter().any(|w| w.contains(needle)),
                "run {run}: no {needle} warning: {warnings:?}"
            );
        }
    }
}
