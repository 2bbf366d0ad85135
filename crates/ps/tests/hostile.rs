//! Hostile and unlucky input: non-finite gradients and losses (a diverged run, or a bad
//! client), a pull naming a table twice, and the launcher's counts of a local job.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use ps::compute::Compute;
use ps::env::JobSettings;
use ps::proto::parameter_server_server::ParameterServer;
use ps::proto::{PullRequest, PushRequest, RowsMsg, TensorMsg};
use ps::server::ServerService;
use runtime::TrainConfig;
use tonic::Request;

use crate::util::{env_of, ps_config, ps_text, scheduler_addr};

/// Environment variables, as name and value.
type Vars = &'static [(&'static str, &'static str)];

/// A push of `tensors` by worker 0 at step 0 of a one-worker job.
fn push(tensors: Vec<TensorMsg>, sparse: Vec<RowsMsg>, loss: f32) -> PushRequest {
    PushRequest {
        worker_id: 0,
        step: 0,
        members: vec![0],
        rows: 32,
        loss,
        replay: false,
        seen_version: 0,
        tensors,
        sparse,
        learning_rate: Some(0.1),
    }
}

/// `msg` with f32 value `index` set to `value`.
fn poisoned(msg: &TensorMsg, index: usize, value: f32) -> TensorMsg {
    let mut msg = msg.clone();
    msg.data[index * 4..index * 4 + 4].copy_from_slice(&value.to_le_bytes());
    msg
}

/// `err` is an `InvalidArgument` whose message holds every one of `parts`.
fn assert_invalid_argument(err: &tonic::Status, parts: &[&str]) {
    assert_eq!(
        err.code(),
        tonic::Code::InvalidArgument,
        "{}",
        err.message()
    );
    for part in parts {
        assert!(err.message().contains(part), "{part}: {}", err.message());
    }
}

/// Server 0 of a one-server, one-worker job of `config`, holding every parameter at its
/// initial value (with `tables`, the job's embedding tables when it has any), with the model's
/// computation and those values as one push's messages (tensors of the parameters' names and
/// shapes).
fn one_server(config: &TrainConfig, tables: bool) -> (Compute, ServerService, Vec<TensorMsg>) {
    let settings = JobSettings::from_keys(config.ps().unwrap(), 1, 1, config);
    let compute = Compute::new(config).unwrap();
    let held = compute.params().to_vec();
    let initial = compute.initial_params().unwrap();
    let messages = held
        .iter()
        .zip(&initial)
        .map(|(p, t)| ps::wire::to_msg(&p.name, t))
        .collect();
    let mut service = ServerService::new(&settings, config, 0, &held, initial, false).unwrap();
    if tables {
        let env = env_of(1, 1, 1, "127.0.0.1:1");
        service = service.with_tables(ps::table::server_tables(&compute, config, 1, &env).unwrap());
    }
    (compute, service, messages)
}

/// What worker 0 pulls from `service` at version 0 (dense tensors only).
async fn pulled(service: &ServerService) -> ps::proto::PullReply {
    let request = PullRequest {
        worker_id: 0,
        min_version: 0,
        ..Default::default()
    };
    service
        .pull(Request::new(request))
        .await
        .unwrap()
        .into_inner()
}

/// A server refuses a push whose gradient holds a NaN or an infinity, or whose loss is not
/// finite, naming the step, the worker and the tensor; the weights stay as they were, and a
/// finite push is then applied.
#[test]
fn non_finite_gradients_and_losses_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(dir.path(), "servers = 1\nworkers = 1", "max_steps = 4");
    let (compute, service, good) = one_server(&config, false);
    let held = compute.params();
    let last = good.len() - 1;
    let mut with_nan = good.clone();
    with_nan[0] = poisoned(&good[0], 3, f32::NAN);
    let mut with_inf = good.clone();
    with_inf[last] = poisoned(&good[last], 0, f32::NEG_INFINITY);
    let cases = [
        (
            push(with_nan, Vec::new(), 1.0),
            format!("the gradient of {}: holds NaN at index 3", held[0].name),
        ),
        (
            push(with_inf, Vec::new(), 1.0),
            format!("the gradient of {}: holds -inf at index 0", held[last].name),
        ),
        (
            push(good.clone(), Vec::new(), f32::NAN),
            "the loss: is NaN".to_string(),
        ),
    ];
    let rt = ps::scheduler::runtime(1).unwrap();
    rt.block_on(async {
        for (request, rule) in cases {
            let err = service.push(Request::new(request)).await.unwrap_err();
            assert_invalid_argument(&err, &["push of step 0 by worker 0", &rule]);
        }
        let pulled = pulled(&service).await;
        assert_eq!(pulled.version, 0, "nothing was applied");
        for (msg, initial) in pulled.tensors.iter().zip(&good) {
            assert_eq!(msg.data, initial.data, "{}", msg.name);
        }
        // The same push with finite values is applied: the refusals were the values'.
        let reply = service
            .push(Request::new(push(good.clone(), Vec::new(), 1.0)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.version, 1);
    });
}

