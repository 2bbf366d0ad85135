//! `tessera plan` with `parallel.auto_pipeline`: the chosen stages printed, the `pipeline`
//! object of `--json`, and the stages in the operator strategy file.

use crate::util::{assert_ok, repo_root, s, tessera, Scratch};

/// A small GPT on 2 devices whose searched plan is a 2-stage pipeline (see the runtime's
/// `auto_pipeline_plan_trains_like_one_device`).
fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("gpt.toml");
    let text = format!(
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
[parallel]
devices = 2
mode = "dynamic_programming"
auto_pipeline = true
[parallel.pipeline]
stages = 1
micro_batches = 4
[train]
epochs = 1
optimizer = "momentum"
learning_rate = 0.01
momentum = 0.9
[output]
dir = "{out}"
"#,
        data = repo_root().join("data/kjv/kjv.txt.gz").display(),
        out = dir.join("out").display(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `tessera COMMAND… CONFIG --set S…` for each of `sets`.
fn with_sets(command: &[&str], config: &str, sets: &[&str]) -> std::process::Output {
    let mut args = command.to_vec();
    args.push(config);
    for set in sets {
        args.extend(["--set", set]);
    }
    tessera(&args)
}

/// The `error` lines of `out`, a run that must have been refused (`what` says which).
fn refusal(out: &std::process::Output, what: &str) -> String {
    assert!(!out.status.success(), "{what} accepted it");
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("error"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn plan_prints_and_writes_the_searched_pipeline() {
    let dir = Scratch::new("plan-pipeline");
    let cfg = config(&dir.0);
    let out = tessera(&["plan", s(&cfg), "--json"]);
    assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let p = &json["pipeline"];
    assert_eq!(p["stages"], 2, "{p}");
    assert_eq!(p["micro_batches"], 4);
    assert_eq!(p["scheduler"], "1f1b");
    assert_eq!(p["stage_of_layer"]["embedding"], 0);
    assert_eq!(p["stage_of_layer"]["loss"], 1);
    assert_eq!(p["stage_ranks"], serde_json::json!([[0, 1], [1, 2]]));
    // Every stage's layers, as the text lists them: here (no call raised to a later stage) each
    // layer once, on its stage_of_layer.
    let stage_layers = p["stage_layers"].as_array().expect("stage_layers");
    assert_eq!(stage_layers.len(), 2, "{p}");
    assert_eq!(stage_layers[0][0], "embedding", "{p}");
    assert_eq!(stage_layers[1].as_array().unwrap().last().unwrap(), "loss");
    let listed: usize = stage_layers
        .iter()
        .map(|l| l.as_array().unwrap().len())
        .sum();
    assert_eq!(
        listed,
        p["stage_of_layer"].as_object().unwrap().len(),
        "{p}"
    );
    for (stage, layers) in stage_layers.iter().enumerate() {
        for layer in layers.as_array().unwrap() {
            assert_eq!(p["stage_of_layer"][layer.as_str().unwrap()], stage, "{p}");
        }
    }
    let bubble = p["bubble_ms"].as_f64().unwrap();
    assert!(bubble > 0.0 && (json["bubble_ms"].as_f64().unwrap() - bubble).abs() < 1e-9);
    assert!(
        (json["predicted_step_ms"].as_f64().unwrap() - p["makespan_ms"].as_f64().unwrap()).abs()
            < 1e-9
    );
    assert!(json["gap"].is_null(), "no bound is claimed for a pipeline");
    let file = std::fs::read_to_string(json["operator_strategy_file"].as_str().unwrap()).unwrap();
    let file: serde_json::Value = serde_json::from_str(&file).unwrap();
    let items = file["parallel_strategy_item"].as_object().unwrap();
    assert_eq!(items["embedding.gather"]["stage"], 0);
    assert_eq!(items["loss"]["stage"], 1);

    let text = tessera(&["plan", s(&cfg)]);
    assert_ok(&text);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("pipeline: 2 stage(s) × 4 micro-batches (1f1b)"),
        "{text}"
    );
    assert!(text.contains("stage 0: ranks 0-0"), "{text}");
    assert!(text.contains("stage 1: ranks 1-1"), "{text}");
}

/// Item 8 of issue 30: a device count that no dim divides is refused as the run would refuse
/// it, and with a full batch the plan says it splits nothing.
#[test]
fn a_plan_that_splits_nothing_says_so() {
    let search = [
        "plan",
        "examples/gpt_kjv.toml",
        "--devices",
        "5",
        "--set",
        "parallel.mode=dynamic_programming",
        "--set",
        "parallel.model_parallel=1",
        "--set",
        "parallel.data_parallel=1",
    ];
    let out = tessera(&search);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("dataset_strategy") && stderr.contains("not divisible by 5"),
        "{stderr}"
    );
    let mut full_batch = search.to_vec();
    full_batch.extend(["--set", "parallel.dataset_strategy=full_batch", "--json"]);
    let out = tessera(&full_batch);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["splits_nothing"], true, "{json}");
}

/// Item 17: an unknown `--profile` names the built-in profiles, not just a missing file.
#[test]
fn an_unknown_profile_lists_the_built_in_ones() {
    let out = tessera(&[
        "plan",
        "examples/seed_semi_auto.toml",
        "--set",
        "parallel.mode=dynamic_programming",
        "--profile",
        "tpu-v5",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "tpu-v5",
        "h100-nvlink-ib",
        "ascend910b-hccs-roce",
        "neither a built-in profile",
    ] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
}

/// `plan --json`'s pipeline puts the embedding on stage 0 and the loss on stage 1, and its
/// peak memory is its fullest stage's.
#[track_caller]
fn assert_two_stages_peaking_at_the_fullest(json: &serde_json::Value) {
    let p = &json["pipeline"];
    assert_eq!(p["stage_of_layer"]["embedding"], 0, "{p}");
    assert_eq!(p["stage_of_layer"]["loss"], 1, "{p}");
    let fullest = p["stage_memory_bytes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m.as_f64())
        .fold(0.0, f64::max);
    assert_eq!(json["peak_memory_bytes"].as_f64(), Some(fullest));
}

/// A pipelined plan's report names the run's devices, not one stage's: 2 stages of 1 device
/// were printed "on 1 device(s)". Configured stages (without `parallel.auto_pipeline`) are
/// planned stage by stage in a search mode (they were the whole model costed on one stage's
/// devices); in a mode that does not search, its configured strategies are costed stage by
/// stage too (they were the whole model's, with a note saying so), a stage over the memory
/// budget reported, not refused.
#[test]
fn a_pipelined_plan_names_all_its_devices_and_what_it_costed() {
    let dir = Scratch::new("plan-pipeline-devices");
    let cfg = config(&dir.0);
    let out = tessera(&["plan", s(&cfg)]);
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("on 2 device(s) (2 pipeline stages of 1)"),
        "{text}"
    );
    assert!(!text.contains("not planned stage by stage"), "{text}");
    let out = tessera(&["plan", s(&cfg), "--json"]);
    assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&json["devices"], &json["total_devices"], &json["stages"]),
        (
            &serde_json::json!(1),
            &serde_json::json!(2),
            &serde_json::json!(2)
        )
    );
    let configured = [
        "plan",
        s(&cfg),
        "--set",
        "parallel.auto_pipeline=false",
        "--set",
        "parallel.pipeline.stages=2",
    ];
    let out = tessera(&configured);
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("on 2 device(s) (2 pipeline stages of 1)"),
        "{text}"
    );
    assert!(!text.contains("not planned stage by stage"), "{text}");
    assert!(
        text.contains("pipeline: 2 stage(s) × 4 micro-batches (1f1b)")
            && text.contains("the stages as [parallel.pipeline] places them"),
        "{text}"
    );
    let mut json_args = configured.to_vec();
    json_args.push("--json");
    let out = tessera(&json_args);
    assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["pipeline"]["stages"], 2, "{json}");
    assert_two_stages_peaking_at_the_fullest(&json);
    // A mode that does not search costs its configured strategies stage by stage.
    let mut semi_auto = configured.to_vec();
    semi_auto.extend(["--set", "parallel.mode=\"semi_auto\""]);
    let out = tessera(&semi_auto);
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("not planned stage by stage"), "{text}");
    assert!(
        text.contains("strategies as configured (no search)")
            && text.contains("pipeline: 2 stage(s) × 4 micro-batches (1f1b)")
            && !text.contains("more than the"),
        "{text}"
    );
    let mut json_args = semi_auto.clone();
    json_args.push("--json");
    let out = tessera(&json_args);
    assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_two_stages_peaking_at_the_fullest(&json);
    // A stage over the memory budget is reported, not refused.
    let mut tight = semi_auto.clone();
    tight.extend(["--set", "parallel.max_device_memory=1000"]);
    let out = tessera(&tight);
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("note: the fullest pipeline stage needs")
            && text.contains("more than the 1000.00 B of memory per device"),
        "{text}"
    );
}

