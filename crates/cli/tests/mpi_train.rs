//! The seed run under the MPI backend (`mpirun -np 4`, one process per rank), in both
//! collective modes (polled, and blocking under a watchdog), gives the losses of the local
//! backend (to 1e-5: the all-reduces sum in other orders) and of one device, and the four
//! processes save one committed checkpoint set. Built only with `--features mpi`.

use std::process::Command;

use crate::util::{assert_ok, repo_root, s, step_losses, Scratch};

fn run(args: &[&str], mpi: bool) {
    let exe = env!("CARGO_BIN_EXE_tessera");
    let mut command = if mpi {
        let mut c = Command::new("mpirun");
        c.args(["--allow-run-as-root", "--oversubscribe", "-np", "4", exe]);
        c
    } else {
        Command::new(exe)
    };
    let out = command
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("running tessera");
    assert_ok(&out);
}

#[test]
fn mpi_training_matches_local_and_one_device() {
    let dir = Scratch::new("mpi-train");
    let common = |name: &str, devices: &str, mode: &str| -> Vec<String> {
        vec![
            "train".into(),
            "examples/seed_semi_auto.toml".into(),
            "--devices".into(),
            devices.into(),
            "--set".into(),
            format!("parallel.mode=\"{mode}\""),
            "--set".into(),
            "parallel.shard={ matmul1 = [[2, 2], [2, 1]], matmul2 = [[1, 4], [4, 1]] }".into(),
            "--set".into(),
            "train.max_steps=20".into(),
            "--set".into(),
            "train.eval=false".into(),
            "--set".into(),
            format!("output.dir=\"{}\"", s(&dir.0.join(name))),
            "--log-json".into(),
            s(&dir.0.join(format!("{name}.jsonl"))).to_string(),
        ]
    };
    let mut mpi = common("mpi", "4", "semi_auto");
    mpi.extend(["--backend".to_string(), "mpi".to_string()]);
    run(&args(&mpi), true);
    let mut watched = common("watched", "4", "semi_auto");
    watched.extend(["--backend", "mpi", "--mpi-watchdog"].map(String::from));
    run(&args(&watched), true);
    run(&args(&common("local", "4", "semi_auto")), false);
    run(&args(&common("one", "1", "stand_alone")), false);
    // The four processes wrote one set: rank 0's process committed what every rank staged.
    let saved = dir.0.join("mpi");
    let marker = ckpt::SetMarker::read(&saved)
        .unwrap()
        .expect("a committed set");
    assert_eq!(marker.ranks, vec![0, 1, 2, 3]);
    let report =
        ckpt::verify_checkpoints(&saved, &saved.join("strategy.json"), true).expect("verifies");
    assert!(report.is_ok(), "{:?}", report.faults);
    let leftovers: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tessera-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let mpi = step_losses(&dir.0.join("mpi.jsonl"));
    let local = step_losses(&dir.0.join("local.jsonl"));
    let one = step_losses(&dir.0.join("one.jsonl"));
    let watched = step_losses(&dir.0.join("watched.jsonl"));
    assert_eq!(mpi.len(), 20);
    assert_eq!(watched.len(), 20);
    for (i, (((m, l), o), w)) in mpi.iter().zip(&local).zip(&one).zip(&watched).enumerate() {
        // The three runs' all-reduces sum in different orders (the watchdog's are OpenMPI's own
        // collectives; the polled run's and the local backend's group the ranks differently):
        // they agree to rounding, which compounds over the steps (1.2e-6 and 1.3e-6 relative at
        // step 19 seen).
        assert!(
            (m - w).abs() <= 1e-5 * m.abs(),
            "step {}: polled mpi {m} vs watchdog mpi {w}",
            i + 1
        );
        assert!(
            (m - l).abs() <= 1e-5 * l.abs(),
            "step {}: mpi {m} vs local {l}",
            i + 1
        );
        assert!(
            (m - o).abs() <= 1e-4 * o.abs(),
            "step {}: mpi {m} vs one device {o}",
            i + 1
        );
    }
}