/// The table of the embedding bag.
const TABLE: &str = "embedding.embedding_table";

/// The embedding bag (width 16) in PS mode, one server holding the table, plain SGD.
fn bag_config(out: &Path) -> TrainConfig {
    let text = ps_text(
        out,
        &format!("servers = 1\nworkers = 1\nembedding_on_server = [\"{TABLE}\"]"),
        "optimizer = \"sgd\"\nlearning_rate = 0.05\neval = false\nmax_steps = 2",
    )
    .replace("name = \"seed_mlp\"", "name = \"embedding_bag\"")
    .replace("hidden = 128", "hidden = 16");
    TrainConfig::parse(&text, None, &[], Path::new("/")).expect("a config")
}

/// A server-resident table: a row gradient holding a NaN is refused naming the table, and a
/// pull naming the table twice (its reply would repeat the rows) is refused; nothing changes.
#[test]
fn a_non_finite_row_gradient_and_a_table_asked_twice_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = bag_config(dir.path());
    let (_, service, dense) = one_server(&config, true);
    let mut data = vec![0u8; 2 * 16 * 4];
    data[17 * 4..18 * 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
    let rows = |ids: Vec<u64>, data: Vec<u8>| RowsMsg {
        name: TABLE.to_string(),
        ids,
        width: 16,
        data,
    };
    let rt = ps::scheduler::runtime(1).unwrap();
    rt.block_on(async {
        let err = service
            .push(Request::new(push(
                dense.clone(),
                vec![rows(vec![7, 9], data)],
                1.0,
            )))
            .await
            .unwrap_err();
        assert_invalid_argument(
            &err,
            &[&format!(
                "the row gradient of table {TABLE}: holds inf at index 17"
            )],
        );
        let twice = PullRequest {
            worker_id: 0,
            min_version: 0,
            sparse: vec![rows(vec![1, 2], Vec::new()), rows(vec![3], Vec::new())],
            ..Default::default()
        };
        let err = service.pull(Request::new(twice)).await.unwrap_err();
        assert_invalid_argument(
            &err,
            &[&format!("table {TABLE}: asked for twice in one pull")],
        );
        let once = PullRequest {
            worker_id: 0,
            min_version: 0,
            sparse: vec![rows(vec![1, 2, 3], Vec::new())],
            ..Default::default()
        };
        let reply = service.pull(Request::new(once)).await.unwrap().into_inner();
        assert_eq!(reply.version, 0, "the refused push changed nothing");
        assert_eq!(reply.sparse.len(), 1);
        assert_eq!(reply.sparse[0].ids, vec![1, 2, 3]);
    });
}

/// A run that diverges (a learning rate of 1e30 makes the second step's loss NaN) stops every
/// worker with an error naming the worker, the step and the invalid loss, before it pushes
/// anything non-finite; the scheduler then fails the job (every worker died) and no role
/// hangs.
#[test]
fn a_diverging_run_stops_its_workers_naming_the_step_and_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(
        dir.path(),
        "servers = 1\nworkers = 2\nheartbeat_ms = 50\ndead_after_ms = 300\nrpc_timeout_ms = 500\nrpc_retries = 1",
        "max_steps = 10\noptimizer = \"sgd\"\nlearning_rate = 1e30\neval = false",
    );
    let addr = scheduler_addr();
    let (tx, rx) = mpsc::channel();
    for rank in 0..4 {
        let config = config.clone();
        let env = env_of(rank, 1, 2, &addr);
        let tx = tx.clone();
        std::thread::spawn(move || {
            let outcome = ps::run_role(&config, &env, None).map(|_| ());
            let _ = tx.send((rank, outcome.map_err(|e| e.to_string())));
        });
    }
    let mut outcomes = std::collections::BTreeMap::new();
    for _ in 0..4 {
        let (rank, outcome) = rx
            .recv_timeout(Duration::from_secs(12))
            .expect("every role ends (none hangs)");
        outcomes.insert(rank, outcome);
    }
    for (rank, worker) in [(2, 0), (3, 1)] {
        let err = outcomes[&rank].clone().unwrap_err();
        assert!(
            err.starts_with(&format!("worker {worker}: step "))
                && err.contains("invalid loss")
                && err.contains("training stops"),
            "worker {worker}: {err}"
        );
    }
    let scheduler = outcomes[&0].clone().unwrap_err();
    assert!(scheduler.contains("every worker died"), "{scheduler}");
}