/// `tessera plan` of a `data_parallel` run with pipeline stages costs every op on its stage's
/// devices: the ops' default strategies split the batch over one stage's devices, as the run
/// places them (they were given every device, and the plan failed: "uses 4 devices, which does
/// not divide the 2 devices"), while `tessera train` ran.
#[test]
fn a_data_parallel_pipeline_is_planned_on_each_stages_devices() {
    let out = tessera(&[
        "plan",
        "examples/gpt_kjv.toml",
        "--devices",
        "4",
        "--set",
        "parallel.mode=\"data_parallel\"",
        "--set",
        "parallel.pipeline.stages=2",
        "--set",
        "parallel.pipeline.micro_batches=2",
        "--json",
    ]);
    assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["devices"], serde_json::json!(2), "{json}");
    assert_eq!(json["stages"], serde_json::json!(2), "{json}");
    let ops = json["ops"].as_array().expect("ops");
    assert!(!ops.is_empty());
    let mut widest = 0;
    for op in ops {
        for input in op["in_strategy"].as_array().expect("in_strategy") {
            let devices: u64 = input
                .as_array()
                .expect("factors")
                .iter()
                .map(|f| f.as_u64().expect("a factor"))
                .product();
            assert!(
                devices <= 2,
                "{op}: splits over more than a stage's devices"
            );
            widest = widest.max(devices);
        }
    }
    assert_eq!(widest, 2, "the batch is split over a stage's 2 devices");
}

