//! Hostile input (issue 13, "nothing blown up"): absurd flags, configs and crafted strategy files.
//! Each must end in a clear error — a non-zero exit, a message naming the flag, key or file and
//! the rule broken — and never in a panic, an allocation abort or files left behind.

use std::path::Path;
use std::process::{Command, Output};

use crate::util::{repo_root, s, Scratch};

/// Runs `tessera` with extra environment variables.
fn tessera_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.args(args).current_dir(repo_root());
    for (key, value) in env {
        cmd.env(key, value);
    }
    cmd.output().expect("running tessera")
}

/// Asserts a clean refusal: exit code 1 (not a signal, not a panic's 101), no "panicked" on
/// stderr, and a message containing every fragment of `expected`.
#[track_caller]
fn assert_refused(out: &Output, expected: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a clean failure, got {}:\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("memory allocation"), "{stderr}");
    for fragment in expected {
        assert!(
            stderr.contains(fragment),
            "missing {fragment:?} in:\n{stderr}"
        );
    }
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `tessera train examples/seed_semi_auto.toml --explain`-free training args writing into
/// `out_dir`, plus `extra`.
fn train(out_dir: &Path, extra: &[&str]) -> Output {
    let out_set = format!("output.dir={:?}", s(out_dir));
    let mut args = vec![
        "train",
        "examples/seed_semi_auto.toml",
        "--set",
        &out_set,
        "--set",
        "train.max_steps=1",
    ];
    args.extend_from_slice(extra);
    tessera_env(&args, &[])
}