/// `train.grad_accumulation_steps = 4` with batch 8 under MPI (4 processes, semi-auto) gives
/// the local backend's losses (1e-6) and those of one device on batch 32 (1e-4, the sharding
/// bound above): the accumulation lives in every rank's loop, whatever the backend.
#[test]
fn mpi_gradient_accumulation_matches_the_larger_batch() {
    let dir = Scratch::new("mpi-accum");
    let common = |name: &str, devices: &str, mode: &str, batch: &str, micro_steps: &str| {
        [
            "train",
            "examples/seed_semi_auto.toml",
            "--devices",
            devices,
            "--set",
            &format!("parallel.mode=\"{mode}\""),
            "--set",
            "parallel.shard={ matmul1 = [[2, 2], [2, 1]], matmul2 = [[1, 4], [4, 1]] }",
            "--set",
            &format!("data.batch_size={batch}"),
            "--set",
            &format!("train.grad_accumulation_steps={micro_steps}"),
            "--set",
            "train.max_steps=10",
            "--set",
            "train.eval=false",
            "--set",
            &format!("output.dir=\"{}\"", s(&dir.0.join(name))),
            "--log-json",
            s(&dir.0.join(format!("{name}.jsonl"))),
        ]
        .map(String::from)
        .to_vec()
    };
    let mut mpi = common("mpi", "4", "semi_auto", "8", "4");
    mpi.extend(["--backend", "mpi"].map(String::from));
    run(&args(&mpi), true);
    run(&args(&common("local", "4", "semi_auto", "8", "4")), false);
    run(&args(&common("one", "1", "stand_alone", "32", "1")), false);
    assert_mpi_losses(&dir.0, 10, 1e-6);
}

pub(crate) fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A rank whose run returns an error (here rank 3, whose step 1 local-norm file is taken by a
/// directory, at the end of step 1) tells its peers before it leaves: the job ends with its
/// error well before the 120 s `--timeout`, instead of the others waiting for it until then.
/// (A `rank_3` folder that is a file is refused before any rank starts.)
#[test]
fn mpi_a_failing_rank_stops_the_job_with_its_error() {
    let dir = Scratch::new("mpi-failfast");
    let norms = dir.0.join("norms");
    std::fs::create_dir_all(norms.join("rank_3").join("local_norm_step_1.json")).unwrap();
    let start = std::time::Instant::now();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .arg(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "train",
            "examples/seed_semi_auto.toml",
            "--devices",
            "4",
            "--set",
            "parallel.shard={ matmul1 = [[2, 2], [2, 1]], matmul2 = [[1, 4], [4, 1]] }",
            "--set",
            "train.max_steps=4",
            "--set",
            "train.dump_local_norm=true",
            "--set",
            &format!("train.dump_local_norm_path=\"{}\"", s(&norms)),
            "--set",
            &format!("output.dir=\"{}\"", s(&dir.0.join("run"))),
            "--backend",
            "mpi",
            "--timeout",
            "120",
        ])
        .current_dir(repo_root())
        .output()
        .expect("running mpirun");
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(s(&norms.join("rank_3"))),
        "rank 3's own error: {stderr}"
    );
    // A correctness bound (not the timeout), not a benchmark: the job takes about a second.
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
}

/// Runs `sh -c script` as the 2 ranks of an `mpirun` job (`$0` the tessera binary, `$1` the
/// run's output directory `out`), from the repository root, to its end (or killed after 120 s:
/// a hang fails the test).
fn two_ranks_of(script: &str, out: &std::path::Path) -> std::process::Output {
    let child = Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "2",
            "sh",
            "-c",
            script,
        ])
        .arg(env!("CARGO_BIN_EXE_tessera"))
        .arg(out)
        .current_dir(repo_root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running mpirun");
    crate::util::wait_or_kill(child, std::time::Duration::from_secs(120))
        .expect("the job ends instead of hanging")
}