/// `tessera train --explain --json`'s predicted memory (`memory`: per category, `peak`) of
/// every rank, for the configuration and sets `args`.
fn explained_memory(args: &[&str]) -> Vec<serde_json::Value> {
    let mut explain = vec!["train"];
    explain.extend(args);
    explain.extend(["--explain", "--json"]);
    let out = tessera(&explain);
    assert_ok(&out);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let rank: serde_json::Value = serde_json::from_str(line).expect("one JSON per rank");
            rank["memory"].clone()
        })
        .collect()
}

/// `tessera plan`'s memory per device is the peak `tessera train --explain` predicts for the
/// same configuration (`args`: the file and its sets), exactly: the fullest rank's peak and
/// categories, each pipeline stage's fullest rank's peak; and the text names that peak's rank.
/// Returns the plan's JSON.
#[track_caller]
fn assert_plan_memory_is_the_prediction(args: &[&str]) -> serde_json::Value {
    let mut plan = vec!["plan"];
    plan.extend(args);
    plan.push("--json");
    let out = tessera(&plan);
    assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let ranks = explained_memory(args);
    let peak = |m: &serde_json::Value| m["peak"].as_u64().expect("a peak");
    let fullest = ranks.iter().map(peak).max().expect("ranks");
    assert_eq!(
        json["peak_memory_bytes"].as_f64(),
        Some(fullest as f64),
        "{args:?}: the plan's peak against the predicted {fullest}"
    );
    assert_eq!(json["memory_predicted"], true, "{json}");
    let rank = json["memory_rank"].as_u64().expect("memory_rank") as usize;
    assert_eq!(peak(&ranks[rank]), fullest, "{args:?}");
    for category in [
        "parameters",
        "gradients",
        "optimizer",
        "activations",
        "communication",
    ] {
        assert_eq!(
            json["memory"][category], ranks[rank][category],
            "{args:?}: {category}"
        );
    }
    if let Some(stages) = json["pipeline"]["stage_ranks"].as_array() {
        for (stage, range) in stages.iter().enumerate() {
            let (first, end) = (range[0].as_u64().unwrap(), range[1].as_u64().unwrap());
            let stage_peak = (first..end).map(|r| peak(&ranks[r as usize])).max();
            assert_eq!(
                json["pipeline"]["stage_memory_bytes"][stage].as_f64(),
                stage_peak.map(|p| p as f64),
                "{args:?}: stage {stage}"
            );
        }
    }
    plan.pop();
    let text = tessera(&plan);
    assert_ok(&text);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("on rank {rank}, the fullest (predicted as")),
        "{text}"
    );
    json
}

