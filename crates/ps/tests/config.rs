//! `parallel.mode = "parameter_server"`, `[ps]`, and the environment: errors name the key or
//! variable and the rule.

use std::path::Path;

use ps::env::JobSettings;
use ps::RoleEnv;
use runtime::TrainConfig;

use crate::util::{digits, ps_text};

fn parse(text: &str) -> Result<TrainConfig, String> {
    TrainConfig::parse(text, None, &[], Path::new("/")).map_err(|e| e.to_string())
}

fn with_ps(ps: &str) -> Result<TrainConfig, String> {
    parse(&ps_text(Path::new("/tmp/out"), ps, "max_steps = 4"))
}

#[test]
fn defaults_and_given_keys() {
    let config = with_ps("").unwrap();
    let keys = config.ps().unwrap();
    assert_eq!((keys.servers, keys.workers, keys.sync), (None, None, true));
    let config =
        with_ps("servers = 2\nworkers = 3\nsync = false\nstaleness = 4\ncheckpoint_every = 7")
            .unwrap();
    let keys = config.ps().unwrap();
    assert_eq!(
        (
            keys.servers,
            keys.workers,
            keys.sync,
            keys.staleness,
            keys.checkpoint_every
        ),
        (Some(2), Some(3), false, 4, 7)
    );
    assert!(config.warnings().is_empty());
    let sync_staleness = with_ps("staleness = 3").unwrap();
    assert!(sync_staleness.warnings()[0].contains("ps.staleness has no effect"));
}

#[test]
fn bad_values_name_the_key() {
    let cases = [
        ("servers = 0", "ps.servers"),
        ("workers = 5000", "ps.workers"),
        ("sync = \"yes\"", "ps.sync"),
        ("checkpoint_every = 0", "ps.checkpoint_every"),
        ("staleness = -1", "ps.staleness"),
        (
            "heartbeat_ms = 100\ndead_after_ms = 100",
            "ps.dead_after_ms",
        ),
        ("rpc_retries = 1000", "ps.rpc_retries"),
        ("replicas = 2", "ps.replicas"),
    ];
    for (ps, key) in cases {
        let err = with_ps(ps).unwrap_err();
        assert!(err.contains(key), "[ps] {ps}: {err}");
    }
}

#[test]
fn ps_section_needs_the_mode_and_the_mode_refuses_devices() {
    let text = ps_text(Path::new("/tmp/out"), "workers = 2", "max_steps = 4").replace(
        "mode = \"parameter_server\"",
        "mode = \"data_parallel\"\ndevices = 2",
    );
    let err = parse(&text).unwrap_err();
    assert!(
        err.contains("config ps:") && err.contains("parameter_server"),
        "{err}"
    );
    let text = ps_text(Path::new("/tmp/out"), "", "max_steps = 4").replace(
        "mode = \"parameter_server\"",
        "mode = \"parameter_server\"\ndevices = 4",
    );
    let err = parse(&text).unwrap_err();
    assert!(err.contains("parallel.devices"), "{err}");
    let text = ps_text(
        Path::new("/tmp/out"),
        "",
        "max_steps = 4\ngrad_accumulation_steps = 2",
    );
    let err = parse(&text).unwrap_err();
    assert!(err.contains("train.grad_accumulation_steps"), "{err}");
    // The servers add gradients in arrival order: no bitwise promise to make.
    let text = ps_text(
        Path::new("/tmp/out"),
        "",
        "max_steps = 4\ndeterministic = true",
    );
    let err = parse(&text).unwrap_err();
    assert!(
        err.contains("train.deterministic") && err.contains("parameter_server"),
        "{err}"
    );
    assert!(digits().exists());
}

/// The collective launcher (`runtime::train_local`, what Python's `tessera.train` calls) refuses
/// a parameter-server config instead of training it as one stand-alone device.
#[test]
fn the_collective_launcher_refuses_a_parameter_server_config() {
    let config = with_ps("").unwrap();
    let session = runtime::Session::new(&config).unwrap();
    let err = runtime::train_local(&session, &runtime::LaunchOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("parallel.mode") && err.contains("parameter_server"),
        "{err}"
    );
}