/// Ranks that disagree on the device count: the rank whose count is not the job's size tells
/// its peers, so the job ends with its error instead of the others waiting forever in their
/// first collective (group creation, which no timeout covers).
#[test]
fn mpi_a_rank_with_another_device_count_stops_the_job() {
    let dir = Scratch::new("mpi-devices");
    let script = "D=2; [ \"$OMPI_COMM_WORLD_RANK\" = 1 ] && D=4; exec \"$0\" train examples/seed_data_parallel.toml --devices $D --backend mpi --timeout 20 --set train.max_steps=2 --set \"output.dir=\\\"$1\\\"\"";
    let out = two_ranks_of(script, &dir.0.join("run"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("asks for 4 devices but mpirun started 2 processes"),
        "rank 1's own error: {stderr}"
    );
}

/// Ranks that run different configurations (here rank 1 another learning rate, as a per-node
/// `--set` would give) are refused before training, naming the setting: they used to train
/// different models and commit a set whose replicas disagree.
#[test]
fn mpi_ranks_with_different_configurations_are_refused() {
    let dir = Scratch::new("mpi-config");
    let script = "LR=0.05; [ \"$OMPI_COMM_WORLD_RANK\" = 1 ] && LR=0.5; exec \"$0\" train examples/seed_data_parallel.toml --devices 2 --backend mpi --timeout 20 --set train.max_steps=2 --set train.learning_rate=$LR --set \"output.dir=\\\"$1\\\"\"";
    let out = two_ranks_of(script, &dir.0.join("run"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("train.learning_rate")
            && stderr.contains("rank 1 runs 0.5 but rank 0 runs 0.05"),
        "rank 1 names the setting: {stderr}"
    );
    assert!(
        !dir.0.join("run").join("rank_0").exists(),
        "nothing was trained or saved"
    );
}

/// The GPT (dp 2 × mp 2, sequence parallel) under `mpirun -np 4` gives the losses of the local
/// backend and of one device, and its checkpoint generates text.
#[test]
fn mpi_train_gpt_matches_local_and_one_device() {
    let dir = Scratch::new("mpi-gpt");
    let common = |name: &str, devices: &str, mode: &str| -> Vec<String> {
        let sets = vec![
            format!("parallel.devices={devices}"),
            format!("parallel.mode=\"{mode}\""),
            "parallel.data_parallel=2".to_string(),
            "parallel.model_parallel=2".to_string(),
            "parallel.use_seq_parallel=true".to_string(),
            "model.layers=2".to_string(),
            "model.hidden=64".to_string(),
            "model.seq_len=32".to_string(),
            "data.batch_size=8".to_string(),
            "train.max_steps=10".to_string(),
            "train.eval=false".to_string(),
        ];
        train_command("examples/gpt_kjv.toml", &dir.0, name, sets)
    };
    let mut mpi = common("mpi", "4", "semi_auto");
    mpi.extend(["--backend".to_string(), "mpi".to_string()]);
    run(&args(&mpi), true);
    run(&args(&common("local", "4", "semi_auto")), false);
    run(&args(&common("one", "1", "stand_alone")), false);
    assert_mpi_losses(&dir.0, 10, 1e-6);
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "generate",
            s(&dir.0.join("mpi")),
            "--prompt",
            "In the beginning",
            "--tokens",
            "10",
        ])
        .output()
        .expect("running tessera generate");
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("In the beginning"));
}

/// Context parallel under `mpirun -np 4` (dp 2 × cp 2): ring attention's key/value passes and
/// Ulysses' all-to-alls between processes give the losses of the local backend and of one
/// device.
#[test]
fn mpi_context_parallel_matches_local_and_one_device() {
    for algo in ["ring", "ulysses"] {
        let dir = Scratch::new(&format!("mpi-cp-{algo}"));
        let common = |name: &str, devices: &str, mode: &str| -> Vec<String> {
            let sets = vec![
                format!("parallel.devices={devices}"),
                format!("parallel.mode=\"{mode}\""),
                "parallel.data_parallel=2".to_string(),
                "parallel.context_parallel=2".to_string(),
                "parallel.model_parallel=1".to_string(),
                format!("parallel.context_parallel_algo=\"{algo}\""),
                "model.fused_attention=true".to_string(),
                "model.layers=2".to_string(),
                "model.hidden=64".to_string(),
                "model.seq_len=32".to_string(),
                "data.batch_size=8".to_string(),
                "train.max_steps=6".to_string(),
                "train.eval=false".to_string(),
            ];
            train_command("examples/gpt_kjv.toml", &dir.0, name, sets)
        };
        let mut mpi = common("mpi", "4", "semi_auto");
        mpi.extend(["--backend".to_string(), "mpi".to_string()]);
        run(&args(&mpi), true);
        run(&args(&common("local", "4", "semi_auto")), false);
        run(&args(&common("one", "1", "stand_alone")), false);
        assert_mpi_losses(&dir.0, 6, 1e-6);
    }
}