/// The plan's memory was the search's estimate (every held value counted at once, the
/// pipeline's micro-batches in flight and the backward's other values not at all): for the
/// example GPT on 2 stages 8.26 MiB against the 23.26 MiB `--explain` predicts. It is now the
/// prediction, for configured and searched plans, with and without stages, recompute and hsdp.
#[test]
fn the_plans_memory_is_the_predicted_peak() {
    let dir = Scratch::new("plan-memory-predicted");
    let cfg = config(&dir.0);
    let gpt = |sets: &[&'static str]| {
        let mut args = vec![s(&cfg).to_string()];
        for set in sets {
            args.extend(["--set".to_string(), set.to_string()]);
        }
        args
    };
    let configured = [
        "parallel.auto_pipeline=false",
        "parallel.mode=\"semi_auto\"",
    ];
    let two_stages = "parallel.pipeline.stages=2";
    let recompute = "parallel.recompute.cells=[\"blocks.*\"]";
    let out_dir = format!("output.dir=\"{}\"", dir.0.join("seed").display());
    let seed = |example: &str| vec![example.to_string(), "--set".to_string(), out_dir.clone()];
    let runs = [
        // The searched pipeline (`parallel.auto_pipeline`).
        gpt(&[]),
        // Configured stages, configured strategies; with recompute.
        gpt(&[configured[0], configured[1], two_stages]),
        gpt(&[configured[0], configured[1], two_stages, recompute]),
        // Configured stages, searched strategies.
        gpt(&[configured[0], two_stages]),
        // No stages: recompute, hsdp, a search.
        gpt(&[configured[0], configured[1], recompute]),
        gpt(&[
            configured[0],
            "parallel.mode=\"data_parallel\"",
            "parallel.hsdp.optimizer_level=\"level2\"",
        ]),
        gpt(&[configured[0]]),
        // Data and model parallel on 8 devices, and plain data parallel.
        seed("examples/seed_semi_auto.toml"),
        seed("examples/seed_data_parallel.toml"),
        // The example GPT (dp 4 × mp 2), and on 2 stages of dp 2 × mp 2.
        seed("examples/gpt_kjv.toml"),
        [
            seed("examples/gpt_kjv.toml"),
            vec![
                "--set".to_string(),
                "parallel.data_parallel=2".to_string(),
                "--set".to_string(),
                "parallel.pipeline.stages=2".to_string(),
                "--set".to_string(),
                "parallel.pipeline.micro_batches=4".to_string(),
            ],
        ]
        .concat(),
    ];
    for run in &runs {
        let args: Vec<&str> = run.iter().map(String::as_str).collect();
        let json = assert_plan_memory_is_the_prediction(&args);
        assert!(json["search_memory_estimate"]["total"].as_f64().unwrap() > 0.0);
    }
}

/// A searched plan whose predicted peak exceeds `parallel.max_device_memory` is refused even
/// when the search's estimate fits it (it was accepted: the run did not fit the budget the plan
/// said it did), naming the key and the bytes needed, and no operator strategy file is written.
#[test]
fn a_searched_plan_over_the_budget_by_its_prediction_is_refused() {
    let dir = Scratch::new("plan-memory-budget");
    let cfg = config(&dir.0);
    // One device per stage: the plan is the same under any budget it fits.
    let args = [
        "plan",
        s(&cfg),
        "--set",
        "parallel.auto_pipeline=false",
        "--set",
        "parallel.pipeline.stages=2",
    ];
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = tessera(&json_args);
    assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let estimate = json["search_memory_estimate"]["total"].as_f64().unwrap() as u64;
    let peak = json["peak_memory_bytes"].as_f64().unwrap() as u64;
    assert!(estimate < peak, "{json}");
    let file = std::path::PathBuf::from(json["operator_strategy_file"].as_str().unwrap());
    std::fs::remove_file(&file).unwrap();
    // A budget between the two is refused.
    let between = format!("parallel.max_device_memory={}", (estimate + peak) / 2);
    let mut tight = args.to_vec();
    tight.extend(["--set", &between]);
    let out = tessera(&tight);
    assert!(!out.status.success(), "a plan over its budget was accepted");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("parallel.max_device_memory")
            && stderr.contains(&format!("needs {peak} bytes"))
            && stderr.contains(&format!("at least {peak} bytes")),
        "{stderr}"
    );
    assert!(!file.exists(), "a refused plan wrote {}", file.display());
    // The peak itself fits.
    let fits = format!("parallel.max_device_memory={peak}");
    let mut exact = args.to_vec();
    exact.extend(["--set", &fits]);
    assert_ok(&tessera(&exact));
    assert!(file.exists());
}

