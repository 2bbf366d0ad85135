//! `tessera train`: the main job end to end, its outputs, and its errors before training.

use std::path::Path;

use crate::util::{assert_ok, s, step_losses, tessera, Scratch};

#[test]
fn the_seed_run_trains_logs_and_saves() {
    let dir = Scratch::new("train-seed");
    let log = dir.0.join("log.jsonl");
    let out_dir = dir.0.join("run");
    let out = tessera(&[
        "train",
        "examples/seed_semi_auto.toml",
        "--set",
        "train.max_steps=6",
        "--set",
        &format!("output.dir=\"{}\"", s(&out_dir)),
        "--log-json",
        s(&log),
    ]);
    assert_ok(&out);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("epoch: 1 step: 6, loss is "), "{stdout}");
    let losses = step_losses(&log);
    assert_eq!(losses.len(), 6);
    assert!(losses[5] < losses[0], "the loss falls: {losses:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("\"eval_accuracy\""),
        "an epoch line with the accuracy"
    );
    for r in 0..8 {
        assert!(out_dir
            .join(format!("rank_{r}/checkpoint_{r}.safetensors"))
            .is_file());
    }
    assert!(out_dir.join("strategy.json").is_file());
    assert!(out_dir.join("strategy.ckpt").is_file());
    // The per-rank checkpoints are complete and consistent with the strategy.
    let verify = tessera(&[
        "ckpt",
        "verify",
        "--src",
        s(&out_dir),
        "--strategy",
        s(&out_dir.join("strategy.ckpt")),
        "--replicas",
    ]);
    assert_ok(&verify);
}

#[test]
fn explain_prints_strategies_and_communication() {
    let out = tessera(&["train", "examples/seed_semi_auto.toml", "--explain"]);
    assert_ok(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("matmul1 (MatMul) strategy ((2, 4), (4, 1)) [user]"),
        "{text}"
    );
    assert!(
        text.contains("matmul3 (MatMul) strategy ((8, 1), (1, 1)) [default]"),
        "{text}"
    );
    assert!(
        text.contains("-> reshard matmul2: reduce-scatter"),
        "{text}"
    );
    assert!(
        text.contains("the gradient of fc1_weight must be laid out like fc1_weight"),
        "{text}"
    );
    assert!(text.contains("B/step"));
}