#[test]
fn huge_device_counts_are_refused_before_anything_is_allocated() {
    let scratch = Scratch::new("hostile-devices");
    let out_dir = scratch.0.join("run");
    for devices in ["4294967296", "18446744073709551615", "1048577"] {
        let out = train(&out_dir, &["--devices", devices]);
        assert_refused(
            &out,
            &[
                "--devices",
                &format!("{devices} devices is above the limit of 1048576 ranks"),
                "TESSERA_MAX_RANKS",
            ],
        );
    }
    // Too large for a device count at all: clap's own error, no panic.
    let out = train(&out_dir, &["--devices", "99999999999999999999999"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    // The same bound through the config key.
    let out = train(&out_dir, &["--set", "parallel.devices=4294967296"]);
    assert_refused(
        &out,
        &["parallel.devices", "above the limit of 1048576 ranks"],
    );
    assert!(
        !out_dir.exists(),
        "a refused run left {}",
        out_dir.display()
    );
}

#[test]
fn the_rank_ceiling_is_set_by_the_environment() {
    let args = ["layout", "--mesh", "dp=8", "--map", "dp", "--shape", "8"];
    let out = tessera_env(&args, &[("TESSERA_MAX_RANKS", "4")]);
    assert_refused(&out, &["has 8 ranks, above the limit of 4 ranks per mesh"]);
    let out = tessera_env(&args, &[("TESSERA_MAX_RANKS", "8")]);
    assert!(out.status.success());
    let out = tessera_env(&args, &[("TESSERA_MAX_RANKS", "lots")]);
    assert_refused(
        &out,
        &["TESSERA_MAX_RANKS = \"lots\" is not a positive integer"],
    );
    // Raised above the default, a 2^20 + 1 device mesh is accepted.
    let big = [
        "layout",
        "--mesh",
        "dp=1048577",
        "--map",
        "None",
        "--shape",
        "1",
        "--json",
    ];
    let out = tessera_env(&big, &[]);
    assert_refused(&out, &["has 1048577 ranks, above the limit of 1048576"]);
    let out = tessera_env(&big, &[("TESSERA_MAX_RANKS", "2000000")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_batch_larger_than_the_data_is_refused() {
    let scratch = Scratch::new("hostile-batch");
    let out_dir = scratch.0.join("run");
    for extra in [&[][..], &["--explain"][..]] {
        let mut args = vec!["--set", "data.batch_size=100000000"];
        args.extend_from_slice(extra);
        let out = train(&out_dir, &args);
        assert_refused(
            &out,
            &[
                "data.batch_size",
                "100000000 is larger than the training set (1500 samples",
            ],
        );
    }
    assert!(
        !out_dir.exists(),
        "a refused run left {}",
        out_dir.display()
    );
}

/// Probe E8: more pipeline stages than devices (each stage would get no rank) is one clear
/// error for every model, naming `parallel.pipeline.stages` and `parallel.devices`, in `train`,
/// `train --explain` and `plan`, before anything is built; the GPT used to divide by zero.
#[test]
fn more_pipeline_stages_than_devices_are_refused_for_every_model() {
    let scratch = Scratch::new("hostile-stages");
    let out_dir = scratch.0.join("run");
    let out_set = format!("output.dir={:?}", s(&out_dir));
    // The GPT with model parallel 1 divided by zero; with its example's 2 it blamed
    // `parallel.data_parallel` for "the 0 devices".
    let cases: [(&str, &[&str]); 3] = [
        (
            "examples/gpt_kjv.toml",
            &["--set", "parallel.model_parallel=1"],
        ),
        ("examples/gpt_kjv.toml", &[]),
        ("examples/seed_semi_auto.toml", &[]),
    ];
    for (config, extra) in cases {
        for command in [&["train"][..], &["train", "--explain"], &["plan"]] {
            let mut args = command.to_vec();
            args.extend([config, "--devices", "2", "--set", &out_set]);
            args.extend(["--set", "parallel.pipeline.stages=3"]);
            args.extend_from_slice(extra);
            let out = tessera_env(&args, &[]);
            assert_refused(
                &out,
                &[
                    "parallel.pipeline.stages = 3: must divide the device count 2",
                    "parallel.devices",
                ],
            );
        }
    }
    assert!(
        !out_dir.exists(),
        "a refused run left {}",
        out_dir.display()
    );
}

#[test]
fn absurd_layouts_are_refused() {
    let axes: Vec<String> = (0..12_000).map(|i| format!("a{i}=1")).collect();
    let mesh = axes.join(",");
    let out = tessera_env(
        &["layout", "--mesh", &mesh, "--map", "a0", "--shape", "8"],
        &[],
    );
    assert_refused(
        &out,
        &["a device matrix of 12000 axes is above the limit of 64 axes"],
    );
    for (mesh, map, shape, expected) in [
        (
            "dp=1000000,mp=1000000",
            "dp,mp",
            "1000000,1000000",
            "has 1000000000000 ranks",
        ),
        (
            "dp=4294967296,mp=4294967296",
            "dp,mp",
            "8,8",
            "(the product overflows)",
        ),
        (
            "dp=2",
            "dp,None,None",
            "1099511627776,1099511627776,1099511627776",
            "has more elements than fit in memory addressing",
        ),
    ] {
        let out = tessera_env(
            &["layout", "--mesh", mesh, "--map", map, "--shape", shape],
            &[],
        );
        assert_refused(&out, &[expected]);
    }
    let out = tessera_env(
        &[
            "layout",
            "--mesh",
            "dp=2",
            "--map",
            "dp",
            "--shape",
            "8",
            "--rank-list",
            "0,18446744073709551615",
        ],
        &[],
    );
    assert_refused(
        &out,
        &["rank 18446744073709551615 in rank_list is above the limit"],
    );
    // A 65536-character axis name once overflowed the text formatter's width.
    let long = format!("{}=2", "x".repeat(70_000));
    let map = "x".repeat(70_000);
    let out = tessera_env(
        &["layout", "--mesh", &long, "--map", &map, "--shape", "2"],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn reshard_run_is_bounded_before_allocating() {
    let out = tessera_env(
        &[
            "reshard",
            "--shape",
            "1000000000000",
            "--from-mesh",
            "dp=2",
            "--from",
            "dp",
            "--to",
            "None",
            "--run",
        ],
        &[],
    );
    assert_refused(
        &out,
        &[
            "--run: a [1000000000000] f32 tensor",
            "bytes of memory available",
        ],
    );
    let out = tessera_env(
        &[
            "reshard",
            "--shape",
            "8",
            "--from-mesh",
            "dp=2",
            "--from",
            "dp",
            "--to",
            "None",
            "--from-rank-list",
            "0,1048575",
            "--run",
        ],
        &[],
    );
    assert_refused(
        &out,
        &["--run: the plan needs 1048576 local ranks", "at most 4096"],
    );
    let out = tessera_env(
        &[
            "reshard",
            "--shape",
            "8",
            "--from-mesh",
            "dp=1000000000",
            "--from",
            "dp",
            "--to",
            "None",
        ],
        &[],
    );
    assert_refused(&out, &["--from-mesh", "has 1000000000 ranks"]);
}

/// Protobuf encoding helpers for crafted MindSpore strategy files.
mod pb {
    pub fn varint(mut n: u64, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    pub fn message(field: u64, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        varint((field << 3) | 2, &mut out);
        varint(body.len() as u64, &mut out);
        out.extend_from_slice(body);
        out
    }

    /// A `{repeated uint dim = 1}` message body.
    pub fn dims(values: &[u64]) -> Vec<u8> {
        let mut out = Vec::new();
        for &v in values {
            varint(1 << 3, &mut out);
            varint(v, &mut out);
        }
        out
    }

    /// A strategy file of one parameter `w` with this device matrix and tensor map.
    pub fn strategy(dev_matrix: &[u64], tensor_map: &[u64]) -> Vec<u8> {
        let mut layouts = message(1, &dims(dev_matrix));
        layouts.extend(message(2, &dims(tensor_map)));
        let mut item = message(1, b"w");
        item.extend(message(2, &layouts));
        message(3, &item)
    }
}

/// A MindSpore JSON strategy file of one parameter `w`.
fn ms_json(dev_matrix: &str, tensor_map: &str, shape: &str) -> String {
    format!(
        r#"{{"parallel_layout_item": {{"w": {{"dev_matrix": {dev_matrix}, "tensor_map": {tensor_map}, "tensor_shape": {shape}}}}}}}"#
    )
}

#[test]
fn crafted_strategy_files_are_refused() {
    let scratch = Scratch::new("hostile-strategy");
    let dir = &scratch.0;
    let axes_12000 = format!("[{}]", vec!["1"; 12_000].join(","));
    let files: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "million_squared.ckpt",
            pb::strategy(&[1_000_000, 1_000_000], &[1, 0]),
            "device matrix [1000000, 1000000] has 1000000000000 ranks, above the limit of 1048576",
        ),
        (
            "billion.ckpt",
            pb::strategy(&[1_000_000_000], &[0]),
            "device matrix [1000000000] has 1000000000 ranks",
        ),
        (
            "map_out_of_range.ckpt",
            pb::strategy(&[2, 2], &[5, 2_147_483_647]),
            "tensor_map value 5 for tensor dim 0 is out of range",
        ),
        (
            "million_squared.json",
            ms_json("[1000000, 1000000]", "[1, 0]", "[8, 8]").into_bytes(),
            "device matrix [1000000, 1000000] has 1000000000000 ranks",
        ),
        (
            "billion.json",
            ms_json("[1000000000]", "[0]", "[1000000000]").into_bytes(),
            "device matrix [1000000000] has 1000000000 ranks",
        ),
        (
            "axes.json",
            ms_json(&axes_12000, "[0]", "[8]").into_bytes(),
            "a device matrix of 12000 axes is above the limit of 64 axes",
        ),
        (
            "map_out_of_range.json",
            ms_json("[2]", "[7, -5]", "[8, 8]").into_bytes(),
            "tensor_map value 7 for tensor dim 0 is out of range",
        ),
        (
            "tessera.json",
            br#"{"format": "tessera-strategy", "version": 1, "tensors": [{"name": "w", "shape": [8], "dtype": "f32", "placements": [{"mesh": {"axes": [["dp", 4294967296], ["mp", 4294967296]]}, "dims": [["dp"]]}]}]}"#.to_vec(),
            "(the product overflows)",
        ),
    ];
    for (name, bytes, _) in &files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    let before = listing(dir);
    for (name, _, expected) in &files {
        let path = dir.join(name);
        let out = tessera_env(&["strategy", "show", s(&path)], &[]);
        assert_refused(&out, &[s(&path), expected]);
    }
    assert_eq!(listing(dir), before, "files were left behind");
}

#[test]
fn absurd_shapes_in_strategy_files_are_refused() {
    let scratch = Scratch::new("hostile-shapes");
    let path = scratch.0.join("huge.json");
    std::fs::write(
        &path,
        ms_json(
            "[2]",
            "[0, -1]",
            "[4611686018427387904, 4611686018427387904]",
        ),
    )
    .unwrap();
    let out = tessera_env(&["ckpt", "redundancy", "--strategy", s(&path)], &[]);
    assert_refused(
        &out,
        &[s(&path), "has more elements than fit in memory addressing"],
    );
    assert_eq!(listing(&scratch.0), vec!["huge.json".to_string()]);
}

/// A MindSpore JSON strategy file of stage 0 with parameters `p0`…`p<n-1>`, listed in reverse
/// order when `reversed`.
fn many_params_json(n: usize, reversed: bool) -> String {
    let item = |i: usize| {
        format!(
            r#""p{i}": {{"dev_matrix": [2], "tensor_map": [0], "tensor_shape": [8], "field": 0, "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}}"#
        )
    };
    let items: Vec<String> = if reversed {
        (0..n).rev().map(item).collect()
    } else {
        (0..n).map(item).collect()
    };
    format!(
        r#"{{"current_stage": 0, "parallel_strategy_item": {{"op": {{"stage": 0, "parallel_strategy": [[2]]}}}}, "parallel_layout_item": {{{}}}}}"#,
        items.join(", ")
    )
}

/// Reading a strategy of many parameters takes time linear in their number: the duplicate-key
/// check of JSON objects, the name lookups while building the model and in a rank list, and
/// the comparison of two copies of one pipeline stage each scanned every parameter per
/// parameter, so a 14 MB file of 100 000 parameters (the bound is 1 GiB) took 40 seconds to
/// show and minutes to merge.
#[test]
fn strategies_of_many_parameters_are_read_in_linear_time() {
    const N: usize = 100_000;
    let scratch = Scratch::new("many-params");
    let stages = scratch.0.join("stages");
    std::fs::create_dir(&stages).unwrap();
    let (a, b) = (stages.join("a.json"), stages.join("b.json"));
    std::fs::write(&a, many_params_json(N, false)).unwrap();
    std::fs::write(&b, many_params_json(N, true)).unwrap();
    let merged = scratch.0.join("merged.json");
    let runs: [Vec<&str>; 2] = [
        vec![
            "ckpt",
            "ranks",
            "--src-strategy",
            s(&a),
            "--dst-strategy",
            s(&b),
            "--rank",
            "0",
        ],
        vec!["strategy", "merge-stages", s(&stages), s(&merged)],
    ];
    for args in &runs {
        let start = std::time::Instant::now();
        let out = tessera_env(args, &[]);
        let took = start.elapsed();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // A guard against the quadratic reading's near-hang (many minutes in a debug build),
        // not a measure of speed: the linear reading takes a few seconds there.
        assert!(took.as_secs() < 120, "{args:?} took {took:?}");
    }
    let text = std::fs::read_to_string(&merged).unwrap();
    assert!(
        text.contains("\"0-p99999\""),
        "the merged file lacks p99999"
    );
}

/// A reader that goes away (`tessera bench … | head -1`) ends the benchmark quietly: no panic
/// on the broken pipe, exit status 0 as `main` gives a broken pipe.
#[test]
fn a_closed_stdout_ends_a_benchmark_quietly() {
    use std::io::BufRead as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["bench", "memcpy", "--max-mib", "64", "--reps", "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty(), "the benchmark printed a line first");
    // The read end is dropped here: every later line meets a broken pipe.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
}

/// Every benchmark's counts and sizes, `generate --tokens` and `train --timeout` are bounded before anything
/// runs: a zero that would time nothing (or panic on an empty list of times, or leave a
/// parameter-server job waiting forever) and a size that would allocate, loop or spawn past
/// the machine are refused as usage errors naming the flag and its range; an absurd
/// `reshard --shape` is refused naming it.
#[test]
fn benchmark_counts_and_sizes_out_of_range_are_refused() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "gpt-step", "--steps", "0"], "--steps"),
        (&["bench", "gpt-step", "--rounds", "0"], "--rounds"),
        (&["bench", "train-step", "--steps", "0"], "--steps"),
        (&["bench", "memcpy", "--max-mib", "100000000"], "--max-mib"),
        (&["bench", "memcpy", "--reps", "0"], "--reps"),
        (&["bench", "collectives", "--ranks", "100000"], "--ranks"),
        (&["bench", "collectives", "--reps", "0"], "--reps"),
        (&["bench", "reshard", "--reps", "0"], "--reps"),
        (
            &["bench", "ckpt-convert", "--tensors", "100000"],
            "--tensors",
        ),
        (&["bench", "ckpt-convert", "--reps", "0"], "--reps"),
        (&["bench", "ps", "--steps", "0"], "--steps"),
        (&["bench", "ps", "--recovery", "--trials", "0"], "--trials"),
        (&["bench", "ps-embedding", "--steps", "0"], "--steps"),
        (&["bench", "elastic", "--steps", "1"], "--steps"),
        (&["bench", "elastic", "--interval", "0"], "--interval"),
        (&["bench", "profile", "--cores", "0"], "--cores"),
        (&["bench", "train-step", "--devices", "64"], "--devices"),
        (
            &[
                "generate",
                "runs/none",
                "--prompt",
                "x",
                "--tokens",
                "1000000000000",
            ],
            "--tokens",
        ),
        (
            &[
                "train",
                "examples/seed_data_parallel.toml",
                "--timeout",
                "0",
            ],
            "--timeout",
        ),
    ];
    for (args, flag) in cases {
        assert_usage_error(args, &[flag, "is not in"]);
    }
    for shape in ["100000000,100000000", "0,4"] {
        let out = tessera_env(&["bench", "reshard", "--shape", shape], &[]);
        assert_refused(&out, &["--shape", shape, "between 1 and"]);
    }
}

/// `bench gpt-step --one-rank` times one rank and nothing on two ranks (no speed-up rounds), its
/// variant (2 threads) in sessions interleaved step by step with the plain rank, and
/// refuses the flags that only mean something on two ranks, naming them.
#[test]
fn gpt_step_one_rank_times_one_rank_only() {
    let out = tessera_env(
        &[
            "bench",
            "gpt-step",
            "--one-rank",
            "--steps",
            "1",
            "--layers",
            "1",
            "--hidden",
            "32",
            "--threads",
            "2",
            "--rounds",
            "2",
        ],
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("tessera, 1 rank: "), "{stdout}");
    assert!(stdout.contains("model FLOP utilisation"), "{stdout}");
    assert!(!stdout.contains("2 ranks"), "{stdout}");
    // The threaded variant against 1 thread: two sessions of one step each, interleaved.
    for session in stdout.lines().filter(|l| l.contains("steps interleaved")) {
        assert!(session.contains("1 rank"), "{session}");
    }
    let sessions = stdout.matches(", steps interleaved: ").count();
    assert_eq!(sessions, 4, "two sessions of two configurations\n{stdout}");
    assert!(
        stdout.contains("1 rank on 2 threads: ")
            && stdout.contains("(median of 2 interleaved steps"),
        "{stdout}"
    );
    for flag in ["--fusion", "--sequence-parallel"] {
        assert_usage_error(
            &["bench", "gpt-step", "--one-rank", flag],
            &["--one-rank", flag],
        );
    }
}

/// `bench gpt-step --paced` warms up, says `ready`, then runs one timed step per line read and
/// answers each with its time, until its input ends; the flags of the unpaced benchmark are
/// refused with it, naming both.
#[test]
fn gpt_step_paced_runs_one_step_per_line_read() {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["bench", "gpt-step", "--paced", "--steps", "5"])
        .args(["--layers", "1", "--hidden", "32"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"step\nstep\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after: Vec<&str> = stdout.lines().skip_while(|l| *l != "ready").collect();
    assert_eq!(
        after.len(),
        3,
        "ready, then one answer per line read\n{stdout}"
    );
    for answer in &after[1..] {
        let ms: f64 = answer.strip_prefix("step ").unwrap().parse().unwrap();
        assert!(ms > 0.0, "{answer}");
    }
    for flag in ["--profile", "--deterministic", "--clip"] {
        assert_usage_error(&["bench", "gpt-step", "--paced", flag], &["--paced", flag]);
    }
}

/// `args` end in a usage error (exit status 2) whose message holds every one of `needles`.
fn assert_usage_error(args: &[&str], needles: &[&str]) {
    let out = tessera_env(args, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?}: a usage error\n{stderr}"
    );
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: names {needle}\n{stderr}"
        );
    }
}

/// Files that are read whole (a config, a device profile, a strategy, a key) are read only up
/// to their kind's bound: an endless device given as one is refused, naming it and the bound,
/// and never exhausts memory.
#[test]
fn endless_files_are_refused_at_their_bound() {
    let out = tessera_env(&["train", "/dev/zero"], &[]);
    assert_refused(&out, &["/dev/zero", "more than"]);
    let out = tessera_env(&["strategy", "show", "/dev/zero"], &[]);
    assert_refused(&out, &["/dev/zero", "more than"]);
    // Inspecting one is not mistaken for an empty file.
    let out = tessera_env(&["ckpt", "inspect", "/dev/zero"], &[]);
    assert_refused(&out, &["/dev/zero", "not a regular file"]);
    let out = tessera_env(
        &[
            "plan",
            "examples/seed_semi_auto.toml",
            "--profile",
            "/dev/zero",
        ],
        &[],
    );
    assert_refused(&out, &["/dev/zero", "more than"]);
    let scratch = Scratch::new("endless_key");
    let (src, dst) = (scratch.0.join("src"), scratch.0.join("dst"));
    let out = tessera_env(
        &[
            "ckpt",
            "convert",
            "--src",
            s(&src),
            "--dst",
            s(&dst),
            "--dec-key-file",
            "/dev/zero",
        ],
        &[],
    );
    assert_refused(&out, &["--dec-key-file /dev/zero", "more than"]);
}

/// Inspecting a FIFO is refused as not a regular file, at once: the file was opened before it
/// was checked, and opening a FIFO waits for a writer, forever when none comes.
#[test]
fn inspecting_a_fifo_is_refused_without_waiting() {
    let scratch = Scratch::new("fifo");
    let fifo = scratch.0.join("pipe.ckpt");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let out = tessera_bounded(&["ckpt", "inspect", s(&fifo)]);
    assert_refused(&out, &[s(&fifo), "not a regular file"]);
}

/// On the local backend a hung rank cannot be stopped: once its peers' collectives time out,
/// `tessera train` prints the first failure and the hung rank and exits 1, rather than waiting
/// for the hung thread forever.
#[test]
fn a_hung_rank_ends_a_local_run_after_the_timeout() {
    let scratch = Scratch::new("hung_rank");
    let out_set = format!("output.dir={:?}", s(&scratch.0));
    let started = std::time::Instant::now();
    let out = tessera_env(
        &[
            "train",
            "examples/seed_semi_auto.toml",
            "--set",
            &out_set,
            "--set",
            "train.max_steps=4",
            "--timeout",
            "2",
        ],
        &[("TESSERA_FAULT", "rank=1,step=2,at=hang")],
    );
    assert_refused(&out, &["timed out after 2s", "rank(s) {1} did not end"]);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "the run ended only after {:?}",
        started.elapsed()
    );
    // A fault for a rank the job does not have would never fire: refused before any rank.
    let out = tessera_env(
        &["train", "examples/seed_semi_auto.toml", "--set", &out_set],
        &[("TESSERA_FAULT", "rank=99,step=2,at=hang")],
    );
    assert_refused(
        &out,
        &["TESSERA_FAULT", "rank 99 is not a rank of this job"],
    );
}

