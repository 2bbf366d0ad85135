//! A seeded random sweep of parameter-server jobs against the promises of docs/PS.md.
//!
//! Each case draws a job from the space the config allows and checks the property the doc
//! promises for it:
//!
//! - **sync** (the seed MLP or the GPT; 1–3 servers, 1–4 workers, every optimizer, learning-rate
//!   schedules, weight decay with its filter, clipping, snapshot intervals): worker 0's losses
//!   equal all-reduce data parallel's on as many ranks, step for step, within the doc's 1e-5;
//! - **async** with one worker: each update is that worker's gradient, so the run is one
//!   device's (1e-5);
//! - **server-resident tables** (the embedding bag, plain SGD): the run with the table on the
//!   servers equals the run with the dense table on the workers (1e-5);
//! - **refused**: a valid case with one setting the mode does not run (gradient accumulation,
//!   deterministic mode, devices, more workers than rows, more servers than blocks, a heartbeat
//!   outliving the death timeout, the GPT's evaluation or experts, a resume, periodic
//!   checkpoints, local norms, the elastic store) must be refused with an error naming a
//!   `ps.`/`parallel.`/`train.`/`model.`/`data.`/`output.` key;
//! - **hostile peers**: while a sync job runs, raw TCP peers send the scheduler and the servers
//!   truncated, oversized and wrong-version HTTP/2 frames or stall half-way through the
//!   preface, and a peer holding the job's secret sends truncated, oversized, stale-epoch and
//!   far-future pushes; every one is refused, and the job's losses are still data parallel's;
//! - **faults** (processes, `TESSERA_PS_SWEEP_FAULTS=1`): a worker SIGKILLed at a
//!   random step (the job finishes on the others, naming the lost worker), or a server
//!   SIGKILLed and restarted with `TESSERA_RESTART_COUNT=1` (it resumes from its snapshot, the
//!   workers replay, and the losses are an uninterrupted run's).
//!
//! Every case runs under a deadline: a hang, a panic, or an error naming no key fails it.
//!
//! `TESSERA_PS_SWEEP_CASES` (default [`DEFAULT_CASES`]), `TESSERA_PS_SWEEP_SEED` (default
//! [`DEFAULT_SEED`]) and `TESSERA_PS_SWEEP_ONLY=3,17` (only those case indices; each case has
//! its own generator, so one reproduces alone) set a longer run; `TESSERA_PS_SWEEP_FAULTS=1`
//! lets cases draw process faults. A failure prints the seed, the case and its config.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ps::proto::{PullRequest, PushRequest, TensorMsg};
use ps::{PsError, WorkerReport};
use runtime::{LaunchOptions, Session, TrainConfig};
use sweep::Rng;

use crate::util::{digits, loss_lines, scheduler_addr, secret_of, sigkill, RoleProcess};

/// The default seed.
const DEFAULT_SEED: u64 = 20_261_207;
/// The default number of cases (well under a minute in a debug build on 2 cores).
const DEFAULT_CASES: usize = 30;
/// How long one in-process case may take before it counts as a hang.
const CASE_DEADLINE: Duration = Duration::from_secs(120);
/// The tolerance docs/PS.md states for PS against data parallel (sync) or one device (async).
const TOLERANCE: f32 = 1e-5;

/// The model of a case.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Model {
    Mlp,
    Gpt,
    Bag,
}

/// What a case checks.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// Losses equal the reference's (data parallel, one device, or the dense table).
    Equal,
    /// Refused naming a key; the setting and the key expected.
    Refused(&'static str, &'static str),
    /// Hostile peers during the run; losses still the reference's.
    Hostile,
    /// A worker SIGKILLed at a step.
    KillWorker(usize),
    /// A server SIGKILLed at a step and restarted.
    RestartServer(usize),
}

/// One drawn case.
struct Case {
    model: Model,
    servers: usize,
    workers: usize,
    sync: bool,
    steps: usize,
    kind: Kind,
    /// The PS config's text.
    text: String,
    /// The reference: data parallel's text (devices = workers), or the dense table's PS text.
    reference: String,
}