/// `--explain-rank R` alone prints rank R's program and trains nothing.
#[test]
fn explain_rank_alone_prints_the_rank_program_without_training() {
    let out = tessera(&[
        "train",
        "examples/gpt_kjv.toml",
        "--explain-rank",
        "3",
        "--set",
        "output.dir=\"/nonexistent/never-created\"",
    ]);
    assert_ok(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("rank 3"), "{text}");
    assert!(text.contains("blocks.0.attn.qkv.matmul"), "{text}");
    assert!(!text.contains("trained"), "{text}");
    // A rank the run does not have is refused, naming the flag, before any plan is printed.
    let out = tessera(&["train", "examples/gpt_kjv.toml", "--explain-rank", "100000"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--explain-rank 100000: the run has 8 ranks"),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

fn expect_error(args: &[&str], needle: &str) {
    let mut all = vec!["train", "examples/seed_semi_auto.toml", "--explain"];
    all.extend_from_slice(args);
    let out = tessera(&all);
    assert!(!out.status.success(), "{args:?} should fail");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains(needle),
        "{args:?}: {err:?} should contain {needle:?}"
    );
}

#[test]
fn bad_configs_fail_before_training_with_a_clear_reason() {
    expect_error(&["--set", "train.epoch=3"], "train.epoch");
    expect_error(
        &["--set", "parallel.shard.matmul1=[[3, 1], [1, 1]]"],
        "matmul1 (MatMul)",
    );
    expect_error(&["--devices", "6"], "6");
    expect_error(&["--set", "data.dir=\"no/such/dir\""], "no/such/dir");
    expect_error(
        &["--set", "parallel.shard.matmul7=[[1, 1], [1, 1]]"],
        "matmul7",
    );
}

#[test]
fn a_saved_strategy_file_drives_the_next_run() {
    let dir = Scratch::new("train-strategy-file");
    let first = dir.0.join("first");
    let out = tessera(&[
        "train",
        "examples/seed_semi_auto.toml",
        "--set",
        "train.max_steps=1",
        "--set",
        "train.eval=false",
        "--set",
        "parallel.out_shard.matmul2=[[8, 1]]",
        "--set",
        &format!("output.dir=\"{}\"", s(&first)),
    ]);
    assert_ok(&out);
    // Both strategy files record every forward op's strategy.
    let show = tessera(&[
        "strategy",
        "show",
        "--json",
        s(&first.join("strategy.ckpt")),
    ]);
    assert_ok(&show);
    let show = tessera(&["strategy", "show", s(&first.join("strategy.json"))]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.lines().any(|l| l.contains("matmul2")
            && l.contains("in ((1, 8), (8, 1))")
            && l.contains("out ((8, 1),)")),
        "{text}"
    );
    // A run without [parallel.shard] takes the op strategies from either file; only the
    // Tessera JSON also carries the out_strategy.
    let explain_with = |file: &str| {
        let explain = tessera(&[
            "train",
            "examples/seed_semi_auto.toml",
            "--explain",
            "--set",
            "parallel.shard={}",
            "--set",
            &format!("parallel.strategy_file=\"{}\"", s(&first.join(file))),
        ]);
        assert_ok(&explain);
        String::from_utf8(explain.stdout).unwrap()
    };
    for file in ["strategy.ckpt", "strategy.json"] {
        let text = explain_with(file);
        assert!(
            text.contains("matmul2 (MatMul) strategy ((1, 8), (8, 1)) [user]")
                && text.contains("matmul1 (MatMul) strategy ((2, 4), (4, 1)) [user]"),
            "{file}: {text}"
        );
        assert_eq!(
            text.contains("matmul2's out_strategy"),
            file == "strategy.json",
            "{file}: {text}"
        );
    }
    // A file without op strategies (a MindSpore file saved by a tool that records parameter
    // layouts only) is a clear error.
    let params_only = dir.0.join("params_only.ckpt");
    let (strategy, _) = ckpt::Strategy::load(&first.join("strategy.json"))
        .unwrap()
        .resolve(|_, _| Ok(None))
        .unwrap();
    ckpt::save_param_strategy_file(
        &params_only,
        &strategy,
        &[],
        ckpt::StrategyFlavour::MsProtobuf,
        false,
    )
    .unwrap();
    let bad = tessera(&[
        "train",
        "examples/seed_semi_auto.toml",
        "--explain",
        "--set",
        &format!("parallel.strategy_file=\"{}\"", s(&params_only)),
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("holds no op strategies"));
}

/// The complete events (`"ph": "X"`: spans) of the Chrome trace at `path`.
fn trace_spans(path: &Path) -> Vec<serde_json::Value> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .cloned()
        .collect()
}

/// `--trace`: every rank's timeline of the pipelined steps in Chrome trace-event format, with
/// computing and waiting spans; the summary prints the measured bubble. A run without pipelined
/// micro-batches or ring attention has nothing to trace and says so; ring attention's passes
/// are traced too.
#[test]
fn train_trace_records_every_ranks_pipeline_timeline() {
    let dir = Scratch::new("train-trace");
    let trace = dir.0.join("trace.json");
    let base = |out: &str| -> Vec<String> {
        [
            "train",
            "examples/gpt_kjv.toml",
            "--set",
            "parallel.devices=2",
            "--set",
            "parallel.model_parallel=1",
            "--set",
            "model.layers=2",
            "--set",
            "model.hidden=64",
            "--set",
            "train.max_steps=3",
            "--set",
            "train.eval=false",
            "--set",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            format!("output.dir=\"{}\"", s(&dir.0.join(out))),
            "--trace".to_string(),
            s(&trace).to_string(),
        ])
        .collect()
    };
    let mut piped = base("piped");
    piped.extend(
        [
            "--set",
            "parallel.pipeline={ stages = 2, micro_batches = 4 }",
        ]
        .map(String::from),
    );
    let out = tessera(&piped.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("pipeline bubble (measured"), "{stdout}");
    assert!(
        stdout.contains("pipeline bubble (predicted from this run's pass times per stage)"),
        "{stdout}"
    );
    let spans = trace_spans(&trace);
    for rank in 0..2 {
        // Three steps × four micro-batches × forward and backward, each at least one span.
        let computing = spans
            .iter()
            .filter(|e| e["tid"] == rank && e["cat"] == "compute")
            .count();
        assert!(computing >= 24, "rank {rank}: {computing} compute spans");
        assert!(spans.iter().all(|e| e["dur"].as_f64().unwrap() >= 0.0));
    }
    // Stage 1 waits for stage 0's activations at least once per step.
    assert!(spans.iter().any(|e| e["tid"] == 1 && e["cat"] == "wait"));
    // The runtime's bookkeeping (a micro-batch's buffers, summing its gradients) is its own span.
    assert!(spans
        .iter()
        .any(|e| e["cat"] == "runtime" && e["name"].as_str().unwrap().starts_with("sum ")));
    let plain = tessera(&base("plain").iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!plain.status.success());
    assert!(String::from_utf8_lossy(&plain.stderr)
        .contains("no pipelined steps or ring attention to trace"));

    // Ring attention (context parallel 2): every ring step's passes, attending and waiting.
    let mut ring = base("ring");
    ring.extend(
        [
            "--set",
            "parallel.data_parallel=1",
            "--set",
            "parallel.context_parallel=2",
            "--set",
            "parallel.context_parallel_algo=\"ring\"",
            "--set",
            "model.fused_attention=true",
        ]
        .map(String::from),
    );
    let out = tessera(&ring.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ok(&out);
    // Not a pipeline: no bubble is reported.
    assert!(!String::from_utf8_lossy(&out.stdout).contains("pipeline bubble"));
    let spans = trace_spans(&trace);
    for rank in 0..2 {
        let mine: Vec<&serde_json::Value> = spans.iter().filter(|e| e["tid"] == rank).collect();
        // Three steps × two layers × forward and backward × two passes.
        for pass in 0..2 {
            let attending = mine
                .iter()
                .filter(|e| e["cat"] == "compute")
                .filter(|e| {
                    e["name"]
                        .as_str()
                        .unwrap()
                        .ends_with(&format!(" pass {pass}"))
                })
                .count();
            assert_eq!(attending, 12, "rank {rank}, pass {pass}");
        }
        // Pass 1 needs the other rank's keys: its receive is a wait span.
        assert!(
            mine.iter()
                .any(|e| e["cat"] == "wait" && e["name"].as_str().unwrap().starts_with("wait ")),
            "rank {rank}"
        );
        // One rank's spans follow one another.
        for pair in mine.windows(2) {
            let end = pair[0]["ts"].as_f64().unwrap() + pair[0]["dur"].as_f64().unwrap();
            assert!(pair[1]["ts"].as_f64().unwrap() >= end - 1e-3, "{pair:?}");
        }
    }
}

/// `--timeline FILE.svg`: the schedule as an SVG chart, one labelled block per forward,
/// backward and weight-gradient pass of every micro-batch on every stage.
#[test]
fn train_timeline_draws_the_schedule() {
    let dir = Scratch::new("train-timeline");
    let svg = dir.0.join("schedule.svg");
    let out = tessera(&[
        "train",
        "examples/gpt_kjv.toml",
        "--set",
        "parallel.devices=4",
        "--set",
        "parallel.model_parallel=1",
        "--set",
        "parallel.pipeline={ stages = 4, micro_batches = 8, scheduler = \"zero_bubble\" }",
        "--explain",
        "--timeline",
        s(&svg),
    ]);
    assert_ok(&out);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..100.min(text.len())]);
    assert!(text.contains("predicted bubble 11.1 %"), "ZB-H1: 1 − 24/27");
    for mb in 0..8 {
        for pass in ["F", "B", "W"] {
            // One block per stage for each pass of each micro-batch.
            let label = format!(">\n{pass}{mb}\n<");
            assert_eq!(text.matches(&label).count(), 4, "{pass}{mb}");
        }
    }
    let none = tessera(&[
        "train",
        "examples/gpt_kjv.toml",
        "--explain",
        "--timeline",
        s(&svg),
    ]);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no pipeline to draw"));
}