/// `tessera train` without a role takes its counts from `[ps]`, else from the launcher's
/// `TESSERA_NUM_SERVERS` / `TESSERA_NUM_WORKERS` (as docs/PS.md says), refuses one that is not
/// a number, out of range or disagrees with `[ps]`, and more workers than the batch has rows,
/// before starting any process.
#[test]
fn a_local_job_takes_its_counts_from_the_config_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let bare = ps_config(dir.path(), "", "max_steps = 2");
    let given = ps_config(dir.path(), "servers = 2\nworkers = 2", "max_steps = 2");
    let vars = |pairs: Vars| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let counts = ps::env::local_job_counts;
    assert_eq!(counts(&bare, vars(&[])).unwrap(), (1, 2));
    assert_eq!(
        counts(
            &bare,
            vars(&[("TESSERA_NUM_SERVERS", "3"), ("TESSERA_NUM_WORKERS", "4")])
        )
        .unwrap(),
        (3, 4)
    );
    assert_eq!(
        counts(&given, vars(&[("TESSERA_NUM_SERVERS", "2")])).unwrap(),
        (2, 2)
    );
    let refused: [(&TrainConfig, Vars, &str); 4] = [
        (
            &bare,
            &[("TESSERA_NUM_SERVERS", "abc")],
            "environment TESSERA_NUM_SERVERS: \"abc\" is not a non-negative integer",
        ),
        (
            &bare,
            &[("TESSERA_NUM_WORKERS", "0")],
            "environment TESSERA_NUM_WORKERS: 0 is out of range",
        ),
        (
            &given,
            &[("TESSERA_NUM_SERVERS", "3")],
            "config ps.servers: 2 disagrees with TESSERA_NUM_SERVERS=3",
        ),
        (
            &bare,
            &[("TESSERA_NUM_WORKERS", "40")],
            "config ps.workers: 40 workers for a global batch of 32 rows",
        ),
    ];
    for (config, env, rule) in refused {
        let err = counts(config, vars(env)).unwrap_err().to_string();
        assert!(err.contains(rule), "{rule}: {err}");
    }
}

/// The rows a push says its gradient was computed on weigh it in the step's mean: none, or
/// more than the global batch (`u64::MAX` would overflow their sum), are refused naming the
/// rule, and nothing is applied.
#[test]
fn a_push_with_rows_outside_the_batch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(dir.path(), "servers = 1\nworkers = 1", "max_steps = 4");
    let (_, service, good) = one_server(&config, false);
    let rt = ps::scheduler::runtime(1).unwrap();
    rt.block_on(async {
        for rows in [0, 33, u64::MAX] {
            let request = PushRequest {
                rows,
                ..push(good.clone(), Vec::new(), 1.0)
            };
            let err = service.push(Request::new(request)).await.unwrap_err();
            assert_invalid_argument(
                &err,
                &[&format!(
                    "rows: {rows} rows, expected 1 to 32 (data.batch_size"
                )],
            );
        }
        assert_eq!(pulled(&service).await.version, 0, "nothing was applied");
    });
}

/// A handover's map size sizes the partition the receiver computes: a map of no servers, of
/// one, of fewer than the receiver's id or of more than a job may have is refused before
/// anything is allocated from it, naming the count.
#[test]
fn a_handover_with_a_map_size_out_of_range_is_refused() {
    use ps::proto::HandoverRequest;

    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(dir.path(), "servers = 2\nworkers = 1", "max_steps = 4");
    let settings = JobSettings::from_keys(config.ps().unwrap(), 2, 1, &config);
    let compute = Compute::new(&config).unwrap();
    let all = compute.params().to_vec();
    let initial = compute.initial_params().unwrap();
    // Server 2, being added to a job of 2: it holds nothing until the handover.
    let service = ServerService::new(&settings, &config, 2, &[], Vec::new(), false).unwrap();
    service.enable_migration(all.clone(), None);
    let rt = ps::scheduler::runtime(1).unwrap();
    rt.block_on(async {
        for servers in [0, 1, 2, 1025, u32::MAX] {
            let request = HandoverRequest {
                from_server: 0,
                epoch: 1,
                servers,
                version: 0,
                optimizer_steps: 0,
                last_loss: 0.0,
                weights: vec![ps::wire::to_msg(&all[0].name, &initial[0])],
                states: Vec::new(),
            };
            let err = service.handover(Request::new(request)).await.unwrap_err();
            assert_invalid_argument(
                &err,
                &[&format!("a map of {servers} servers, expected 2 to 1024")],
            );
        }
    });
}