/// A plan whose run `tessera train --explain` does not predict (parameter server: the ps
/// crate's programs) prints the search's estimate and says so, with the reason.
#[test]
fn a_plan_without_a_prediction_says_its_memory_is_the_estimate() {
    let dir = Scratch::new("plan-memory-estimate");
    let out_dir = format!("output.dir=\"{}\"", dir.0.display());
    let args = [
        "plan",
        "examples/seed_parameter_server.toml",
        "--set",
        &out_dir,
    ];
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = tessera(&json_args);
    assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["memory_predicted"], false, "{json}");
    assert!(
        json["memory_not_predicted"]
            .as_str()
            .is_some_and(|why| why.contains("parameter_server")),
        "{json}"
    );
    assert_eq!(
        json["peak_memory_bytes"],
        json["search_memory_estimate"]["total"]
    );
    let out = tessera(&args);
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("memory per device (the search's estimate, not the run's predicted peak: parallel.mode = \"parameter_server\""),
        "{text}"
    );
}

/// `--estimate-memory` skips compiling the run: the plan prints the search's estimate, saying
/// so; without it the same plan prints the (here higher) predicted peak.
#[test]
fn estimate_memory_prints_the_searchs_estimate() {
    let dir = Scratch::new("plan-memory-estimate-flag");
    let cfg = config(&dir.0);
    let args = [
        "plan",
        s(&cfg),
        "--set",
        "parallel.auto_pipeline=false",
        "--set",
        "parallel.pipeline.stages=2",
        "--json",
    ];
    let predicted = tessera(&args);
    assert_ok(&predicted);
    let predicted: serde_json::Value = serde_json::from_slice(&predicted.stdout).unwrap();
    let mut estimate_args = args.to_vec();
    estimate_args.push("--estimate-memory");
    let out = tessera(&estimate_args);
    assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["memory_predicted"], false, "{json}");
    assert!(json["memory_not_predicted"]
        .as_str()
        .is_some_and(|why| why.contains("--estimate-memory")));
    let estimate = &json["search_memory_estimate"]["total"];
    assert_eq!(&json["peak_memory_bytes"], estimate);
    assert_eq!(estimate, &predicted["search_memory_estimate"]["total"]);
    assert!(
        predicted["peak_memory_bytes"].as_f64().unwrap() > estimate.as_f64().unwrap(),
        "{predicted}"
    );
}