/// `output.group_info_file` writes every rank's group-info file, which `tessera strategy
/// restore-ranks` reads back: each rank is in its own list, and every rank of a list names the
/// same list (they hold identical copies of each other's parameters).
#[test]
fn group_info_files_read_back_with_restore_ranks() {
    let dir = Scratch::new("train-group-info");
    let out_dir = dir.0.join("run");
    let out = tessera(&[
        "train",
        "examples/seed_semi_auto.toml",
        "--set",
        "train.max_steps=1",
        "--set",
        "train.eval=false",
        "--set",
        "output.save_checkpoint=false",
        "--set",
        "output.group_info_file=\"groups/gi_{rank}.pb\"",
        "--set",
        &format!("output.dir=\"{}\"", s(&out_dir)),
    ]);
    assert_ok(&out);
    let list = |rank: usize| -> Vec<usize> {
        let file = out_dir.join(format!("groups/gi_{rank}.pb"));
        let out = tessera(&["strategy", "restore-ranks", "--json", s(&file)]);
        assert_ok(&out);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    for rank in 0..8 {
        let ranks = list(rank);
        assert!(ranks.contains(&rank), "rank {rank}: {ranks:?}");
        for &other in &ranks {
            assert_eq!(list(other), ranks, "ranks {rank} and {other}");
        }
    }
}

#[test]
fn log_json_in_parameter_server_mode_writes_the_metrics_where_it_says() {
    let dir = Scratch::new("train-ps-log-json");
    let out_dir = dir.0.join("run");
    let log = dir.0.join("logs/ps.jsonl");
    let out = tessera(&[
        "train",
        "examples/seed_parameter_server.toml",
        "--set",
        "train.max_steps=5",
        "--set",
        &format!("output.dir=\"{}\"", s(&out_dir)),
        "--log-json",
        s(&log),
    ]);
    assert_ok(&out);
    // Collective training's schema: one object per step with these keys.
    let text = std::fs::read_to_string(&log).expect("the --log-json file");
    let steps: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
        .collect();
    assert_eq!(steps.len(), 5, "{text}");
    for (i, step) in steps.iter().enumerate() {
        let mut keys: Vec<&str> = step
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["epoch", "loss", "lr", "ms", "step"], "{step}");
        assert_eq!(step["step"], i + 1);
    }
    assert!(
        !out_dir.join("metrics.jsonl").exists(),
        "the metrics go where --log-json says, not to the default"
    );
    // An unwritable --log-json fails before any role starts, naming the file.
    let bad = dir.0.join("a_file");
    std::fs::write(&bad, "").unwrap();
    let out = tessera(&[
        "train",
        "examples/seed_parameter_server.toml",
        "--set",
        &format!("output.dir=\"{}\"", s(&dir.0.join("run2"))),
        "--log-json",
        s(&bad.join("log.jsonl")),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("a_file"), "{stderr}");
    assert!(
        !stderr.contains("parameter-server job on this machine"),
        "nothing started: {stderr}"
    );
}

#[test]
fn parameter_server_mode_starts_every_role_and_trains() {
    let dir = Scratch::new("train-ps");
    let out_dir = dir.0.join("run");
    let out = tessera(&[
        "train",
        "examples/seed_parameter_server.toml",
        "--set",
        "train.max_steps=6",
        "--set",
        &format!("output.dir=\"{}\"", s(&out_dir)),
    ]);
    assert_ok(&out);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("epoch: 1 step: 6, loss is "), "{stdout}");
    assert!(
        stdout.contains("trained 6 steps on 2 worker(s) and 2 server(s)"),
        "{stdout}"
    );
    let losses = step_losses(&out_dir.join("metrics.jsonl"));
    assert_eq!(losses.len(), 6);
    assert!(losses[5] < losses[0], "the loss falls: {losses:?}");
    for server in 0..2 {
        assert!(out_dir
            .join(format!("ps/server_{server}.safetensors"))
            .is_file());
    }
    let refused = tessera(&[
        "train",
        "examples/seed_parameter_server.toml",
        "--devices",
        "4",
    ]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8(refused.stderr).unwrap();
    assert!(
        stderr.contains("parallel.devices: has no meaning in mode \"parameter_server\"")
            && stderr.contains("the value comes from --devices 4"),
        "{stderr}"
    );
}

/// `(epoch, step) → loss` of every step line of a metrics log.
fn losses_by_step(log: &std::path::Path) -> std::collections::BTreeMap<(u64, u64), f64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            Some((
                (v.get("epoch")?.as_u64()?, v.get("step")?.as_u64()?),
                v.get("loss")?.as_f64()?,
            ))
        })
        .collect()
}

