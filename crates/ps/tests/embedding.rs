//! Server-resident embedding tables (`ps.embedding_on_server`, MindSpore's
//! `EmbeddingLookup(target="CPU")`): the sparse run equals the dense one step for step, a
//! worker holds only its batch's rows (under a limit smaller than the table), and bad rows are
//! refused naming the table and the id.

use std::path::Path;

use ps::compute::Compute;
use ps::env::JobSettings;
use ps::proto::parameter_server_server::ParameterServer;
use ps::proto::{PullRequest, PushRequest, RowsMsg};
use ps::server::ServerService;
use runtime::TrainConfig;
use tonic::Request;

use crate::util::{env_of, ps_text, run_in_process};

/// The table's name.
const TABLE: &str = "embedding.embedding_table";

/// Embedding size of the tests' bag.
const WIDTH: usize = 16;

/// Below the table's bytes (17408 rows × 16 × 4 = 1 114 112), above a worker's batch rows.
const LIMIT: u64 = 400_000;

/// The embedding bag (width 16) on the digits in PS mode, plain SGD, `[ps]` body `ps`.
fn bag_text(out: &Path, ps: &str, train: &str) -> String {
    ps_text(
        out,
        ps,
        &format!("optimizer = \"sgd\"\nlearning_rate = 0.05\neval = false\n{train}"),
    )
    .replace("name = \"seed_mlp\"", "name = \"embedding_bag\"")
    .replace("hidden = 128", &format!("hidden = {WIDTH}"))
}

fn bag_config(out: &Path, ps: &str, train: &str) -> TrainConfig {
    TrainConfig::parse(&bag_text(out, ps, train), None, &[], Path::new("/")).expect("a config")
}

#[test]
fn a_server_resident_table_trains_as_the_dense_table_step_for_step() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 10;
    let train = format!("max_steps = {steps}");
    let ps = "servers = 2\nworkers = 2";
    let dense = run_in_process(&bag_config(&dir.path().join("dense"), ps, &train), 2, 2);
    let sparse_ps =
        format!("{ps}\nembedding_on_server = [\"{TABLE}\"]\nworker_max_param_bytes = {LIMIT}");
    let config = bag_config(&dir.path().join("sparse"), &sparse_ps, &train);
    let sparse = run_in_process(&config, 2, 2);
    assert_eq!(dense.losses.len(), steps as usize);
    assert_same_losses(&sparse, &dense);
    // The losses move: a run that did not train would not match by accident.
    assert!(
        dense.losses[0] - dense.losses[steps as usize - 1] > 0.1,
        "{:?}",
        dense.losses
    );

    // Worker 0 held its batches' rows of the table, never the table: its largest table buffer
    // is exactly the most distinct rows one of its batches looks up.
    let compute = Compute::new(&config).unwrap();
    let table = &compute.tables()[0];
    assert_eq!(table.bytes(), 17408 * WIDTH * 4);
    assert!(table.bytes() as u64 > LIMIT);
    let most_rows = (0..steps)
        .map(|step| {
            let rows = compute.rows(step, 0, 16).unwrap();
            compute.table_ids(&rows).unwrap().len()
        })
        .max()
        .unwrap();
    assert_eq!(sparse.largest_table_bytes, (most_rows * WIDTH * 4) as u64);
    assert!(sparse.largest_table_bytes <= LIMIT);
    assert!(most_rows < table.rows / 4, "{most_rows} rows");
    assert_eq!(dense.largest_table_bytes, 0);
    // Fewer bytes cross the wire than with the dense table, both ways.
    assert!(
        sparse.pull_bytes * 4 < dense.pull_bytes,
        "{sparse:?} {dense:?}"
    );
    assert!(
        sparse.push_bytes * 4 < dense.push_bytes,
        "{sparse:?} {dense:?}"
    );
    let rate = |r: &ps::WorkerReport| r.steps_run as f64 / r.step_seconds.max(1e-9);
    eprintln!(
        "per step, worker 0: dense pull {} B push {} B ({:.1} steps/s); sparse pull {} B push {} B ({:.1} steps/s), largest table buffer {} B",
        dense.pull_bytes / steps,
        dense.push_bytes / steps,
        rate(&dense),
        sparse.pull_bytes / steps,
        sparse.push_bytes / steps,
        rate(&sparse),
        sparse.largest_table_bytes
    );
}