/// `tessera plan` of a `[parallel.shard]` strategy wider than a pipeline stage said "…does
/// not divide the 4 devices", without the stage or the key; it now says what `tessera train`
/// says, word for word, in a mode that does not search and in a search mode (whose run plans
/// first).
#[test]
fn a_strategy_wider_than_a_stage_is_refused_by_plan_as_by_train() {
    for mode in ["semi_auto", "dynamic_programming"] {
        let dir = Scratch::new(&format!("plan-stage-error-{mode}"));
        let out_dir = format!("output.dir=\"{}\"", dir.0.display());
        let mode = format!("parallel.mode=\"{mode}\"");
        let sets = [
            mode.as_str(),
            out_dir.as_str(),
            "parallel.pipeline.stages=2",
            "parallel.pipeline.micro_batches=2",
            "parallel.data_parallel=2",
            r#"parallel.shard."blocks.*.mlp.fc1"=[[8,1,1],[1,1]]"#,
        ];
        let run = |command: &[&str]| {
            let out = with_sets(command, "examples/gpt_kjv.toml", &sets);
            refusal(&out, &format!("{command:?} {mode}"))
        };
        let plan = run(&["plan"]);
        assert!(
            plan.contains(
                "the 4 devices of pipeline stage 0 (parallel.devices 8 / parallel.pipeline.stages 2)"
            ) && plan.contains(r#"the strategy comes from parallel.shard."blocks.*.mlp.fc1""#),
            "{mode}: {plan}"
        );
        assert_eq!(plan, run(&["train", "--explain"]), "{mode}");
    }
}

/// `tessera plan` prints the warnings of the run's compiled program
/// (`TrainSession::warnings`: here `parallel.hsdp.shard_size` capped to a weight's replicas)
/// beside the configuration's, as `tessera train` does; it printed only the configuration's.
#[test]
fn plan_prints_the_compiled_programs_warnings_as_train_does() {
    let dir = Scratch::new("plan-session-warnings");
    let out_dir = format!("output.dir=\"{}\"", dir.0.display());
    let sets = [
        out_dir.as_str(),
        "parallel.hsdp.shard_size=4",
        "parallel.hsdp.threshold=0",
        r#"parallel.shard."blocks.*.mlp.fc1"=[[2,1,1],[4,1]]"#,
    ];
    let warnings = |command: &[&str]| {
        let out = with_sets(command, "examples/gpt_kjv.toml", &sets);
        assert_ok(&out);
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.starts_with("warning:") && l.contains("parallel.hsdp.shard_size"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let plan = warnings(&["plan"]);
    assert_eq!(plan.len(), 1, "{plan:?}");
    assert!(
        plan[0].contains("parallel.hsdp.shard_size = 4 is capped to 2"),
        "{plan:?}"
    );
    assert_eq!(plan, warnings(&["train", "--explain"]));
}

/// `tessera train` in a search mode accepted a searched plan whose predicted peak exceeds the
/// `parallel.max_device_memory` the user set (only `tessera plan` refused it). It is refused
/// before any rank starts, in `plan`'s words, and writes nothing (no output directory, no
/// operator strategy file); a budget at the peak trains; strategies loaded from a file are
/// not refused.
#[test]
fn train_refuses_a_searched_plan_over_the_budget_as_plan_does() {
    let dir = Scratch::new("train-memory-budget");
    let cfg = config(&dir.0);
    let common = [
        "--set",
        "parallel.auto_pipeline=false",
        "--set",
        "parallel.pipeline.stages=2",
    ];
    let mut json_args = vec!["plan", s(&cfg)];
    json_args.extend(common);
    json_args.push("--json");
    let out = tessera(&json_args);
    assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let estimate = json["search_memory_estimate"]["total"].as_f64().unwrap() as u64;
    let peak = json["peak_memory_bytes"].as_f64().unwrap() as u64;
    assert!(estimate < peak, "{json}");
    let planned = std::path::PathBuf::from(json["operator_strategy_file"].as_str().unwrap());
    let run_dir = dir.0.join("run");
    let saved = dir.0.join("saved").join("ops.json");
    let run_sets = [
        format!("output.dir=\"{}\"", run_dir.display()),
        format!(
            "parallel.save_operator_strategy_file=\"{}\"",
            saved.display()
        ),
        "data.steps_per_epoch=2".to_string(),
        "train.eval=false".to_string(),
    ];
    let command = |verb: &str, budget: u64, extra: &[String]| {
        let mut args = vec![verb.to_string(), s(&cfg).to_string()];
        args.extend(common.iter().map(|a| a.to_string()));
        for set in run_sets.iter().chain(extra) {
            args.extend(["--set".to_string(), set.clone()]);
        }
        args.extend([
            "--set".to_string(),
            format!("parallel.max_device_memory={budget}"),
        ]);
        args
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        tessera(&args)
    };
    let error_line = |out: &std::process::Output| {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .find(|l| l.starts_with("error"))
            .unwrap_or_default()
            .to_string()
    };
    let between = (estimate + peak) / 2;
    let refused = run(command("train", between, &[]));
    assert!(!refused.status.success(), "a run over its budget trained");
    let err = error_line(&refused);
    assert!(
        err.contains("parallel.max_device_memory")
            && err.contains(&format!("needs {peak} bytes"))
            && err.contains(&format!("on rank {}", json["memory_rank"]))
            && err.contains(&format!("more than the {between} bytes")),
        "{err}"
    );
    assert!(
        !run_dir.exists(),
        "a refused run created {}",
        run_dir.display()
    );
    assert!(!saved.exists(), "a refused run wrote {}", saved.display());
    // `tessera plan` refuses the same plan in the same words.
    let plan = run(command("plan", between, &[]));
    assert!(!plan.status.success());
    assert_eq!(error_line(&plan), err);
    // Strategies loaded from a file (the plan's) are not refused: only costed.
    let loaded = format!(
        "parallel.load_operator_strategy_file=\"{}\"",
        planned.display()
    );
    assert_ok(&run(command(
        "train",
        between,
        &[loaded, "train.max_steps=1".to_string()],
    )));
    std::fs::remove_dir_all(&run_dir).unwrap();
    std::fs::remove_file(&saved).unwrap();
    // The peak itself fits: the run trains and saves its strategies.
    assert_ok(&run(command("train", peak, &[])));
    assert!(saved.is_file(), "the run saved no strategies");
}

/// `tessera plan` printed a plan (exit 0, an operator strategy file written) for
/// configurations `tessera train` refuses when it builds the run — a recompute glob matching
/// no cell, mixed precision for the seed MLP, a `manual_split` naming no embedding — with the
/// refusal only inside its memory line ("the run cannot be built: …"). It now refuses them
/// with `tessera train`'s error and writes nothing.
#[test]
fn a_run_train_refuses_to_build_is_refused_by_plan() {
    let cases: [(&str, &[&str], &str); 4] = [
        (
            "examples/seed_semi_auto.toml",
            &[r#"parallel.recompute.cells=["*"]"#],
            "recompute.cells",
        ),
        (
            "examples/seed_data_parallel.toml",
            &[r#"train.precision="bf16""#],
            "train.precision",
        ),
        (
            "examples/seed_semi_auto.toml",
            &["parallel.manual_split.matmul1=[1]"],
            "manual_split",
        ),
        // In a search mode (the plan is then the session's own).
        (
            "examples/seed_data_parallel.toml",
            &[
                r#"parallel.mode="recursive_programming""#,
                r#"train.precision="f16""#,
            ],
            "train.precision",
        ),
    ];
    for (example, sets, words) in cases {
        let dir = Scratch::new("plan-refuses-unbuildable-run");
        let out_dir = format!("output.dir=\"{}\"", dir.0.join("out").display());
        let run = |command: &[&str]| {
            let mut all = vec![out_dir.as_str()];
            all.extend(sets.iter().copied());
            refusal(
                &with_sets(command, example, &all),
                &format!("{command:?} {sets:?}"),
            )
        };
        let plan = run(&["plan", "--json"]);
        assert!(plan.contains(words), "{sets:?}: {plan}");
        assert_eq!(plan, run(&["train", "--explain"]), "{sets:?}");
        assert!(
            !dir.0.join("out").exists(),
            "{sets:?}: a refused plan wrote into its output directory"
        );
    }
}

/// `tessera plan`'s predicted step was one micro-step's: `train.grad_accumulation_steps = 4`
/// printed the step time of 1, and a batch cut by `parallel.micro_batch_interleave` or
/// `parallel.pipeline.micro_batches` (without stages) the time of one part. It is the
/// optimizer step's: every micro-step's compute and communication (each runs the whole
/// program, its gradient reductions included).
#[test]
fn the_predicted_step_counts_every_micro_step() {
    let dir = Scratch::new("plan-step-micro-steps");
    let out_dir = format!("output.dir=\"{}\"", dir.0.display());
    let plan = |sets: &[&str]| {
        let mut all = vec![out_dir.as_str(), "data.batch_size=32"];
        all.extend(sets.iter().copied());
        let out = with_sets(&["plan", "--json"], "examples/gpt_kjv.toml", &all);
        assert_ok(&out);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let f = |key: &str| json[key].as_f64().expect(key);
        (
            f("predicted_step_ms"),
            f("compute_ms"),
            f("comm_ms"),
            f("comm_bytes_per_step"),
        )
    };
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
    for mode in [
        "parallel.mode=\"semi_auto\"",
        "parallel.mode=\"dynamic_programming\"",
    ] {
        let one = plan(&[mode]);
        let four = plan(&[mode, "train.grad_accumulation_steps=4"]);
        assert!(
            close(four.0, 4.0 * one.0)
                && close(four.1, 4.0 * one.1)
                && close(four.2, 4.0 * one.2)
                && close(four.3, 4.0 * one.3),
            "{mode}: 4 micro-steps {four:?}, 1 {one:?}"
        );
        // A cut batch computes the whole batch per step: its parts' compute adds up to about
        // the uncut step's (a search may choose other strategies for the smaller parts; one
        // part's is a half or a quarter of it), and it reduces the gradients once a part.
        for cut in [
            &["parallel.micro_batch_interleave=2"][..],
            &[
                "parallel.pipeline.stages=1",
                "parallel.pipeline.micro_batches=4",
            ],
        ] {
            let parts = plan(&[&[mode][..], cut].concat());
            assert!(
                parts.1 > 0.75 * one.1 && parts.1 < 1.33 * one.1,
                "{mode} {cut:?}: compute {} against the uncut step's {}",
                parts.1,
                one.1
            );
            assert!(parts.2 > one.2, "{mode} {cut:?}: {parts:?} against {one:?}");
        }
    }
}

/// The searches rank strategies by an estimate that misses what the compiled step adds, so
/// under a `parallel.max_device_memory` just below the unconstrained plan's predicted peak the
/// plan found first does not fit; another plan may. The run searches again within a tighter
/// budget of the search's own estimate (scaled by how far the prediction was over) before it
/// refuses: below the example GPT's peak, some budget is now met (it was refused whatever the
/// budget), every plan printed fits its budget, `tessera train --explain` accepts the same, and
/// every budget refused is refused naming the key.
#[test]
fn a_budget_the_first_plan_misses_is_searched_again() {
    let dir = Scratch::new("plan-re-search");
    let out_dir = format!("output.dir=\"{}\"", dir.0.join("out").display());
    let example = repo_root().join("examples/gpt_kjv.toml");
    let plan = |verb: &[&str], budget: Option<u64>| {
        let budget = budget.map(|b| format!("parallel.max_device_memory={b}"));
        let mut sets = vec![out_dir.as_str(), "parallel.mode=\"dynamic_programming\""];
        sets.extend(budget.as_deref());
        with_sets(verb, s(&example), &sets)
    };
    let free = plan(&["plan", "--json"], None);
    assert_ok(&free);
    let json: serde_json::Value = serde_json::from_slice(&free.stdout).unwrap();
    let first_peak = json["peak_memory_bytes"].as_f64().unwrap() as u64;
    let mut met = Vec::new();
    for percent in [99, 97, 95, 93, 91] {
        let budget = first_peak * percent / 100;
        let out = plan(&["plan", "--json"], Some(budget));
        if out.status.success() {
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let peak = json["peak_memory_bytes"].as_f64().unwrap() as u64;
            assert!(
                peak <= budget,
                "{percent} %: a plan of {peak} bytes within {budget}"
            );
            assert_eq!(json["memory_budget_bytes"].as_f64().unwrap() as u64, budget);
            assert_ok(&plan(&["train", "--explain"], Some(budget)));
            met.push(percent);
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("parallel.max_device_memory") && err.contains(&format!("{budget}")),
                "{percent} %: {err}"
            );
        }
    }
    assert!(
        !met.is_empty(),
        "no budget below {first_peak} bytes was met"
    );
}

/// A device profile figure outside its plausible range is refused, by `--profile` and by
/// `parallel.device_profile`, naming the file, the key and the bound, before anything is
/// written. Before, `flops_per_s = 1e-300` was accepted: every op cost infinity, the search
/// chose among the ties and printed `predicted step: NaN ms = compute inf + …`.
#[test]
fn a_profile_figure_out_of_range_is_refused_naming_the_file_and_the_key() {
    let dir = Scratch::new("plan-hostile-profile");
    let cfg = config(&dir.0);
    let profile = |name: &str, from: &str, to: &str| {
        let text = "name = \"hostile\"\nmemory_bandwidth = 1e12\nmemory_bytes = 80000000000\n\
                    devices_per_node = 8\n[[matmul]]\nmin_flops = 0.0\nflops_per_s = 1e14\n\
                    [intra_node]\nalpha = 3e-6\nbandwidth = 3.6e11\n\
                    [inter_node]\nalpha = 6e-6\nbandwidth = 4e10\n";
        assert!(text.contains(from), "{from}");
        let path = dir.0.join(name);
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        path
    };
    let cases = [
        (
            profile("flops.toml", "flops_per_s = 1e14", "flops_per_s = 1e-300"),
            "(matmul[0].flops_per_s): 1e-300 is outside the plausible range 1000 to 1e21 FLOP/s",
        ),
        (
            profile("alpha.toml", "alpha = 3e-6", "alpha = 1e300"),
            "(intra_node.alpha): 1e300 is outside the plausible range 0 to 1 seconds",
        ),
        (
            profile(
                "memory.toml",
                "memory_bandwidth = 1e12",
                "memory_bandwidth = 1e-300",
            ),
            "(memory_bandwidth): 1e-300 is outside the plausible range 1000 to 1e18 bytes/s",
        ),
    ];
    for (path, rule) in &cases {
        let by_flag = tessera(&["plan", s(&cfg), "--profile", s(path)]);
        let set = format!("parallel.device_profile={:?}", s(path));
        let by_key = with_sets(&["plan"], s(&cfg), &[&set]);
        for (out, how) in [(by_flag, "--profile"), (by_key, "parallel.device_profile")] {
            let err = refusal(&out, how);
            assert!(err.contains(s(path)) && err.contains(rule), "{how}: {err}");
            assert!(!String::from_utf8_lossy(&out.stdout).contains("NaN"));
            assert!(
                !dir.0.join("out/operator_strategy.json").exists(),
                "{how}: nothing is written"
            );
        }
    }
}