/// The `[train]` keys of a drawn optimizer, schedule and clipping.
fn draw_train(rng: &mut Rng, model: Model, steps: usize) -> String {
    let mut t = format!(
        "epochs = 1\nmax_steps = {steps}\neval = false\nper_print_times = 1\nseed = {}\n",
        rng.range(1, 1000)
    );
    if model == Model::Bag {
        // The sparse run equals the dense one with plain SGD and no weight decay (docs/PS.md).
        t.push_str(&format!(
            "optimizer = \"sgd\"\nlearning_rate = {}\n",
            rng.pick(&["0.05", "0.1", "0.02"])
        ));
        return t;
    }
    let optimizer = rng.pick(&["sgd", "momentum", "adam", "adamw", "mint_adamw"]);
    let lr = match optimizer {
        "sgd" | "momentum" => rng.pick(&["0.02", "0.05", "0.1"]),
        _ => rng.pick(&["0.001", "0.003", "0.01"]),
    };
    t.push_str(&format!(
        "optimizer = \"{optimizer}\"\nlearning_rate = {lr}\n"
    ));
    if optimizer == "momentum" {
        t.push_str(&format!(
            "momentum = {}\nuse_nesterov = {}\n",
            rng.pick(&["0.9", "0.5"]),
            rng.chance(0.3)
        ));
    }
    if rng.chance(0.4) {
        t.push_str(&format!("weight_decay = {}\n", rng.pick(&["0.01", "0.1"])));
        if rng.chance(0.5) {
            t.push_str("no_weight_decay = [\"bias\", \"norm\"]\n");
        }
    }
    match rng.range(0, 3) {
        0 => {}
        1 => t.push_str(&format!(
            "lr_schedule = \"cosine\"\nwarmup_steps = {}\nmin_lr = 0.0001\ndecay_steps = {}\n",
            rng.range(0, 2),
            steps + 2
        )),
        2 => t.push_str(
            "lr_schedule = \"exponential_decay_lr\"\ndecay_rate = 0.7\nstep_per_epoch = 1\ndecay_epoch = 1\n",
        ),
        _ => t.push_str(&format!(
            "lr_schedule = \"piecewise_constant_lr\"\nmilestone = [2, {}]\nlearning_rates = [{lr}, 0.001]\n",
            steps + 10
        )),
    }
    if rng.chance(0.3) {
        t.push_str(&format!(
            "max_grad_norm = {}\n",
            rng.pick(&["0.05", "0.5", "5.0"])
        ));
    }
    t
}

/// The whole TOML of a case: `model` with `batch`, `[parallel]` body and `[ps]` body (no
/// section when `None`).
fn job_text(
    model: Model,
    batch: usize,
    parallel: &str,
    ps: Option<&str>,
    train: &str,
    out: &Path,
) -> String {
    let model_data = match model {
        Model::Mlp | Model::Bag => format!(
            "[model]\nname = \"{}\"\nhidden = {}\nclasses = 10\n[data]\nformat = \"idx\"\ndir = \"{}\"\nbatch_size = {batch}\nshuffle = true\n",
            if model == Model::Mlp { "seed_mlp" } else { "embedding_bag" },
            if model == Model::Mlp { 64 } else { 16 },
            digits().display()
        ),
        Model::Gpt => format!(
            "[model]\nname = \"gpt\"\nlayers = 1\nheads = 4\nhidden = 16\nseq_len = 8\nffn_hidden = 32\n[data]\nformat = \"text\"\npath = \"{}\"\nbatch_size = {batch}\nsteps_per_epoch = 20\n",
            digits().join("../kjv/kjv.txt.gz").display()
        ),
    };
    let ps = ps.map(|p| format!("[ps]\n{p}\n")).unwrap_or_default();
    format!(
        "{model_data}[parallel]\n{parallel}\n{ps}[train]\n{train}[output]\ndir = \"{}\"\n",
        out.display()
    )
}