/// Fused gradient buckets reduced while the backward pass computes
/// (`grad_computation_allreduce_overlap`) under `mpirun -np 4`: each bucket starts as MPI's
/// nonblocking all-reduce (or, with hsdp level 2, nonblocking reduce-scatter) when its last
/// gradient is computed; with hsdp level 3 and `computation_allgather_overlap`, each weight's
/// gather also starts, as MPI's nonblocking all-gather, one gather ahead of its use. The GPT
/// (data parallel 4, 1 MB buckets) trains the losses of the local backend's progress thread and
/// of one device, and every rank's memory line reaches the metrics log.
#[test]
fn mpi_overlapped_buckets_match_local_and_one_device() {
    for (case, extra) in [
        ("allreduce", None),
        (
            "reducescatter",
            Some("parallel.hsdp={ optimizer_level = \"level2\", threshold = 0 }"),
        ),
        (
            "level3-gathers",
            Some(
                "parallel.hsdp={ optimizer_level = \"level3\", threshold = 0 }\n\
                 parallel.overlap.computation_allgather_overlap=true",
            ),
        ),
    ] {
        let dir = Scratch::new(&format!("mpi-overlap-{case}"));
        let common = |name: &str, devices: &str, mode: &str, overlap: bool| -> Vec<String> {
            let mut sets = vec![
                format!("parallel.devices={devices}"),
                format!("parallel.mode=\"{mode}\""),
                "parallel.data_parallel=4".to_string(),
                "parallel.model_parallel=1".to_string(),
                "model.layers=2".to_string(),
                "model.hidden=64".to_string(),
                "model.seq_len=32".to_string(),
                "data.batch_size=8".to_string(),
                "train.max_steps=8".to_string(),
                "train.eval=false".to_string(),
                "output.save_checkpoint=false".to_string(),
            ];
            if overlap {
                sets.extend([
                    "parallel.comm_fusion={ allreduce = { mode = \"size\", config = 1 }, \
                     reducescatter = { mode = \"size\", config = 1 } }"
                        .to_string(),
                    "parallel.overlap.grad_computation_allreduce_overlap=true".to_string(),
                ]);
                sets.extend(extra.into_iter().flat_map(|e| e.lines()).map(String::from));
            }
            train_command("examples/gpt_kjv.toml", &dir.0, name, sets)
        };
        let mut mpi = common("mpi", "4", "semi_auto", true);
        mpi.extend(["--backend".to_string(), "mpi".to_string()]);
        run(&args(&mpi), true);
        run(&args(&common("local", "4", "semi_auto", true)), false);
        run(&args(&common("one", "1", "stand_alone", false)), false);
        assert_mpi_losses(&dir.0, 8, 1e-5);
        let log = std::fs::read_to_string(dir.0.join("mpi.jsonl")).unwrap();
        assert_eq!(
            log.matches("\"memory\"").count(),
            4,
            "{case}: a memory line per rank"
        );
    }
}