/// `tessera args…` run from the repository root, killed (and the test failed) when it still
/// runs after 30 s.
fn tessera_bounded(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .current_dir(repo_root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running tessera");
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed().as_secs() >= 30 {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("`tessera {}` still waits after 30 s", args.join(" "));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// A named pipe given where a file is read or written (a config, a data file, a device
/// profile, a strategy file, the metrics log, the timeline) is refused at once, naming it:
/// opening a FIFO waits for a writer (or a reader) that never comes, so each of these hung.
#[test]
fn named_pipes_are_refused_without_waiting() {
    let scratch = Scratch::new("named-pipes");
    let fifo = scratch.0.join("pipe");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    // An IDX directory whose training images are a FIFO.
    let idx = scratch.0.join("idx");
    std::fs::create_dir_all(&idx).unwrap();
    let made = Command::new("mkfifo")
        .arg(idx.join("train-images-idx3-ubyte"))
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let out_dir = scratch.0.join("out");
    let out_set = format!("output.dir={:?}", s(&out_dir));
    let path_set = format!("data.path={:?}", s(&fifo));
    let dir_set = format!("data.dir={:?}", s(&idx));
    let strategy_set = format!("parallel.strategy_file={:?}", s(&fifo));
    let profile_set = format!("parallel.device_profile={:?}", s(&fifo));
    let load_set = format!("parallel.load_operator_strategy_file={:?}", s(&fifo));
    let gpt = "examples/gpt_kjv.toml";
    let semi = "examples/seed_semi_auto.toml";
    let runs: Vec<Vec<&str>> = vec![
        vec!["train", s(&fifo)],
        vec!["train", gpt, "--set", &out_set, "--set", &path_set],
        vec![
            "train",
            gpt,
            "--set",
            &out_set,
            "--set",
            &path_set,
            "--set",
            "data.format=tokens",
        ],
        vec!["train", semi, "--set", &out_set, "--set", &dir_set],
        vec!["train", semi, "--set", &out_set, "--set", &strategy_set],
        vec![
            "train",
            semi,
            "--set",
            &out_set,
            "--set",
            "parallel.mode=sharding_propagation",
            "--set",
            &profile_set,
        ],
        vec![
            "train",
            semi,
            "--set",
            &out_set,
            "--set",
            "parallel.mode=sharding_propagation",
            "--set",
            &load_set,
        ],
        vec!["train", semi, "--set", &out_set, "--log-json", s(&fifo)],
        vec![
            "train",
            gpt,
            "--set",
            &out_set,
            "--set",
            "parallel.pipeline.stages=2",
            "--set",
            "parallel.model_parallel=1",
            "--timeline",
            s(&fifo),
            "--explain",
        ],
        vec!["plan", semi, "--set", &out_set, "--profile", s(&fifo)],
    ];
    for args in runs {
        let out = tessera_bounded(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("named pipe (FIFO)"),
            "`tessera {}`:\n{stderr}",
            args.join(" ")
        );
        assert_refused(&out, &[]);
    }
}

/// A bad path given to a flag or key that names a file (a directory, or the empty string) is
/// refused naming the flag or key and the path: a device profile that was a directory was
/// reported as a bare "Is a directory (os error 21)", and an empty one was taken as the working
/// directory; `bench profile --out` found a directory only after minutes of measurement.
#[test]
fn a_bad_path_names_its_flag_or_key_and_the_path() {
    let scratch = Scratch::new("bad-paths");
    let dir = s(&scratch.0);
    let out_set = format!("output.dir={:?}", s(&scratch.0.join("out")));
    let semi = "examples/seed_semi_auto.toml";
    let gpt = "examples/gpt_kjv.toml";
    let profile_dir = format!("parallel.device_profile={dir:?}");
    let search = "parallel.mode=sharding_propagation";
    let pipelined = [
        "--set",
        "parallel.pipeline.stages=2",
        "--set",
        "parallel.pipeline.micro_batches=2",
        "--set",
        "parallel.model_parallel=1",
    ];
    // (arguments, fragments the message must hold)
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["plan", semi, "--set", &out_set, "--profile", dir],
            vec!["--profile", dir, "is a directory"],
        ),
        (
            vec!["plan", semi, "--set", &out_set, "--profile", ""],
            vec!["--profile", "\"\" is an empty path"],
        ),
        (
            vec!["plan", semi, "--set", &out_set, "--set", &profile_dir],
            vec!["parallel.device_profile", dir, "is a directory"],
        ),
        (
            vec![
                "plan",
                semi,
                "--set",
                &out_set,
                "--set",
                "parallel.device_profile=\"\"",
            ],
            vec!["parallel.device_profile", "\"\" is an empty path"],
        ),
        (
            vec![
                "train",
                semi,
                "--set",
                &out_set,
                "--set",
                search,
                "--set",
                &profile_dir,
            ],
            vec!["parallel.device_profile", dir, "is a directory"],
        ),
        (
            vec!["train", semi, "--set", &out_set, "--log-json", dir],
            vec!["--log-json", dir, "is a directory"],
        ),
        (
            [
                &["train", gpt, "--set", &out_set, "--trace", dir][..],
                &pipelined[..],
            ]
            .concat(),
            vec!["--trace", dir, "is a directory"],
        ),
        (
            [
                &["train", gpt, "--explain", "--timeline", dir][..],
                &pipelined[..],
            ]
            .concat(),
            vec!["--timeline", dir, "is a directory"],
        ),
        // Refused before anything is measured.
        (
            vec!["bench", "profile", "--out", dir],
            vec!["--out", dir, "is a directory"],
        ),
    ];
    for (args, fragments) in &cases {
        let out = tessera_env(args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_refused(&out, fragments);
        assert!(
            !stderr.contains("os error"),
            "a bare system error:\n{stderr}"
        );
    }
    // An empty path to a flag of a path type is refused by the argument parser, naming it.
    for args in [
        vec!["train", semi, "--log-json", ""],
        vec!["train", semi, "--trace", ""],
        vec!["train", semi, "--timeline", ""],
        vec!["bench", "profile", "--out", ""],
    ] {
        let out = tessera_env(&args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            stderr.contains("a value is required") && stderr.contains(args[2]),
            "{args:?}: {stderr}"
        );
    }
}

/// A scratch directory holding one regular file, `a_file`, and the paths the path tests give
/// as text: the directory itself, the file, a missing path and `under` below the file.
struct PathCases {
    scratch: Scratch,
    dir: String,
    file: String,
    missing: String,
    under_file: String,
}

impl PathCases {
    fn new(name: &str, file_text: &[u8], under: &str) -> PathCases {
        let scratch = Scratch::new(name);
        let file = scratch.0.join("a_file");
        std::fs::write(&file, file_text).unwrap();
        let text = |p: &Path| s(p).to_string();
        PathCases {
            dir: text(&scratch.0),
            file: text(&file),
            missing: text(&scratch.0.join("missing")),
            under_file: text(&file.join(under)),
            scratch,
        }
    }
}

/// Runs every case of `cases` (arguments, fragments the message must hold): each must be a
/// clean refusal holding every fragment, with no bare system error ("os error") and no step
/// or measurement printed first.
#[track_caller]
fn assert_each_refused(cases: &[(Vec<&str>, Vec<&str>)]) {
    for (args, fragments) in cases {
        let out = tessera_env(args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_refused(&out, fragments);
        assert!(
            !stderr.contains("os error"),
            "`tessera {}`: a bare system error:\n{stderr}",
            args.join(" ")
        );
        assert!(
            stdout.is_empty(),
            "`tessera {}` went on before refusing:\n{stdout}",
            args.join(" ")
        );
    }
}

/// The config keys that take a path read or written while the run is set up name themselves,
/// the path and the kind expected: a directory given as `parallel.strategy_file`,
/// `parallel.load_operator_strategy_file` or `data.path`, a file or a missing directory as
/// `data.dir`, a `parallel.save_operator_strategy_file` that is a directory or lies under a
/// file, an `output.resume_strategy` that is a directory. They were bare system errors ("Is a
/// directory (os error 21)"), the save file's only after the search. Nothing is left behind.
#[test]
fn a_bad_config_path_names_its_key_the_path_and_the_kind_expected() {
    let paths = PathCases::new("bad-config-paths", b"not a directory", "strategies.json");
    let scratch = &paths.scratch;
    let (dir, file, missing) = (&*paths.dir, &*paths.file, &*paths.missing);
    let under_file = &*paths.under_file;
    // A checkpoint directory holding rank 0's file, so that the strategy file is looked at.
    let ckpt = scratch.0.join("ckpt");
    std::fs::create_dir_all(ckpt.join("rank_0")).unwrap();
    std::fs::write(ckpt.join("rank_0").join("checkpoint_0.safetensors"), b"").unwrap();
    // A parameter-server run directory whose snapshot folder `ps` is a file.
    let ps_run = scratch.0.join("psrun");
    std::fs::create_dir_all(&ps_run).unwrap();
    std::fs::write(ps_run.join("ps"), b"in the way").unwrap();
    let ps_snapshots = s(&ps_run.join("ps")).to_string();
    let out = scratch.0.join("out");
    let out_set = format!("output.dir={:?}", s(&out));
    let set = |key: &str, path: &str| format!("{key}={path:?}");
    let strategy_dir = set("parallel.strategy_file", dir);
    let load_dir = set("parallel.load_operator_strategy_file", dir);
    let save_dir = set("parallel.save_operator_strategy_file", dir);
    let save_under_file = set("parallel.save_operator_strategy_file", under_file);
    let data_dir_file = set("data.dir", file);
    let data_dir_missing = set("data.dir", missing);
    let data_dir_empty = set("data.dir", dir);
    let data_path_dir = set("data.path", dir);
    let resume = set("output.resume_from", s(&ckpt));
    let resume_strategy = set("output.resume_strategy", dir);
    let under_a_file = format!("{file} is a file, not a directory");
    let semi = "examples/seed_semi_auto.toml";
    let gpt = "examples/gpt_kjv.toml";
    let search = "parallel.mode=sharding_propagation";
    let run_with = |sets: &[&str], config: &'static str| -> Vec<String> {
        let mut args = vec!["train".to_string(), config.to_string()];
        for set in sets.iter().chain([&out_set.as_str()]) {
            args.extend(["--set".to_string(), set.to_string()]);
        }
        args
    };
    let owned: Vec<(Vec<String>, Vec<&str>)> = vec![
        (
            run_with(&[&strategy_dir], semi),
            vec![
                "parallel.strategy_file",
                dir,
                "is a directory",
                "expected a file",
            ],
        ),
        (
            run_with(&[search, &load_dir], semi),
            vec![
                "parallel.load_operator_strategy_file",
                dir,
                "is a directory",
                "expected a file",
            ],
        ),
        (
            run_with(&[search, &save_dir], semi),
            vec![
                "parallel.save_operator_strategy_file",
                dir,
                "is a directory",
                "expected a file",
            ],
        ),
        (
            run_with(&[search, &save_under_file], semi),
            vec![
                "parallel.save_operator_strategy_file",
                under_file,
                &under_a_file,
            ],
        ),
        (
            run_with(&[&data_dir_file], semi),
            vec!["data.dir", file, "is a file", "expected a directory"],
        ),
        (
            run_with(&[&data_dir_missing], semi),
            vec![
                "data.dir",
                missing,
                "does not exist",
                "expected a directory",
            ],
        ),
        (
            run_with(&[&data_dir_empty], semi),
            vec!["data.dir", dir, "holds no train-images-idx3-ubyte"],
        ),
        (
            {
                let mut args = run_with(&[&strategy_dir], semi);
                args.push("--explain".to_string());
                args
            },
            vec![
                "parallel.strategy_file",
                dir,
                "is a directory",
                "expected a file",
            ],
        ),
        (
            run_with(&[&data_path_dir], gpt),
            vec!["data.path", dir, "is a directory", "expected a file"],
        ),
        (
            run_with(&[&resume, &resume_strategy], semi),
            vec![
                "output.resume_strategy",
                dir,
                "is a directory",
                "expected a file",
            ],
        ),
        // `tessera plan` reads the same keys.
        (
            {
                let mut args = run_with(&[&data_dir_file], semi);
                args[0] = "plan".to_string();
                args
            },
            vec!["data.dir", file, "is a file", "expected a directory"],
        ),
        // A parameter-server run, before any of its processes starts.
        (
            run_with(&[&data_dir_file], "examples/seed_parameter_server.toml"),
            vec!["data.dir", file, "is a file", "expected a directory"],
        ),
        (
            {
                let mut args = run_with(&[], "examples/seed_parameter_server.toml");
                args.extend(["--log-json".to_string(), dir.to_string()]);
                args
            },
            vec!["--log-json", dir, "is a directory", "expected a file"],
        ),
        // The run directory of a parameter-server job, and its servers' snapshot folder.
        (
            vec![
                "train".to_string(),
                "examples/seed_parameter_server.toml".to_string(),
                "--set".to_string(),
                set("output.dir", file),
            ],
            vec!["output.dir", file, "is a file", "expected a directory"],
        ),
        (
            vec![
                "train".to_string(),
                "examples/seed_parameter_server.toml".to_string(),
                "--set".to_string(),
                set("output.dir", s(&ps_run)),
            ],
            vec!["output.dir", &ps_snapshots, "is a file", "snapshots"],
        ),
    ];
    let cases: Vec<(Vec<&str>, Vec<&str>)> = owned
        .iter()
        .map(|(args, fragments)| (args.iter().map(String::as_str).collect(), fragments.clone()))
        .collect();
    assert_each_refused(&cases);
    assert!(!out.exists(), "no output directory is left");
    assert_eq!(
        listing(&scratch.0),
        ["a_file", "ckpt", "psrun"],
        "nothing is left"
    );
    assert_eq!(listing(&ps_run), ["ps"], "nothing is made in it");
}

/// Paths the ranks write only once they run are checked before any rank starts, naming the
/// key: a `train.dump_local_norm_path` that is a file, or where nothing can be created, and a
/// rank's folder in it that is a file; a periodic set's `checkpoint_step_<N>` that is a file;
/// an `output.group_info_file` under a file. Each failed on a rank after its first steps.
/// The output directory made for the checks is removed, and nothing else is made.
#[test]
fn paths_the_ranks_write_are_checked_before_any_step() {
    let scratch = Scratch::new("mid-run-paths");
    let file_path = scratch.0.join("a_file");
    std::fs::write(&file_path, b"not a directory").unwrap();
    let file = s(&file_path);
    let norms = scratch.0.join("norms");
    std::fs::create_dir_all(&norms).unwrap();
    std::fs::write(norms.join("rank_3"), b"in the way").unwrap();
    let rank_3 = s(&norms.join("rank_3")).to_string();
    // A run directory of an earlier run, with a file where step 4's set would go.
    let earlier = scratch.0.join("earlier");
    std::fs::create_dir_all(&earlier).unwrap();
    std::fs::write(earlier.join("checkpoint_step_4"), b"in the way").unwrap();
    let step_4 = s(&earlier.join("checkpoint_step_4")).to_string();
    let fresh = scratch.0.join("made").join("run");
    let group_under_file = file_path.join("groups").join("group_info.pb");
    let set = |key: &str, path: &str| format!("{key}={path:?}");
    let cases: Vec<(String, Vec<String>, Vec<String>)> = vec![
        (
            s(&fresh).to_string(),
            vec![
                "train.dump_local_norm=true".to_string(),
                set("train.dump_local_norm_path", file),
            ],
            vec![
                "train.dump_local_norm_path".to_string(),
                file.to_string(),
                "is a file".to_string(),
                "expected a directory".to_string(),
            ],
        ),
        (
            s(&fresh).to_string(),
            vec![
                "train.dump_local_norm=true".to_string(),
                set("train.dump_local_norm_path", "/proc/tessera-norms"),
            ],
            vec![
                "train.dump_local_norm_path".to_string(),
                "/proc/tessera-norms".to_string(),
                "no file can be made in /proc".to_string(),
            ],
        ),
        (
            s(&fresh).to_string(),
            vec![
                "train.dump_local_norm=true".to_string(),
                set("train.dump_local_norm_path", s(&norms)),
            ],
            vec![
                "train.dump_local_norm_path".to_string(),
                rank_3,
                "is a file".to_string(),
            ],
        ),
        (
            s(&earlier).to_string(),
            vec!["output.save_checkpoint_steps=2".to_string()],
            vec![
                "output.save_checkpoint_steps".to_string(),
                step_4,
                "is a file".to_string(),
                "periodic checkpoint set of step 4".to_string(),
            ],
        ),
        (
            s(&earlier).to_string(),
            vec!["output.save_checkpoint_seconds=1000".to_string()],
            vec![
                "output.save_checkpoint_seconds".to_string(),
                s(&earlier.join("checkpoint_step_4")).to_string(),
                "is a file".to_string(),
            ],
        ),
        (
            s(&fresh).to_string(),
            vec![set("output.group_info_file", s(&group_under_file))],
            vec![
                "output.group_info_file".to_string(),
                format!("{file} is a file, not a directory"),
            ],
        ),
    ];
    for (out_dir, sets, fragments) in &cases {
        let out_set = format!("output.dir={out_dir:?}");
        let mut args = vec![
            "train",
            "examples/seed_semi_auto.toml",
            "--set",
            "train.max_steps=6",
            "--set",
            &out_set,
        ];
        for set in sets {
            args.extend(["--set", set]);
        }
        let fragments: Vec<&str> = fragments.iter().map(String::as_str).collect();
        assert_each_refused(&[(args, fragments)]);
    }
    assert!(
        !scratch.0.join("made").exists(),
        "the output directory made is removed"
    );
    assert_eq!(listing(&scratch.0), ["a_file", "earlier", "norms"]);
    assert_eq!(
        listing(&earlier),
        ["checkpoint_step_4"],
        "nothing is made in it"
    );
    assert_eq!(listing(&norms), ["rank_3"]);
    assert!(!Path::new("/proc/tessera-norms").exists());
}

/// A resumed run writes periodic sets only after the step it resumes from: a stray *file*
/// `checkpoint_step_<N>` for a step at or before it is no reason to refuse the run (the check
/// before start looked at every step from 1), while one for a step it will save still is.
#[test]
fn a_stray_file_before_the_resume_point_does_not_refuse_a_resumed_run() {
    let scratch = Scratch::new("resume-stray");
    let first = scratch.0.join("first");
    let saved = train(&first, &["--set", "train.max_steps=2"]);
    assert!(
        saved.status.success(),
        "{}",
        String::from_utf8_lossy(&saved.stderr)
    );
    let run = scratch.0.join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("checkpoint_step_2"), b"a stray file").unwrap();
    let resume = format!("output.resume_from={:?}", s(&first));
    let resumed = || {
        train(
            &run,
            &[
                "--set",
                "train.max_steps=4",
                "--set",
                "output.save_checkpoint_steps=2",
                "--set",
                &resume,
            ],
        )
    };
    let out = resumed();
    assert!(
        out.status.success(),
        "a stray file at step 2 refused a run resuming from step 2:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        run.join("checkpoint_step_4").is_dir(),
        "step 4's set is saved"
    );
    assert!(
        run.join("checkpoint_step_2").is_file(),
        "the stray file is left alone"
    );
    // A file where a set of this run goes is still refused before any step.
    std::fs::remove_dir_all(run.join("checkpoint_step_4")).unwrap();
    std::fs::write(run.join("checkpoint_step_4"), b"in the way").unwrap();
    let out = resumed();
    assert_refused(
        &out,
        &[
            "output.save_checkpoint_steps",
            "checkpoint_step_4",
            "is a file",
            "step 4",
        ],
    );
}

/// A positional path says what it was for ("config file /x: is a directory; expected a file
/// …"), not only the path and a bare system error.
#[test]
fn a_positional_path_says_what_it_was_for() {
    let paths = PathCases::new("positional-paths", b"x", "merged.json");
    let scratch = &paths.scratch;
    let (dir, file, missing) = (&*paths.dir, &*paths.file, &*paths.missing);
    let under_file = &*paths.under_file;
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["train", dir],
            vec!["config file", dir, "is a directory", "expected a file"],
        ),
        (
            vec!["train", missing],
            vec!["config file", missing, "does not exist", "expected a file"],
        ),
        (
            vec!["plan", dir],
            vec!["config file", dir, "is a directory", "expected a file"],
        ),
        (
            vec!["strategy", "show", dir],
            vec!["strategy file", dir, "is a directory", "expected a file"],
        ),
        (
            vec!["strategy", "restore-ranks", dir],
            vec!["group-info file", dir, "is a directory", "expected a file"],
        ),
        (
            vec!["strategy", "merge-stages", file, missing],
            vec![
                "per-stage strategy directory",
                file,
                "is a file",
                "expected a directory",
            ],
        ),
        (
            vec!["strategy", "merge-stages", dir, under_file],
            vec![
                "merged strategy file",
                under_file,
                "is a file, not a directory",
            ],
        ),
        (
            vec!["generate", file, "--prompt", "a"],
            vec!["run directory", file, "is a file", "expected a directory"],
        ),
        (
            vec!["generate", dir, "--prompt", "a"],
            vec!["run directory", dir, "holds no model.json"],
        ),
        (
            vec!["ckpt", "load-segmented", missing],
            vec![
                "checkpoint directory",
                missing,
                "does not exist",
                "expected a directory",
            ],
        ),
        (
            vec!["ckpt", "inspect", dir],
            vec!["file to inspect", dir, "is a directory", "expected a file"],
        ),
        (
            vec!["ckpt", "diff", file, dir],
            vec!["checkpoint A", file, "is a file", "expected a directory"],
        ),
        (
            vec!["ckpt", "diff", dir, missing],
            vec!["checkpoint B", missing, "does not exist"],
        ),
    ];
    assert_each_refused(&cases);
    assert_eq!(listing(&scratch.0), ["a_file"], "nothing is left");
}