/// Draws case `index` of `seed`, its output under `out`.
fn draw(seed: u64, index: usize, out: &Path, faults: bool) -> Case {
    let mut rng = Rng::for_case(seed, index as u64);
    let model = match rng.range(0, 9) {
        0..=5 => Model::Mlp,
        6 | 7 => Model::Gpt,
        _ => Model::Bag,
    };
    let workers = rng.range(1, if model == Model::Mlp { 4 } else { 2 });
    let max_servers = match model {
        Model::Mlp => 3,
        _ => 2,
    };
    let mut servers = rng.range(1, max_servers);
    // Data parallel splits the batch evenly over its ranks.
    let batch = workers * rng.pick(&[2, 3, 4, 8]);
    let steps = rng.range(2, if model == Model::Gpt { 3 } else { 5 });
    let mut sync = true;
    let mut kind = Kind::Equal;
    let roll = rng.range(0, 9);
    if roll == 0 && workers == 1 && model != Model::Bag {
        sync = false;
    } else if roll <= 2 {
        kind = draw_refusal(&mut rng, model);
    } else if roll == 3 && model == Model::Mlp {
        kind = Kind::Hostile;
    } else if faults && roll >= 8 && model == Model::Mlp {
        servers = servers.max(2);
        kind = match rng.chance(0.5) {
            true => Kind::KillWorker(rng.range(3, 10)),
            false => Kind::RestartServer(rng.range(4, 12)),
        };
    }
    let workers = match kind {
        Kind::KillWorker(_) => workers.max(2),
        _ => workers,
    };
    let batch = match kind {
        Kind::KillWorker(_) | Kind::RestartServer(_) => 32,
        _ => batch,
    };
    let steps = match kind {
        Kind::KillWorker(_) | Kind::RestartServer(_) => 30,
        _ => steps,
    };
    let train = draw_train(&mut rng, model, steps);
    let mut ps = format!(
        "servers = {servers}\nworkers = {workers}\nsync = {sync}\ncheckpoint_every = {}\nheartbeat_ms = 50\ndead_after_ms = 600\nrpc_timeout_ms = 3000\nrpc_retries = 3\n",
        rng.range(1, 6)
    );
    if !sync {
        ps.push_str(&format!("staleness = {}\n", rng.range(0, 3)));
    }
    // A restarted server is admitted only after about 2 × dead_after_ms + 4 × heartbeat_ms,
    // far beyond what 3 retries back off (0.35 s): the workers wait for it as long as the
    // scheduler does (docs/PS.md, Failures), so a restart case keeps these settings.
    if model == Model::Bag {
        ps.push_str("embedding_on_server = [\"embedding.embedding_table\"]\n");
        if rng.chance(0.5) {
            ps.push_str("worker_max_param_bytes = 400000\n");
        }
    }
    let mut parallel = "mode = \"parameter_server\"".to_string();
    let mut train_text = train.clone();
    let mut output_extra = String::new();
    if let Kind::Refused(setting, _) = kind {
        match setting {
            "grad_accumulation_steps" => train_text.push_str("grad_accumulation_steps = 2\n"),
            "deterministic" => train_text.push_str("deterministic = true\n"),
            "devices" => parallel.push_str(&format!("\ndevices = {workers}")),
            "too_many_workers" => {
                ps = ps.replace(
                    &format!("workers = {workers}\n"),
                    &format!("workers = {}\n", batch + 1),
                )
            }
            "too_many_servers" => {
                ps = ps.replace(&format!("servers = {servers}\n"), "servers = 5\n")
            }
            "dead_after" => ps.push_str("heartbeat_ms = 900\n"),
            "gpt_eval" => train_text = train_text.replace("eval = false", "eval = true"),
            "moe" => {}
            "resume" => output_extra.push_str("resume_from = \"latest\"\n"),
            "periodic" => output_extra.push_str("save_checkpoint_steps = 1\n"),
            "local_norm" => train_text.push_str("dump_local_norm = true\n"),
            "elastic" => train_text.push_str("elastic = true\n"),
            "bf16" => train_text.push_str("precision = \"bf16\"\n"),
            other => unreachable!("{other}"),
        }
    }
    let mut text = job_text(
        model,
        batch,
        &parallel,
        Some(&ps),
        &train_text,
        &out.join("ps"),
    );
    if kind == Kind::Refused("dead_after", "ps.dead_after_ms") {
        // Keep one heartbeat_ms: the later one replaces the drawn one.
        text = text.replace("heartbeat_ms = 50\n", "");
    }
    if kind == Kind::Refused("moe", "model.moe") {
        text = text.replace("[data]", "[model.moe]\nexperts = 2\ntop_k = 1\n[data]");
    }
    text.push_str(&output_extra);
    let reference = match model {
        Model::Bag => job_text(
            model,
            batch,
            "mode = \"parameter_server\"",
            Some(&format!("servers = {servers}\nworkers = {workers}\n")),
            &train,
            &out.join("dense"),
        ),
        _ => job_text(
            model,
            batch,
            &format!("mode = \"data_parallel\"\ndevices = {workers}"),
            None,
            &train,
            &out.join("dp"),
        ),
    };
    Case {
        model,
        servers,
        workers,
        sync,
        steps,
        kind,
        text,
        reference,
    }
}

/// A setting the mode does not run, and the key its error must name.
fn draw_refusal(rng: &mut Rng, model: Model) -> Kind {
    let mut options = vec![
        ("grad_accumulation_steps", "train.grad_accumulation_steps"),
        ("deterministic", "train.deterministic"),
        ("devices", "parallel.devices"),
        ("too_many_workers", "ps.workers"),
        ("dead_after", "ps.dead_after_ms"),
        ("resume", "output.resume_from"),
        ("periodic", "output.save_checkpoint_steps"),
        ("local_norm", "train.dump_local_norm"),
        ("elastic", "train.elastic"),
    ];
    if model == Model::Gpt {
        options.push(("bf16", "train.precision"));
    }
    match model {
        Model::Mlp => options.push(("too_many_servers", "ps.servers")),
        Model::Gpt => {
            options.push(("gpt_eval", "train.eval"));
            options.push(("moe", "model.moe"));
        }
        Model::Bag => {}
    }
    let (setting, key) = rng.pick(&options);
    Kind::Refused(setting, key)
}

fn parse(text: &str) -> Result<TrainConfig, String> {
    TrainConfig::parse(text, None, &[], Path::new("/")).map_err(|e| e.to_string())
}