/// The contract of `vars`, with a valid job secret unless `vars` sets one.
fn env(vars: &[(&str, &str)]) -> Result<Option<RoleEnv>, String> {
    RoleEnv::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
            .or_else(|| (name == "TESSERA_JOB_SECRET").then(|| "x".repeat(32)))
    })
    .map_err(|e| e.to_string())
}

#[test]
fn environment_errors_name_the_variable() {
    assert_eq!(
        env(&[]).unwrap(),
        None,
        "no TESSERA_ROLE: not a role process"
    );
    let addr = ("TESSERA_SCHEDULER_ADDR", "127.0.0.1:1");
    let err = env(&[("TESSERA_ROLE", "boss"), addr]).unwrap_err();
    assert!(
        err.contains("TESSERA_ROLE") && err.contains("boss"),
        "{err}"
    );
    let err = env(&[("TESSERA_ROLE", "worker"), addr]).unwrap_err();
    assert!(err.contains("TESSERA_WORKER_ID"), "{err}");
    let err = env(&[("TESSERA_ROLE", "server"), ("TESSERA_SERVER_ID", "x"), addr]).unwrap_err();
    assert!(err.contains("TESSERA_SERVER_ID"), "{err}");
    let err = env(&[("TESSERA_ROLE", "scheduler")]).unwrap_err();
    assert!(err.contains("TESSERA_SCHEDULER_ADDR"), "{err}");
}

#[test]
fn counts_of_config_and_environment_must_agree() {
    let config = with_ps("workers = 2\nservers = 1").unwrap();
    let role = |workers: &str| {
        env(&[
            ("TESSERA_ROLE", "scheduler"),
            ("TESSERA_SCHEDULER_ADDR", "127.0.0.1:1"),
            ("TESSERA_NUM_WORKERS", workers),
            ("TESSERA_NUM_SERVERS", "1"),
        ])
        .unwrap()
        .unwrap()
    };
    let settings = JobSettings::new(&config, &role("2")).unwrap();
    assert_eq!((settings.workers, settings.servers), (2, 1));
    let err = JobSettings::new(&config, &role("3"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ps.workers") && err.contains("TESSERA_NUM_WORKERS=3"),
        "{err}"
    );
    // More workers than the global batch has rows: some would never train.
    let small = parse(
        &ps_text(Path::new("/tmp/out"), "", "max_steps = 4")
            .replace("batch_size = 32", "batch_size = 2"),
    )
    .unwrap();
    let err = JobSettings::new(&small, &role("3"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ps.workers") && err.contains("3 workers for a global batch of 2 rows"),
        "{err}"
    );
    assert!(JobSettings::new(&small, &role("2")).is_ok());
    let server = env(&[
        ("TESSERA_ROLE", "server"),
        ("TESSERA_SERVER_ID", "1"),
        ("TESSERA_SCHEDULER_ADDR", "127.0.0.1:1"),
    ])
    .unwrap()
    .unwrap();
    let err = JobSettings::new(&config, &server).unwrap_err().to_string();
    assert!(err.contains("TESSERA_SERVER_ID"), "{err}");
    // A worker's id names one of the batch's blocks: checked before the worker builds anything
    // (ids past `ps.workers` are joining workers, so the bound is the batch).
    let worker = |id: &str| {
        env(&[
            ("TESSERA_ROLE", "worker"),
            ("TESSERA_WORKER_ID", id),
            ("TESSERA_SCHEDULER_ADDR", "127.0.0.1:1"),
        ])
        .unwrap()
        .unwrap()
    };
    assert!(JobSettings::new(&small, &worker("1")).is_ok());
    let err = JobSettings::new(&small, &worker("2"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("TESSERA_WORKER_ID") && err.contains("data.batch_size"),
        "{err}"
    );
    let not_ps = parse(
        &ps_text(Path::new("/tmp/out"), "", "max_steps = 4")
            .replace("mode = \"parameter_server\"", "mode = \"stand_alone\"")
            .replace("[ps]\n", ""),
    )
    .unwrap();
    let err = JobSettings::new(&not_ps, &role("2"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("parallel.mode"), "{err}");
}