/// The path flags of `tessera bench ps`, `ps-embedding`, `elastic` and `ckpt-convert` are
/// checked before anything is measured, naming the flag (they failed in a run of the
/// benchmark, or after starting a job).
#[test]
fn bench_path_flags_are_checked_before_measuring() {
    let paths = PathCases::new("bench-paths", b"x", "work");
    let scratch = &paths.scratch;
    let (dir, file, missing) = (&*paths.dir, &*paths.file, &*paths.missing);
    let under_file = &*paths.under_file;
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["bench", "ps", "--data", file],
            vec!["--data", file, "is a file", "expected a directory"],
        ),
        (
            vec!["bench", "ps", "--recovery", "--data", missing],
            vec!["--data", missing, "does not exist"],
        ),
        (
            vec!["bench", "ps", "--model", "gpt", "--text", dir],
            vec!["--text", dir, "is a directory", "expected a file"],
        ),
        (
            vec!["bench", "ps-embedding", "--data", dir],
            vec!["--data", dir, "holds no train-images-idx3-ubyte"],
        ),
        (
            vec!["bench", "elastic", "--config", dir],
            vec!["--config", dir, "is a directory", "expected a file"],
        ),
        (
            vec!["bench", "ckpt-convert", "--dir", under_file],
            vec!["--dir", under_file, "is a file, not a directory"],
        ),
    ];
    assert_each_refused(&cases);
    assert_eq!(listing(&scratch.0), ["a_file"], "nothing is left");
}