/// Every tensor of every rank file of the checkpoint in `dir`, by rank file and name.
fn checkpoint_tensors(dir: &std::path::Path, ranks: usize) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for r in 0..ranks {
        let path = dir.join(format!("rank_{r}/checkpoint_{r}.safetensors"));
        let file = ckpt::CheckpointFile::open(&path).unwrap();
        for t in file.tensors() {
            let values = file.read_tensor(&t.name).unwrap();
            out.push((format!("{r}/{}", t.name), values.as_bytes().to_vec()));
        }
    }
    out.sort();
    out
}

/// A GPT run (with dropout, on 2 devices) killed with SIGKILL at two points, each time resumed
/// with `output.resume_from = "latest"`, ends with the uninterrupted run's losses at every step
/// and its final parameters and optimizer state, bitwise.
#[test]
fn a_run_killed_at_several_points_resumes_bitwise_from_latest() {
    let dir = Scratch::new("train-kill-resume");
    let common = |out: &std::path::Path| -> Vec<String> {
        [
            "parallel.devices=2",
            "parallel.data_parallel=2",
            "parallel.model_parallel=1",
            "model.layers=2",
            "model.dropout=0.1",
            "data.steps_per_epoch=8",
            "train.epochs=3",
            "output.save_checkpoint_steps=3",
            "output.keep_checkpoint_max=2",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("output.dir=\"{}\"", s(out))])
        .collect()
    };
    let args = |out: &std::path::Path, log: &std::path::Path, extra: &[&str]| -> Vec<String> {
        let mut a = vec!["train".to_string(), "examples/gpt_kjv.toml".to_string()];
        for set in common(out)
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
        {
            a.push("--set".to_string());
            a.push(set.to_string());
        }
        a.push("--log-json".to_string());
        a.push(s(log).to_string());
        a
    };
    let reference_dir = dir.0.join("reference");
    let reference_log = dir.0.join("reference.jsonl");
    let a = args(&reference_dir, &reference_log, &[]);
    assert_ok(&tessera(&a.iter().map(String::as_str).collect::<Vec<_>>()));
    let reference = losses_by_step(&reference_log);
    assert_eq!(reference.len(), 24);

    let run = dir.0.join("run");
    let latest = "output.resume_from=\"latest\"";
    // Killed after 5 logged steps, then (resumed) after 7 more; the last resume finishes.
    for (segment, kill_after) in [(0, Some(5)), (1, Some(7)), (2, None)] {
        let log = dir.0.join(format!("segment-{segment}.jsonl"));
        let extra: &[&str] = if segment == 0 { &[] } else { &[latest] };
        let a = args(&run, &log, extra);
        let mut child = crate::util::tessera_command()
            .args(&a)
            .current_dir(crate::util::repo_root())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        match kill_after {
            Some(n) => {
                let start = std::time::Instant::now();
                while losses_by_step(&log).len() < n {
                    assert!(
                        child.try_wait().unwrap().is_none(),
                        "segment {segment} ended early"
                    );
                    assert!(start.elapsed().as_secs() < 600, "segment {segment} hangs");
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
            }
            None => assert_ok(&child.wait_with_output().unwrap()),
        }
        for (step, loss) in losses_by_step(&log) {
            assert_eq!(
                loss.to_bits(),
                reference[&step].to_bits(),
                "segment {segment}, (epoch, step) {step:?}"
            );
        }
    }
    assert_eq!(
        checkpoint_tensors(&run, 2),
        checkpoint_tensors(&reference_dir, 2),
        "the final checkpoints"
    );
}