/// `train.deterministic = true` under `mpirun -np 4`: the seed MLP with split reduction dims
/// and the GPT (dp 2 × mp 2, vocabulary parallel; also with fused, overlapped gradient buckets
/// and recompute) log one device's losses bit for bit, and every rank's memory line.
#[test]
fn mpi_deterministic_runs_are_bitwise_one_device() {
    let dir = Scratch::new("mpi-det");
    let gpt = |extra: &[&str]| -> Vec<String> {
        let mut sets: Vec<String> = [
            "parallel.data_parallel=2",
            "parallel.model_parallel=2",
            "parallel.vocab_emb_dp=false",
            "model.layers=2",
            "model.hidden=64",
            "model.seq_len=32",
            "data.batch_size=8",
            "train.max_steps=6",
        ]
        .map(String::from)
        .to_vec();
        sets.extend(extra.iter().map(|x| x.to_string()));
        sets
    };
    let configs: [(&str, &str, Vec<String>); 3] = [
        (
            "mlp",
            "examples/seed_semi_auto.toml",
            vec![
                "parallel.shard={ matmul1 = [[2, 2], [2, 1]], matmul2 = [[1, 4], [4, 1]] }".into(),
                "train.max_steps=10".into(),
            ],
        ),
        ("gpt", "examples/gpt_kjv.toml", gpt(&[])),
        (
            // Fused, overlapped (deferred under MPI) gradient buckets, recompute, and level-3
            // weights gathered one ahead (inline under MPI).
            "gpt-memory",
            "examples/gpt_kjv.toml",
            gpt(&[
                "parallel.comm_fusion.openstate=true",
                "parallel.overlap.grad_computation_allreduce_overlap=true",
                "parallel.recompute.cells=[\"blocks.*\"]",
                "parallel.hsdp={ optimizer_level = \"level3\", threshold = 0 }",
                "parallel.overlap.computation_allgather_overlap=true",
            ]),
        ),
    ];
    for (name, example, sets) in configs {
        let command = |run_name: &str, devices: &str, mode: &str| -> Vec<String> {
            let mut all = vec![
                format!("parallel.devices={devices}"),
                format!("parallel.mode=\"{mode}\""),
                "train.deterministic=true".to_string(),
                "train.eval=false".to_string(),
            ];
            all.extend(sets.iter().cloned());
            train_command(example, &dir.0, run_name, all)
        };
        let mut mpi = command(&format!("{name}-mpi"), "4", "semi_auto");
        mpi.extend(["--backend".to_string(), "mpi".to_string()]);
        run(&args(&mpi), true);
        run(
            &args(&command(&format!("{name}-one"), "1", "stand_alone")),
            false,
        );
        // Every rank's memory peaks reach rank 0's log.
        let log = std::fs::read_to_string(dir.0.join(format!("{name}-mpi.jsonl"))).unwrap();
        let memory_lines = log.lines().filter(|l| l.starts_with("{\"memory\"")).count();
        assert_eq!(memory_lines, 4, "{name}: a memory line per rank");
        let mpi = step_losses(&dir.0.join(format!("{name}-mpi.jsonl")));
        let one = step_losses(&dir.0.join(format!("{name}-one.jsonl")));
        assert!(
            !mpi.is_empty() && mpi.len() == one.len(),
            "{name}: {mpi:?} vs {one:?}"
        );
        for (i, (m, o)) in mpi.iter().zip(&one).enumerate() {
            assert_eq!(
                (*m as f32).to_bits(),
                (*o as f32).to_bits(),
                "{name} step {}: mpi {m} vs one device {o}",
                i + 1
            );
        }
    }
}

/// Pipeline stages with micro-batches under `mpirun -np 4`: the GPT on 2 stages × data
/// parallel 2 with 4 micro-batches (1F1B; activations and gradients between stages as MPI
/// messages) logs one device's losses.
#[test]
fn mpi_pipeline_matches_one_device() {
    let dir = Scratch::new("mpi-pipe");
    let command = |name: &str, devices: &str, mode: &str, pipeline: bool| -> Vec<String> {
        let mut sets = vec![
            format!("parallel.devices={devices}"),
            format!("parallel.mode=\"{mode}\""),
            "parallel.model_parallel=1".to_string(),
            "model.layers=2".to_string(),
            "model.hidden=64".to_string(),
            "model.seq_len=32".to_string(),
            "data.batch_size=8".to_string(),
            "train.max_steps=6".to_string(),
            "train.eval=false".to_string(),
        ];
        if pipeline {
            sets.push("parallel.pipeline={ stages = 2, micro_batches = 4 }".to_string());
        }
        train_command("examples/gpt_kjv.toml", &dir.0, name, sets)
    };
    let mut mpi = command("mpi", "4", "semi_auto", true);
    mpi.extend(["--backend".to_string(), "mpi".to_string()]);
    run(&args(&mpi), true);
    run(&args(&command("one", "1", "stand_alone", false)), false);
    let mpi = step_losses(&dir.0.join("mpi.jsonl"));
    let one = step_losses(&dir.0.join("one.jsonl"));
    assert_eq!(mpi.len(), 6);
    assert_eq!(one.len(), 6);
    for (i, (m, o)) in mpi.iter().zip(&one).enumerate() {
        assert!(
            (m - o).abs() <= 1e-4 * o.abs(),
            "step {}: mpi {m} vs one device {o}",
            i + 1
        );
    }
}

/// Asserts that the runs `mpi`, `local` and `one` in `dir` logged `steps` steps, the MPI run's
/// losses within relative `local_tolerance` of the local backend's and 1e-4 of one device's.
fn assert_mpi_losses(dir: &std::path::Path, steps: usize, local_tolerance: f64) {
    let mpi = step_losses(&dir.join("mpi.jsonl"));
    let local = step_losses(&dir.join("local.jsonl"));
    let one = step_losses(&dir.join("one.jsonl"));
    assert_eq!(mpi.len(), steps);
    for (i, ((m, l), o)) in mpi.iter().zip(&local).zip(&one).enumerate() {
        let step = i + 1;
        assert!(
            (m - l).abs() <= local_tolerance * l.abs(),
            "step {step}: mpi {m} vs local {l}"
        );
        assert!(
            (m - o).abs() <= 1e-4 * o.abs(),
            "step {step}: mpi {m} vs one device {o}"
        );
    }
}