/// Everything that checks a config before a local job starts any process: the parse, the
/// counts (`tessera train`'s own check, with no launcher variables), the model's computation.
fn preflight(text: &str) -> Result<(TrainConfig, (usize, usize)), String> {
    let config = parse(text)?;
    let counts = ps::env::local_job_counts(&config, |_| None).map_err(|e| e.to_string())?;
    ps::compute::Compute::new(&config).map_err(|e| e.to_string())?;
    Ok((config, counts))
}

/// Runs every role of `config` as threads (real gRPC) with the scheduler at `addr`; worker
/// 0's report, or the first role's error; a role that panics or a job past
/// [`CASE_DEADLINE`] is an error too.
fn run_job(
    config: &TrainConfig,
    counts: (usize, usize),
    addr: &str,
) -> Result<WorkerReport, String> {
    run_job_within(config, counts, addr, CASE_DEADLINE)
}

/// [`run_job`] with its own deadline.
fn run_job_within(
    config: &TrainConfig,
    (servers, workers): (usize, usize),
    addr: &str,
    limit: Duration,
) -> Result<WorkerReport, String> {
    let (tx, rx) = mpsc::channel();
    let total = 1 + servers + workers;
    for rank in 0..total {
        let config = config.clone();
        let env = crate::util::env_of(rank, servers, workers, addr);
        let tx = tx.clone();
        std::thread::spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                ps::run_role(&config, &env, None)
            }));
            let _ = tx.send((rank, result));
        });
    }
    let deadline = Instant::now() + limit;
    let mut report = None;
    let mut first_error = None;
    for _ in 0..total {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((_, Ok(Ok(Some(r))))) if r.worker_id == 0 => report = Some(r),
            Ok((_, Ok(Ok(_)))) => {}
            Ok((rank, Ok(Err(e)))) => {
                first_error.get_or_insert_with(|| format!("rank {rank} failed: {e}"));
            }
            Ok((rank, Err(_))) => return Err(format!("rank {rank} panicked")),
            Err(_) => {
                return Err(format!(
                    "the job did not end within {limit:?} (a hang); first error: {first_error:?}"
                ))
            }
        }
    }
    match (first_error, report) {
        (Some(e), _) => Err(e),
        (None, Some(r)) => Ok(r),
        (None, None) => Err("worker 0 gave no report".to_string()),
    }
}

/// The reference losses of `case`.
fn reference_losses(case: &Case) -> Result<Vec<f32>, String> {
    let config = parse(&case.reference)?;
    if case.model == Model::Bag {
        return run_job(&config, (case.servers, case.workers), &scheduler_addr()).map(|r| r.losses);
    }
    let session = Session::new(&config).map_err(|e| e.to_string())?;
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    runtime::train_local(&session, &options)
        .map(|r| r.losses().to_vec())
        .map_err(|e| e.to_string())
}

/// Whether `losses` are `reference`'s within [`TOLERANCE`], step for step.
fn compare(losses: &[f32], reference: &[f32]) -> Result<(), String> {
    if losses.len() != reference.len() {
        return Err(format!(
            "{} losses, the reference has {}: {losses:?} vs {reference:?}",
            losses.len(),
            reference.len()
        ));
    }
    for (i, (a, b)) in losses.iter().zip(reference).enumerate() {
        let close = (a - b).abs() <= TOLERANCE;
        if !close {
            return Err(format!(
                "step {}: loss {a} vs reference {b} (all: {losses:?} vs {reference:?})",
                i + 1
            ));
        }
    }
    Ok(())
}

/// Whether `err` names a key of a config section the sweep draws.
fn names_a_key(err: &str) -> bool {
    ["ps.", "parallel.", "train.", "model.", "data.", "output."]
        .iter()
        .any(|section| err.contains(section))
}

/// Runs `case`; `Err` describes how it broke its promise.
fn run_case(case: &Case, dir: &Path) -> Result<String, String> {
    if let Kind::Refused(setting, key) = case.kind {
        return match preflight(&case.text) {
            Err(e) if e.contains(key) && names_a_key(&e) => Ok(format!("refused: {setting}")),
            Err(e) => Err(format!("refused, but the error does not name {key}: {e}")),
            Ok((config, counts)) => match run_job(&config, counts, &scheduler_addr()) {
                Err(e) if e.contains(key) => Ok(format!("refused once running: {setting}")),
                Err(e) => Err(format!(
                    "{setting}: accepted before start, then failed without naming {key}: {e}"
                )),
                Ok(_) => Err(format!(
                    "{setting}: trained, though the mode does not run it (expected an error naming {key})"
                )),
            },
        };
    }
    let (config, counts) = preflight(&case.text).map_err(|e| format!("refused: {e}"))?;
    let reference = || reference_losses(case).map_err(|e| format!("the reference: {e}"));
    match case.kind {
        Kind::Equal => {
            let reference = reference()?;
            let report = run_job(&config, counts, &scheduler_addr())?;
            compare(&report.losses, &reference)?;
            Ok("equal".to_string())
        }
        Kind::Hostile => {
            let reference = reference()?;
            let (report, hostile) = run_with_hostile_peers(&config, counts, CASE_DEADLINE)?;
            compare(&report.losses, &reference)?;
            Ok(format!("hostile peers refused: {hostile}"))
        }
        Kind::KillWorker(step) => kill_worker(case, dir, step),
        Kind::RestartServer(step) => restart_server(case, dir, step),
        Kind::Refused(..) => unreachable!(),
    }
}