#[test]
fn a_worker_refuses_to_hold_a_table_above_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let config = bag_config(
        dir.path(),
        &format!("worker_max_param_bytes = {LIMIT}"),
        "max_steps = 2",
    );
    let compute = Compute::new(&config).unwrap();
    let err = ps::embedding::worker_limit(&config, &compute)
        .unwrap_err()
        .to_string();
    assert!(err.contains("ps.worker_max_param_bytes"), "{err}");
    assert!(
        err.contains(&format!("parameter {TABLE} of 1114112 bytes")),
        "{err}"
    );
    // Server-resident, the table is no worker's parameter.
    let config = bag_config(
        dir.path(),
        &format!("embedding_on_server = [\"{TABLE}\"]\nworker_max_param_bytes = {LIMIT}"),
        "max_steps = 2",
    );
    let compute = Compute::new(&config).unwrap();
    assert_eq!(
        ps::embedding::worker_limit(&config, &compute).unwrap(),
        Some(LIMIT)
    );
}

#[test]
fn bad_keys_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = bag_config(
        dir.path(),
        "embedding_on_server = [\"head.weight\"]",
        "max_steps = 2",
    );
    let err = Compute::new(&config).err().unwrap().to_string();
    assert!(err.contains("ps.embedding_on_server"), "{err}");
    assert!(err.contains("\"head.weight\""), "{err}");
    let parse = |ps: &str, train: &str| {
        TrainConfig::parse(&bag_text(dir.path(), ps, train), None, &[], Path::new("/"))
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let err = parse("embedding_on_server = \"x\"", "");
    assert!(err.contains("ps.embedding_on_server"), "{err}");
    let err = parse("embedding_on_server = [\"a\", \"a\"]", "");
    assert!(err.contains("twice"), "{err}");
    let err = parse("worker_max_param_bytes = 0", "");
    assert!(err.contains("ps.worker_max_param_bytes"), "{err}");
    let config = TrainConfig::parse(
        &bag_text(
            dir.path(),
            &format!("embedding_on_server = [\"{TABLE}\"]"),
            "",
        )
        .replace("eval = false", "eval = true"),
        None,
        &[],
        Path::new("/"),
    )
    .unwrap();
    let err = Compute::new(&config).err().unwrap().to_string();
    assert!(err.contains("train.eval"), "{err}");
}