/// The scheduler begins steps in order: a `BeginStep` past the next step (`u64::MAX` would
/// make the next registration's first step wrap to 0) is refused naming the step and the
/// worker, and a worker registering afterwards starts at the real next step.
#[test]
fn a_step_begun_out_of_order_is_refused_by_the_scheduler() {
    use ps::proto::scheduler_server::Scheduler;
    use ps::proto::{BeginStepRequest, RegisterWorkerRequest, StepStatus};
    use ps::scheduler::SchedulerService;

    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(dir.path(), "servers = 1\nworkers = 1", "max_steps = 4");
    let settings = JobSettings::from_keys(config.ps().unwrap(), 1, 1, &config);
    let scheduler = SchedulerService::new(&settings, 32);
    let register = |worker_id: u32| RegisterWorkerRequest {
        worker_id,
        restart_count: 0,
        incarnation: 100 + u64::from(worker_id),
    };
    let begin = |step: u64| BeginStepRequest { worker_id: 0, step };
    let rt = ps::scheduler::runtime(1).unwrap();
    rt.block_on(async {
        scheduler
            .register_worker(Request::new(register(0)))
            .await
            .unwrap();
        let go = scheduler
            .begin_step(Request::new(begin(0)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(go.status, StepStatus::Go as i32);
        for step in [2, u64::MAX] {
            let err = scheduler
                .begin_step(Request::new(begin(step)))
                .await
                .unwrap_err();
            assert_invalid_argument(
                &err,
                &[&format!(
                    "BeginStep of step {step} by worker 0: the job's next step is 1"
                )],
            );
        }
        let joined = scheduler
            .register_worker(Request::new(register(1)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(joined.start_step, 1);
    });
}

/// More servers than the model has blocks (whole parameters, plus row blocks of
/// server-resident tables) are refused naming the setting, the model's blocks and the rule: by
/// `tessera train` before any process starts (`ps.servers` or `TESSERA_NUM_SERVERS`), and by a
/// server started on its own, before it contacts the scheduler. As many servers as blocks, and
/// more servers than parameters when a table gives each of them rows, are accepted.
#[test]
fn more_servers_than_the_model_has_blocks_are_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let bare = ps_config(
        dir.path(),
        "rpc_timeout_ms = 200\nrpc_retries = 1",
        "max_steps = 2",
    );
    let params = Compute::new(&bare).unwrap().params().len();
    let blocks = format!("the model has only {params} block(s)");
    let vars = |servers: usize| {
        move |name: &str| (name == "TESSERA_NUM_SERVERS").then(|| servers.to_string())
    };
    let counts = ps::env::local_job_counts;
    assert_eq!(counts(&bare, vars(params)).unwrap(), (params, 2));
    let err = counts(&bare, vars(params + 1)).unwrap_err().to_string();
    let rule = format!(
        "environment TESSERA_NUM_SERVERS: {} servers, but {blocks}",
        params + 1
    );
    assert!(err.contains(&rule), "{err}");
    assert!(err.contains("each held whole by one server"), "{err}");
    assert!(err.contains(&format!("server {params}")), "{err}");
    let many = ps_config(dir.path(), "servers = 1024", "max_steps = 2");
    let err = ps::env::local_job_counts(&many, vars_none)
        .unwrap_err()
        .to_string();
    let rule = format!("config ps.servers: 1024 servers, but {blocks}");
    assert!(err.contains(&rule), "{err}");
    assert!(
        err.contains(&format!("{} server(s) would hold nothing", 1024 - params)),
        "{err}"
    );
    // A server of such a job, under a launcher that did not check, refuses to start.
    let env = env_of(1, params + 1, 2, "127.0.0.1:1");
    let start = std::time::Instant::now();
    let err = ps::run_role(&bare, &env, None).unwrap_err().to_string();
    assert!(
        err.contains(&format!("{} servers, but {blocks}", params + 1)),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
    // The embedding bag's table gives every one of more servers than parameters its rows.
    let bag = bag_config(dir.path());
    let compute = Compute::new(&bag).unwrap();
    let servers = compute.params().len() + 2;
    assert!(compute.tables()[0].rows >= servers);
    let idle = ps::server::idle_servers(compute.params(), compute.tables(), servers);
    assert_eq!(idle, Vec::<usize>::new());
    assert_eq!(
        ps::server::idle_servers(compute.params(), &[], servers),
        (compute.params().len()..servers).collect::<Vec<_>>()
    );
}

/// No environment variable is set.
fn vars_none(_: &str) -> Option<String> {
    None
}

/// The scheduler bounds worker ids: a registration beyond the global batch's rows (the most
/// workers a step can have) and a `WorkerDone` of a worker that never registered are refused
/// as invalid arguments naming the worker and the rule, and the latter does not end the job.
#[test]
fn the_scheduler_refuses_worker_ids_outside_the_job() {
    use ps::proto::scheduler_server::Scheduler;
    use ps::proto::{JobStatusRequest, RegisterWorkerRequest, WorkerDoneRequest};
    use ps::scheduler::SchedulerService;

    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(dir.path(), "servers = 1\nworkers = 2", "max_steps = 4");
    let settings = JobSettings::from_keys(config.ps().unwrap(), 1, 2, &config);
    let batch = config.data().batch_size;
    let scheduler = SchedulerService::new(&settings, batch);
    let register = |worker_id: u32| RegisterWorkerRequest {
        worker_id,
        restart_count: 0,
        incarnation: 100 + u64::from(worker_id),
    };
    let rt = ps::scheduler::runtime(1).unwrap();
    rt.block_on(async {
        for id in [batch as u32, u32::MAX] {
            let err = scheduler
                .register_worker(Request::new(register(id)))
                .await
                .unwrap_err();
            assert_invalid_argument(
                &err,
                &[&format!(
                    "RegisterWorker by worker {id}: worker ids are 0..{batch}"
                )],
            );
        }
        for id in [1, u32::MAX] {
            let err = scheduler
                .worker_done(Request::new(WorkerDoneRequest { worker_id: id }))
                .await
                .unwrap_err();
            assert_invalid_argument(
                &err,
                &[&format!(
                    "WorkerDone by worker {id}: no worker {id} has registered"
                )],
            );
        }
        let status = scheduler
            .job_status(Request::new(JobStatusRequest { wait_ms: 0 }))
            .await
            .unwrap()
            .into_inner();
        assert!(!status.all_workers_done, "{status:?}");
        // A worker joining mid-run (an id past ps.workers, within the batch) is still admitted
        // and may end.
        let last = batch as u32 - 1;
        scheduler
            .register_worker(Request::new(register(last)))
            .await
            .unwrap();
        scheduler
            .worker_done(Request::new(WorkerDoneRequest { worker_id: last }))
            .await
            .unwrap();
    });
}

/// A server added (`TESSERA_SERVER_JOIN=1`) to a job whose servers already hold one block each
/// is refused naming `TESSERA_SERVER_JOIN` and the model's blocks, rather than joining a map in
/// which it (or another server) would hold nothing.
#[test]
fn a_server_added_beyond_the_model_s_blocks_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let probe = ps_config(dir.path(), "", "max_steps = 2");
    let params = Compute::new(&probe).unwrap().params().len();
    let config = ps_config(
        dir.path(),
        &format!("servers = {params}\nworkers = 2\nrpc_timeout_ms = 500\nrpc_retries = 2"),
        "max_steps = 2",
    );
    let addr = scheduler_addr();
    let scheduler_env = env_of(0, params, 2, &addr);
    let scheduler_config = config.clone();
    // The scheduler runs until the test process ends (no worker ever registers).
    std::thread::spawn(move || ps::run_role(&scheduler_config, &scheduler_env, None));
    let mut vars = crate::util::role_env(1, params, 2, &addr);
    for (k, v) in vars.iter_mut() {
        if k == "TESSERA_SERVER_ID" {
            *v = params.to_string();
        }
    }
    vars.push(("TESSERA_SERVER_JOIN".to_string(), "1".to_string()));
    let env = ps::RoleEnv::from_lookup(|name| {
        vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    })
    .unwrap()
    .unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(ps::run_role(&config, &env, None).map(|_| ()));
    });
    let err = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the added server ends (it used to wait for a handover of nothing)")
        .unwrap_err()
        .to_string();
    let rule = format!(
        "environment TESSERA_SERVER_JOIN: server {params} cannot be added to a job of {params} server(s): the new map would have {} servers, but the model has only {params} block(s)",
        params + 1
    );
    assert!(err.contains(&rule), "{err}");
}