/// Runs `config`'s job in process while [`hostile_peers`] attack it (holding stalled
/// connections until the job has ended); worker 0's report and what the peers did.
fn run_with_hostile_peers(
    config: &TrainConfig,
    counts: (usize, usize),
    limit: Duration,
) -> Result<(WorkerReport, String), String> {
    let addr = scheduler_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let hostile = {
        let (addr, stop) = (addr.clone(), stop.clone());
        std::thread::spawn(move || hostile_peers(&addr, counts.0, &stop))
    };
    let result = run_job_within(config, counts, &addr, limit);
    stop.store(true, Ordering::SeqCst);
    let hostile = hostile
        .join()
        .map_err(|_| "the hostile peer panicked".to_string())??;
    Ok((result?, hostile))
}

/// Raw bytes a hostile TCP peer sends: not a gRPC call at all, or a call cut short.
fn raw_attacks() -> Vec<(&'static str, Vec<u8>)> {
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let settings = [0u8, 0, 0, 4, 0, 0, 0, 0, 0].to_vec();
    let frame = |len: u32, kind: u8, flags: u8, stream: u32| {
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f
    };
    vec![
        ("garbage", b"\x16\x03\x01\x02\x00hello, not http/2".to_vec()),
        ("wrong-version preface", b"PRI * HTTP/3.0\r\n\r\nSM\r\n\r\n".to_vec()),
        ("http/1.1", b"POST /tessera.ps.Scheduler/Finish HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n\0\0\0\0\0".to_vec()),
        ("oversized frame", [preface.clone(), settings.clone(), frame(0xFF_FFFF, 0, 0, 1)].concat()),
        ("truncated frame", [preface.clone(), settings.clone(), frame(1000, 1, 4, 1), vec![0x82, 0x86]].concat()),
        ("truncated preface", preface[..10].to_vec()),
    ]
}

/// Sends `bytes` to `addr` and closes (or, with `stall`, holds the connection open); what
/// happened is not the test's business, only that the job survives it.
fn send_raw(addr: &str, bytes: &[u8], stall: Option<&AtomicBool>) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    let _ = s.write_all(bytes);
    if let Some(stop) = stall {
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        return;
    }
    let mut sink = [0u8; 256];
    let _ = s.read(&mut sink);
}

/// While `stop` is unset: raw attacks and a stalled connection on the scheduler and every one
/// of its `expected` servers (once all have registered), and pushes and pulls carrying the
/// job's secret that a server must refuse. Returns how many refusals it saw, or why a hostile
/// call was not refused.
fn hostile_peers(addr: &str, expected: usize, stop: &AtomicBool) -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let secret = secret_of(addr);
    let servers = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(mut c) = ps::net::scheduler_client(addr, Duration::from_secs(2), &secret) {
                if let Ok(r) = c.get_servers(ps::proto::GetServersRequest {}).await {
                    let list: Vec<String> =
                        r.into_inner().servers.into_iter().map(|s| s.addr).collect();
                    if list.len() >= expected {
                        return list;
                    }
                }
            }
            if Instant::now() > deadline || stop.load(Ordering::SeqCst) {
                return Vec::new();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let mut targets = vec![addr.to_string()];
    targets.extend(servers.iter().cloned());
    std::thread::scope(|scope| {
        for t in &targets {
            scope.spawn(move || send_raw(t, b"PRI * HTTP/2.0\r\n", Some(stop)));
        }
        let mut refused = 0;
        for server in &servers {
            refused += rt.block_on(bad_calls(server, &secret))?;
        }
        for (_, bytes) in raw_attacks() {
            for t in &targets {
                send_raw(t, &bytes, None);
            }
        }
        // Keep the stalled connections while the job runs.
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(format!(
            "{} raw attacks and a stalled connection on {} peer(s), {refused} bad call(s)",
            raw_attacks().len(),
            targets.len()
        ))
    })
}