#[test]
fn bad_rows_are_refused_naming_the_table_and_the_id() {
    let dir = tempfile::tempdir().unwrap();
    let config = bag_config(
        dir.path(),
        &format!("servers = 2\nworkers = 2\nembedding_on_server = [\"{TABLE}\"]"),
        "max_steps = 2",
    );
    let settings = JobSettings::from_keys(config.ps().unwrap(), 2, 2, &config);
    let compute = Compute::new(&config).unwrap();
    let held = compute.params().to_vec();
    let initial = compute.initial_params().unwrap();
    // Server 1 (rank 2): rows 8704..17408.
    let env = env_of(2, 2, 2, "127.0.0.1:1");
    assert_eq!(env.server_id, 1);
    let tables = ps::table::server_tables(&compute, &config, 2, &env).unwrap();
    let whole = compute.initial_tables().unwrap().remove(0);
    let service = ServerService::new(&settings, &config, 1, &held, initial.clone(), false)
        .unwrap()
        .with_tables(tables);
    let rows = |ids: Vec<u64>, width: u64, data: Vec<u8>| RowsMsg {
        name: TABLE.to_string(),
        ids,
        width,
        data,
    };
    let pull = |sparse: Vec<RowsMsg>| PullRequest {
        worker_id: 0,
        min_version: 0,
        sparse,
        ..Default::default()
    };
    let push = |sparse: Vec<RowsMsg>| PushRequest {
        worker_id: 0,
        step: 0,
        members: vec![0, 1],
        rows: 16,
        loss: 1.0,
        replay: false,
        seen_version: 0,
        tensors: held
            .iter()
            .zip(&initial)
            .map(|(p, t)| ps::wire::to_msg(&p.name, t))
            .collect(),
        sparse,
        learning_rate: Some(0.1),
    };
    let rt = ps::scheduler::runtime(1).unwrap();
    rt.block_on(async {
        let bad_pulls = [
            (
                pull(vec![rows(vec![17408], 0, vec![])]),
                "table embedding.embedding_table: row id 17408 is out of range",
            ),
            (
                pull(vec![rows(vec![5], 0, vec![])]),
                "table embedding.embedding_table: row id 5 is not held here",
            ),
            (
                pull(vec![RowsMsg {
                    name: "other".to_string(),
                    ..rows(vec![9000], 0, vec![])
                }]),
                "no server-resident table \"other\"",
            ),
        ];
        for (request, rule) in bad_pulls {
            let err = service.pull(Request::new(request)).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().contains(rule), "{rule}: {}", err.message());
        }
        let bad_pushes = [
            (
                push(vec![rows(vec![9000], 3, vec![0; 12])]),
                "table embedding.embedding_table: rows of width 3, expected 16",
            ),
            (
                push(vec![rows(vec![9000, 9001], 16, vec![0; 64])]),
                "64 bytes for 2 rows, expected 128",
            ),
            (
                push(vec![rows(vec![20_000], 16, vec![0; 64])]),
                "row id 20000 is out of range",
            ),
            (
                push(vec![rows(vec![9000, 9000], 16, vec![0; 128])]),
                "row id 9000 appears twice",
            ),
        ];
        for (request, rule) in bad_pushes {
            let err = service.push(Request::new(request)).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().contains(rule), "{rule}: {}", err.message());
        }
        // Nothing was applied; the rows asked for are the initial table's.
        let reply = service
            .pull(Request::new(pull(vec![rows(vec![9000, 17407], 0, vec![])])))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.version, 0);
        let got =
            ps::sparse::from_rows_msg(&reply.sparse[0], &compute.tables()[0], &(0..17408)).unwrap();
        let all = whole.as_f32().unwrap();
        let mut want = all[9000 * WIDTH..9001 * WIDTH].to_vec();
        want.extend_from_slice(&all[17407 * WIDTH..17408 * WIDTH]);
        assert_eq!(got.values, want);
    });
}

#[test]
fn the_example_config_parses_with_the_table_on_the_servers() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/embedding_parameter_server.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let config = TrainConfig::parse(&text, None, &[], Path::new("/")).unwrap();
    let keys = config.ps().unwrap();
    assert_eq!(keys.embedding_on_server, vec![TABLE.to_string()]);
    assert_eq!(keys.worker_max_param_bytes, Some(LIMIT));
}

/// Sync clipping counts the server-resident table's rows in the global norm: clipped, the
/// run with the table on the servers is the run with the dense table, step for step.
#[test]
fn clipping_counts_the_server_resident_rows_in_the_global_norm() {
    let dir = tempfile::tempdir().unwrap();
    let train = "max_steps = 6\nmax_grad_norm = 0.02";
    let ps = "servers = 2\nworkers = 2";
    let dense = run_in_process(&bag_config(&dir.path().join("dense"), ps, train), 2, 2);
    let plain = run_in_process(
        &bag_config(&dir.path().join("plain"), ps, "max_steps = 6"),
        2,
        2,
    );
    assert!(
        dense
            .losses
            .iter()
            .zip(&plain.losses)
            .any(|(a, b)| (a - b).abs() > 1e-4),
        "the clip changes the run: {:?} vs {:?}",
        dense.losses,
        plain.losses
    );
    let sparse_ps =
        format!("{ps}\nembedding_on_server = [\"{TABLE}\"]\nworker_max_param_bytes = {LIMIT}");
    let sparse = run_in_process(
        &bag_config(&dir.path().join("sparse"), &sparse_ps, train),
        2,
        2,
    );
    assert_same_losses(&sparse, &dense);
}

/// The run with the table on the servers has the dense run's losses, step for step (1e-5).
fn assert_same_losses(sparse: &ps::WorkerReport, dense: &ps::WorkerReport) {
    assert_eq!(sparse.losses.len(), dense.losses.len());
    for (i, (s, d)) in sparse.losses.iter().zip(&dense.losses).enumerate() {
        assert!(
            (s - d).abs() <= 1e-5,
            "step {}: sparse loss {s} vs dense {d}",
            i + 1
        );
    }
}