/// `tessera train EXAMPLE` with `--set` for each of `sets`, its output in `dir/name` and its
/// metrics log in `dir/name.jsonl`.
pub(crate) fn train_command(
    example: &str,
    dir: &std::path::Path,
    name: &str,
    sets: Vec<String>,
) -> Vec<String> {
    let mut a: Vec<String> = vec!["train".into(), example.into()];
    let output = format!("output.dir=\"{}\"", s(&dir.join(name)));
    for set in sets.into_iter().chain([output]) {
        a.extend(["--set".to_string(), set]);
    }
    a.extend([
        "--log-json".to_string(),
        s(&dir.join(format!("{name}.jsonl"))).to_string(),
    ]);
    a
}

/// `mpirun -np 4 tessera rank-env -- tessera train CONFIG` (no `--backend`) is one collective
/// job on the MPI backend: rank-env sets the contract and `TESSERA_BACKEND=mpi` from mpirun's
/// rank variables, and the losses are the local backend's (1e-6).
#[test]
fn rank_env_under_mpirun_runs_one_collective_job() {
    let dir = Scratch::new("mpi-rank-env");
    let train = |name: &str| -> Vec<String> {
        [
            "train",
            "examples/seed_semi_auto.toml",
            "--devices",
            "4",
            "--set",
            "parallel.shard={ matmul1 = [[2, 2], [2, 1]], matmul2 = [[1, 4], [4, 1]] }",
            "--set",
            "train.max_steps=10",
            "--set",
            "train.eval=false",
            "--set",
            &format!("output.dir=\"{}\"", s(&dir.0.join(name))),
            "--log-json",
            s(&dir.0.join(format!("{name}.jsonl"))),
        ]
        .map(String::from)
        .to_vec()
    };
    let exe = env!("CARGO_BIN_EXE_tessera");
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4", exe])
        .args(["rank-env", "--", exe])
        .args(train("job"))
        .env_remove("TESSERA_BACKEND")
        .current_dir(repo_root())
        .output()
        .expect("running mpirun");
    assert_ok(&out);
    run(&args(&train("local")), false);
    let job = step_losses(&dir.0.join("job.jsonl"));
    let local = step_losses(&dir.0.join("local.jsonl"));
    assert_eq!(job.len(), 10);
    for (i, (j, l)) in job.iter().zip(&local).enumerate() {
        assert!(
            (j - l).abs() <= 1e-6 * l.abs(),
            "step {}: rank-env job {j} vs local {l}",
            i + 1
        );
    }
    // One job saved one set of the four ranks.
    let marker = ckpt::SetMarker::read(&dir.0.join("job"))
        .unwrap()
        .expect("a committed set");
    assert_eq!(marker.ranks, vec![0, 1, 2, 3]);
}

/// A SIGKILLed `mpirun` takes its ranks with it: `tessera rank-env` asked the kernel to end
/// itself with the launcher's process that started it, and its command with itself, so none
/// is left behind.
#[test]
fn ranks_started_by_rank_env_die_with_a_killed_mpirun() {
    let exe = env!("CARGO_BIN_EXE_tessera");
    let mut mpirun = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2", exe])
        .args(["rank-env", "--", "sleep", "600"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("running mpirun");
    let launcher = mpirun.id() as libc::pid_t;
    let is_sleep = |pid: &libc::pid_t| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let ranks = loop {
        // mpirun → rank-env → the rank's command.
        let ranks: Vec<libc::pid_t> = crate::util::children_of(launcher)
            .into_iter()
            .flat_map(crate::util::children_of)
            .filter(is_sleep)
            .collect();
        if ranks.len() == 2 {
            break ranks;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "mpirun never ran both ranks: {ranks:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    mpirun.kill().unwrap();
    let _ = mpirun.wait();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ranks.iter().any(|&pid| crate::util::alive(pid)) {
        if std::time::Instant::now() >= deadline {
            for &pid in &ranks {
                // SAFETY: kill(2) on the test's own orphaned ranks.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            panic!("ranks {ranks:?} outlived the killed mpirun");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