/// Calls with the job's secret that the server at `addr` must refuse: a push whose tensor is
/// truncated, one larger than the server's message limit, one tagged with another map epoch
/// (a wrong protocol version of the route), and one of a step far ahead; a pull of another
/// epoch. Returns how many were refused; a call accepted is an error.
async fn bad_calls(addr: &str, secret: &ps::auth::JobSecret) -> Result<usize, String> {
    let mut client = ps::net::server_client(addr, Duration::from_secs(5), 64 << 20, secret)
        .map_err(|e| e.to_string())?;
    let push = |tensors: Vec<TensorMsg>, step: u64| PushRequest {
        worker_id: 0,
        step,
        members: vec![0],
        rows: 1,
        loss: 1.0,
        replay: false,
        seen_version: 0,
        tensors,
        sparse: Vec::new(),
        learning_rate: Some(0.1),
    };
    let truncated = TensorMsg {
        name: "fc1.weight".to_string(),
        shape: vec![64, 64],
        data: vec![0u8; 10],
    };
    let oversized = TensorMsg {
        name: "fc1.weight".to_string(),
        shape: vec![8 << 20],
        data: vec![0u8; 32 << 20],
    };
    let mut stale = tonic::Request::new(push(vec![truncated.clone()], 0));
    stale
        .metadata_mut()
        .insert("tessera-map-epoch", "7".parse().expect("ascii"));
    let mut stale_pull = tonic::Request::new(PullRequest {
        worker_id: 0,
        ..PullRequest::default()
    });
    stale_pull
        .metadata_mut()
        .insert("tessera-map-epoch", "3".parse().expect("ascii"));
    let mut refused = 0;
    let calls: Vec<(&str, tonic::Request<PushRequest>)> = vec![
        (
            "truncated tensor",
            tonic::Request::new(push(vec![truncated], 0)),
        ),
        (
            "oversized push",
            tonic::Request::new(push(vec![oversized], 0)),
        ),
        ("stale-epoch push", stale),
        (
            "push of a far-future step, no tensors",
            tonic::Request::new(push(Vec::new(), u64::MAX / 2)),
        ),
    ];
    // A server already gone (the job ended) refuses nothing: only its own refusals count.
    let by_the_server = |e: &tonic::Status| {
        !matches!(
            e.code(),
            tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown
        )
    };
    for (what, call) in calls {
        match client.push(call).await {
            Ok(r) => {
                return Err(format!(
                    "server {addr} accepted a {what}: {:?}",
                    r.into_inner()
                ))
            }
            Err(e) if by_the_server(&e) => refused += 1,
            Err(_) => {}
        }
    }
    match client.pull(stale_pull).await {
        Ok(_) => {
            return Err(format!(
                "server {addr} answered a pull of another map epoch"
            ))
        }
        Err(e) if by_the_server(&e) => refused += 1,
        Err(_) => {}
    }
    Ok(refused)
}

/// Writes `case`'s config into `dir`.
fn write_config(case: &Case, dir: &Path) -> PathBuf {
    let path = dir.join("ps.toml");
    std::fs::write(&path, &case.text).expect("the config is written");
    path
}

/// Starts every role of `case` as a process.
fn start_processes(case: &Case, config: &Path, addr: &str) -> Vec<RoleProcess> {
    (0..1 + case.servers + case.workers)
        .map(|rank| {
            RoleProcess::start(
                config,
                &crate::util::role_env(rank, case.servers, case.workers, addr),
            )
        })
        .collect()
}

/// How long a process job may take.
const PROCESS_LIMIT: Duration = Duration::from_secs(120);

/// SIGKILLs the last worker once worker 0 prints step `step`: the job must finish on the
/// others, every survivor exiting 0, with the lost worker named.
fn kill_worker(case: &Case, dir: &Path, step: usize) -> Result<String, String> {
    let config = write_config(case, dir);
    let addr = scheduler_addr();
    let mut job = start_processes(case, &config, &addr);
    let w0 = 1 + case.servers;
    let victim = job.len() - 1;
    if !job[w0].wait_for_line(&format!("step: {step},"), PROCESS_LIMIT) {
        return Err(format!(
            "worker 0 never reached step {step}:\n{}",
            job[w0].output()
        ));
    }
    sigkill(&job[victim].child);
    let _ = job[victim].finish(PROCESS_LIMIT);
    let ok: Vec<bool> = job[..victim]
        .iter_mut()
        .map(|p| p.finish(PROCESS_LIMIT))
        .collect();
    if ok.iter().any(|ok| !ok) {
        return Err(format!(
            "a survivor failed ({ok:?}):\nscheduler:\n{}\nworker 0:\n{}",
            job[0].output(),
            job[w0].output()
        ));
    }
    let lost = case.workers - 1;
    let out = job[w0].output();
    if !out.contains(&format!("worker {lost} was lost at step")) {
        return Err(format!(
            "worker 0's summary does not name worker {lost}:\n{out}"
        ));
    }
    if loss_lines(&out).len() != case.steps || loss_lines(&out).iter().any(|l| !l.is_finite()) {
        return Err(format!(
            "worker 0 did not log {} finite losses:\n{out}",
            case.steps
        ));
    }
    Ok(format!(
        "worker {lost} killed at step {step}; the job finished"
    ))
}