/// `tessera plan` in a mode without search refuses what the run refuses: a dataset strategy
/// the devices do not divide the batch by. It used to cost the ops' default strategies (which
/// split the batch only as far as it divides) and print a plan for a run that cannot start.
#[test]
fn plan_refuses_a_batch_the_devices_do_not_divide() {
    let scratch = Scratch::new("plan-batch");
    let out_set = format!("output.dir={:?}", s(&scratch.0));
    for mode in ["data_parallel", "semi_auto"] {
        let mode_set = format!("parallel.mode={mode}");
        let args = [
            "examples/seed_data_parallel.toml",
            "--devices",
            "64",
            "--set",
            &out_set,
            "--set",
            &mode_set,
        ];
        let plan = tessera_env(&[&["plan"], &args[..]].concat(), &[]);
        assert_refused(&plan, &["dataset_strategy", "not divisible by 64"]);
        let train = tessera_env(&[&["train", "--explain"], &args[..]].concat(), &[]);
        assert_refused(&train, &["dataset_strategy", "not divisible by 64"]);
    }
    assert!(
        !scratch.0.join("operator_strategy.json").exists(),
        "a refused plan writes no strategy file"
    );
}

/// Under an address-space limit (`ulimit -v`, as a batch system sets one), a run whose
/// predicted peak fits `MemAvailable` but not the limit is refused before any rank starts,
/// naming the limit; it used to abort mid-initialisation ("memory allocation of N bytes
/// failed", SIGABRT).
#[test]
fn a_run_past_the_address_space_limit_is_refused_before_it_starts() {
    let scratch = Scratch::new("ulimit-v");
    // The seed MLP at hidden 12000: a predicted peak of 1.62 GiB (its 12000 × 12000 weight,
    // gradient and momentum), under a 1.5 GB limit.
    let script = format!(
        "ulimit -v 1500000 && exec {} train examples/seed_stand_alone.toml \
         --set model.hidden=12000 --set 'output.dir=\"{}\"' --set train.max_steps=1",
        env!("CARGO_BIN_EXE_tessera"),
        s(&scratch.0.join("out")),
    );
    let out = Command::new("sh")
        .args(["-c", &script])
        .current_dir(repo_root())
        .output()
        .expect("running sh");
    // On a machine with less than that available the MemAvailable check refuses it first.
    assert_refused(
        &out,
        &["parallel.devices", "is available", "the predicted peak"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let roomy = runtime::host_memory().is_some_and(|m| m.available > 4 << 30);
    if roomy {
        assert!(
            stderr.contains("the address-space limit (ulimit -v)"),
            "{stderr}"
        );
    }
}

/// `tessera train` of a one-block MoE GPT of width 16 with 16,384 experts (mostly parameters:
/// 35 MiB of expert weights) under `ulimit -v limit_kib`, writing into `out`.
fn moe_under_address_limit(limit_kib: u64, config: &Path) -> Output {
    let script = format!(
        "ulimit -v {limit_kib} && exec {} train {}",
        env!("CARGO_BIN_EXE_tessera"),
        s(config)
    );
    Command::new("sh")
        .args(["-c", &script])
        .current_dir(repo_root())
        .output()
        .expect("running sh")
}

/// A run at the edge of an address-space limit is refused before it starts or runs to its end;
/// it never aborts on an allocation. A MoE GPT with 16,384 experts used to: its check counted
/// the training program's buffers (156 MiB) but not the evaluation executor's copy of the
/// parameters nor the copy a finished rank returns (35 MiB each), and the allocator's heaps
/// took 85 MB of address space beyond what it held, so limits up to 85 MB past the check's
/// figure aborted with "memory allocation of 16777216 bytes failed". The limit where the
/// check's figure just fits is found from a refusal's message (the room it reports is the limit
/// less what the process had mapped), then runs just below and above it are tried.
#[test]
fn a_run_at_the_address_space_limit_is_refused_or_runs_never_aborts() {
    let scratch = Scratch::new("ulimit-moe");
    let config = scratch.0.join("moe.toml");
    let out_dir = scratch.0.join("out");
    std::fs::write(
        &config,
        format!(
            "[model]\nname = \"gpt\"\nlayers = 1\nheads = 1\nhidden = 16\nffn_hidden = 16\nseq_len = 8\n\
             [model.moe]\nexperts = 16384\n\
             [data]\nformat = \"text\"\npath = \"data/kjv/kjv.txt.gz\"\nbatch_size = 2\nsteps_per_epoch = 2\n\
             [train]\nepochs = 1\nmax_steps = 2\noptimizer = \"adam\"\nlearning_rate = 0.001\neval = false\n\
             [output]\ndir = {:?}\nsave_checkpoint = false\n",
            s(&out_dir)
        ),
    )
    .unwrap();
    // 100 MB: far too little; the refusal says what the run needs and what the limit leaves.
    let probe = moe_under_address_limit(100_000, &config);
    assert_refused(&probe, &["parallel.devices", "the predicted peak"]);
    let stderr = String::from_utf8_lossy(&probe.stderr);
    if !stderr.contains("the address-space limit (ulimit -v)") {
        // Less memory available than the limit: MemAvailable refused it first.
        return;
    }
    let number_before = |marker: &str| -> u64 {
        let at = stderr.find(marker).expect("a figure in the message");
        let open = stderr[..at].rfind('(').expect("a figure in brackets");
        stderr[open + 1..at].trim().parse().expect("bytes")
    };
    let needs = number_before(" bytes, the predicted peak");
    let room = number_before(" bytes) is available");
    let mapped = 100_000 * 1024 - room;
    let edge_kib = (needs + mapped) / 1024;
    for delta in [-4_000i64, -1_000, 0, 1_000, 2_000, 4_000, 16_000] {
        let limit = edge_kib.saturating_add_signed(delta);
        let out = moe_under_address_limit(limit, &config);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() == Some(0) {
            continue;
        }
        assert_refused(&out, &["parallel.devices", "the predicted peak"]);
        // Well past the figure only another bound (MemAvailable, a cgroup) may refuse it.
        assert!(
            delta < 16_000 || !stderr.contains("the address-space limit"),
            "16 MB past the check's figure the run should fit (ulimit -v {limit}):\n{stderr}"
        );
    }
}

/// `tessera reshard` lists every transfer of its plan, and an all-gather over N ranks has N²:
/// 8192 ranks printed 6.3 GB of text, built whole in memory (15.6 GB), and a few more ranks
/// ended in an allocation abort. A plan with more transfers than the listing bound is refused,
/// naming the count and the flags to change — at once: 65536 ranks spent minutes planning the
/// 2^32 transfers before the bound refused them.
#[test]
fn reshard_listings_are_bounded() {
    let out = tessera_env(
        &[
            "reshard",
            "--shape",
            "2100",
            "--from-mesh",
            "dp=2100",
            "--from",
            "dp",
            "--to",
            "None",
        ],
        &[],
    );
    assert_refused(&out, &["4410000 transfers", "--from-mesh"]);
    assert!(out.stdout.is_empty(), "nothing is listed");
    // 65536 ranks: the planner counts the 2^32 transfers before making any and the plan is
    // refused at once; planning them first took minutes.
    let started = std::time::Instant::now();
    let out = tessera_bounded(&[
        "reshard",
        "--shape",
        "65536",
        "--from-mesh",
        "dp=65536",
        "--from",
        "dp",
        "--to-mesh",
        "dp=65536",
        "--to",
        "None",
    ]);
    assert_refused(
        &out,
        &[
            "4294967296 transfers",
            "between 65536 source and 65536 destination ranks",
            "more than the 4194304",
            "--from-mesh/--to-mesh",
        ],
    );
    assert!(out.stdout.is_empty(), "nothing is listed");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "refused only after {:?}",
        started.elapsed()
    );
}