/// SIGKILLs server 1 once worker 0 prints step `step` and restarts it: it must resume from its
/// snapshot, lose no step, and the losses must be an uninterrupted run's.
fn restart_server(case: &Case, dir: &Path, step: usize) -> Result<String, String> {
    let config = write_config(case, dir);
    let addr = scheduler_addr();
    let mut job = start_processes(case, &config, &addr);
    let w0 = 1 + case.servers;
    if !job[w0].wait_for_line(&format!("step: {step},"), PROCESS_LIMIT) {
        return Err(format!(
            "worker 0 never reached step {step}:\n{}",
            job[w0].output()
        ));
    }
    sigkill(&job[2].child);
    let _ = job[2].finish(PROCESS_LIMIT);
    let mut env = crate::util::role_env(2, case.servers, case.workers, &addr);
    for (k, v) in env.iter_mut() {
        if k == "TESSERA_RESTART_COUNT" {
            *v = "1".to_string();
        }
    }
    let mut restarted = RoleProcess::start(&config, &env);
    let ok: Vec<bool> = job
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, p)| p.finish(PROCESS_LIMIT))
        .collect();
    let server_ok = restarted.finish(PROCESS_LIMIT);
    if !server_ok || ok.iter().any(|ok| !ok) {
        return Err(format!(
            "a role failed (restarted server {server_ok}, others {ok:?}):\nrestarted:\n{}\nscheduler:\n{}\nworker 0:\n{}",
            restarted.output(),
            job[0].output(),
            job[w0].output()
        ));
    }
    let server = restarted.output();
    let recovered = server
        .lines()
        .find(|l| l.contains("recovered:"))
        .ok_or_else(|| format!("no recovery line:\n{server}"))?;
    // The uninterrupted run: the same config in process.
    let (uninterrupted, counts) = preflight(&case.text.replace(
        &dir.join("ps").display().to_string(),
        &dir.join("ref").display().to_string(),
    ))?;
    let reference = run_job(&uninterrupted, counts, &scheduler_addr())?;
    compare(&loss_lines(&job[w0].output()), &reference.losses)
        .map_err(|e| format!("{recovered}; the losses are not an uninterrupted run's: {e}"))?;
    if !recovered.contains("lost 0 step(s)") {
        return Err(format!(
            "a sync restart says it lost steps, with an uninterrupted run's losses: {recovered}\nrestarted server:\n{server}"
        ));
    }
    Ok(format!(
        "server 1 killed at step {step} and restarted: {recovered}"
    ))
}

/// A variable of the sweep.
fn var(name: &str) -> Option<String> {
    std::env::var(format!("TESSERA_PS_SWEEP_{name}")).ok()
}

#[test]
fn a_seeded_sweep_of_parameter_server_jobs_keeps_the_docs_promises() {
    let seed = var("SEED").map_or(DEFAULT_SEED, |s| s.parse().expect("TESSERA_PS_SWEEP_SEED"));
    let cases = var("CASES").map_or(DEFAULT_CASES, |s| {
        s.parse().expect("TESSERA_PS_SWEEP_CASES")
    });
    let only: Option<Vec<usize>> = var("ONLY").map(|s| {
        s.split(',')
            .map(|i| i.trim().parse().expect("TESSERA_PS_SWEEP_ONLY"))
            .collect()
    });
    let faults = var("FAULTS").is_some_and(|v| v == "1");
    let indices: Vec<usize> = only.unwrap_or_else(|| (0..cases).collect());
    let mut failures = Vec::new();
    for index in indices {
        let dir = tempfile::tempdir().unwrap();
        let case = draw(seed, index, dir.path(), faults);
        let started = Instant::now();
        let verdict = run_case(&case, dir.path());
        eprintln!(
            "case {index} ({:?}, {} server(s), {} worker(s), sync {}, {:?}): {} in {:.1} s",
            case.model,
            case.servers,
            case.workers,
            case.sync,
            case.kind,
            match &verdict {
                Ok(v) => v.clone(),
                Err(_) => "FAILED".to_string(),
            },
            started.elapsed().as_secs_f64()
        );
        if let Err(why) = verdict {
            failures.push(format!(
                "seed {seed} case {index}: {why}\n--- config ---\n{}\n--- reference ---\n{}",
                case.text, case.reference
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A stalled peer (a connection opened to the scheduler and to every server that never
/// finishes its preface, held until the job has ended), raw truncated, oversized and
/// wrong-version frames, and bad pushes with the job's secret neither change a sync job's
/// losses (data parallel's) nor keep its scheduler and servers from ending: they used to wait
/// for every connection to close, forever.
#[test]
fn hostile_peers_neither_change_nor_hang_a_sync_job() {
    let dir = tempfile::tempdir().unwrap();
    let train = "epochs = 1\nmax_steps = 20\neval = false\nseed = 7\noptimizer = \"momentum\"\nlearning_rate = 0.05\nmomentum = 0.9\n";
    let ps = "servers = 2\nworkers = 2\nheartbeat_ms = 50\ndead_after_ms = 600\nrpc_timeout_ms = 3000\nrpc_retries = 3\n";
    let text = job_text(
        Model::Mlp,
        16,
        "mode = \"parameter_server\"",
        Some(ps),
        train,
        &dir.path().join("ps"),
    );
    let (config, counts) = preflight(&text).expect("a valid job");
    let (report, hostile) =
        run_with_hostile_peers(&config, counts, Duration::from_secs(30)).expect("the job ends");
    eprintln!("{hostile}");
    // Both servers were found and attacked (no bad call was accepted, or the peers would have
    // failed); a call that meets a server ending or a reset stream is not counted as refused.
    assert!(hostile.contains("on 3 peer(s)"), "{hostile}");
    let dp = job_text(
        Model::Mlp,
        16,
        "mode = \"data_parallel\"\ndevices = 2",
        None,
        train,
        &dir.path().join("dp"),
    );
    let case = Case {
        model: Model::Mlp,
        servers: 2,
        workers: 2,
        sync: true,
        steps: 20,
        kind: Kind::Equal,
        text,
        reference: dp,
    };
    compare(&report.losses, &reference_losses(&case).unwrap()).unwrap();
}

/// Settings of collective training that parameter-server training does not run are refused
/// naming the key — by `tessera train` before it starts any process, and by every role as it
/// starts — rather than silently ignored (a resume from a path that does not exist, periodic
/// checkpoint sets that were never written, local norms never printed, used to train as if
/// unset); so is mixed precision, which made every worker fail on a protocol error.
#[test]
fn settings_the_mode_does_not_run_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let base = job_text(
        Model::Mlp,
        8,
        "mode = \"parameter_server\"",
        Some("servers = 1\nworkers = 2"),
        "epochs = 1\nmax_steps = 2\neval = false\noptimizer = \"sgd\"\nlearning_rate = 0.1\n",
        dir.path(),
    );
    assert!(preflight(&base).is_ok());
    let cases = [
        (
            "output",
            "resume_from = \"/no/such/checkpoint\"",
            "output.resume_from",
        ),
        (
            "output",
            "save_checkpoint_steps = 1",
            "output.save_checkpoint_steps",
        ),
        (
            "output",
            "save_checkpoint_seconds = 60",
            "output.save_checkpoint_seconds",
        ),
        ("train", "print_local_norm = true", "train.print_local_norm"),
        ("train", "dump_local_norm = true", "train.dump_local_norm"),
        ("train", "elastic = true", "train.elastic"),
    ];
    for (section, line, key) in cases {
        let text = match section {
            "output" => format!("{base}{line}\n"),
            _ => base.replace("[train]\n", &format!("[train]\n{line}\n")),
        };
        let config = parse(&text).expect("the runtime's parse accepts it");
        let err = ps::env::local_job_counts(&config, |_| None)
            .expect_err(line)
            .to_string();
        assert!(err.contains(key), "{line}: {err}");
        // A role started by a launcher refuses it too, before it does anything.
        let env = crate::util::env_of(1, 1, 2, &scheduler_addr());
        let err = ps::env::JobSettings::new(&config, &env)
            .expect_err(line)
            .to_string();
        assert!(err.contains(key), "{line}: {err}");
    }
    // The GPT in bf16 used to start, then every worker failed on a protocol error naming no
    // key (`tensor embedding.embedding_table: 8192 bytes, expected 16384 (f32 [256, 16])`).
    let gpt = job_text(
        Model::Gpt,
        4,
        "mode = \"parameter_server\"",
        Some("servers = 1\nworkers = 2"),
        "epochs = 1\nmax_steps = 2\neval = false\noptimizer = \"sgd\"\nlearning_rate = 0.1\nprecision = \"bf16\"\n",
        dir.path(),
    );
    let err = preflight(&gpt).expect_err("bf16").to_string();
    assert!(err.contains("train.precision"), "{err}");
}

/// The sweep's own refusal check: an error of [`PsError`] type names its key in its text.
#[test]
fn the_sweep_recognises_an_error_naming_a_key() {
    let e = PsError::Config {
        key: "ps.workers".to_string(),
        reason: "x".to_string(),
    };
    assert!(names_a_key(&e.to_string()));
    assert!(!names_a_key("connection refused"));
}
