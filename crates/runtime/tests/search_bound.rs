//! The searches never return a plan predicted slower than a plan the user could write: over a
//! seeded set of GPT and seed-MLP configurations and device profiles (fast and slow links),
//! every search mode's predicted step (`runtime::plan`, what `tessera plan` prints) is at most
//! plain data parallel's and every fitting hand-written Megatron split's (`semi_auto` with
//! `model_parallel`, `use_seq_parallel`), under the same cost model and profile. And the cost a
//! search ranks a plan by is the cost the same strategies are reported with when only costed.

use std::collections::BTreeMap;
use std::path::Path;

use runtime::TrainConfig;
use search::{SearchMode, SearchRequest};

use crate::run_util::{digits, kjv};
use sweep::Rng;

const MODES: [&str; 3] = [
    "sharding_propagation",
    "recursive_programming",
    "dynamic_programming",
];

/// Relative slack for rounding: a search's step may exceed the best written plan's by this.
const EPSILON: f64 = 1e-9;

/// A device profile file whose links are slow (communication dominates), another whose links
/// are nearly free (compute dominates): written under `dir`.
fn profile_files(dir: &Path) -> [String; 2] {
    let slow = dir.join("slow.toml");
    std::fs::write(
        &slow,
        r#"name = "slow-links"
memory_bandwidth = 2e12
memory_bytes = 64000000000
devices_per_node = 4
[[matmul]]
min_flops = 0
flops_per_s = 3e14
[intra_node]
alpha = 5e-5
bandwidth = 1e9
[inter_node]
alpha = 1e-4
bandwidth = 1e8
"#,
    )
    .unwrap();
    let fast = dir.join("fast.toml");
    std::fs::write(
        &fast,
        r#"name = "fast-links"
memory_bandwidth = 5e11
memory_bytes = 64000000000
devices_per_node = 64
[[matmul]]
min_flops = 0
flops_per_s = 1e13
[intra_node]
alpha = 1e-7
bandwidth = 1e13
[inter_node]
alpha = 1e-7
bandwidth = 1e13
"#,
    )
    .unwrap();
    [slow.display().to_string(), fast.display().to_string()]
}

/// One drawn case: the config text, its device count and whether it is the GPT.
struct Case {
    text: String,
    devices: usize,
    gpt: bool,
}

/// The GPT of `[model]` keys `model` on the bundled text, `batch` windows, `devices` devices.
fn gpt_text(model: &str, batch: usize, devices: usize, profile: &str, out: &Path) -> String {
    format!(
        r#"[model]
name = "gpt"
{model}
[data]
format = "text"
path = "{data}"
batch_size = {batch}
[parallel]
devices = {devices}
mode = "data_parallel"
device_profile = "{profile}"
[train]
optimizer = "adamw"
learning_rate = 0.001
epochs = 1
[output]
dir = "{out}"
"#,
        data = kjv().display(),
        out = out.display(),
    )
}

/// Case `index` of `seed`: a GPT (widths 64–256, 1–4 layers, 1–8 heads, sequences 32–128, MoE
/// now and then) or the seed MLP, on 2–8 devices, under a built-in or a drawn link profile.
fn draw(seed: u64, index: u64, profiles: &[String], out: &Path) -> Case {
    let mut rng = Rng::for_case(seed, index);
    let devices = rng.pick(&[2, 4, 8]);
    let profile = rng.pick(&[0, 1, 2, 3]);
    let profile = match profile {
        0 => "h100-nvlink-ib".to_string(),
        1 => "ascend910b-hccs-roce".to_string(),
        p => profiles[p - 2].clone(),
    };
    if rng.chance(0.15) {
        let text = format!(
            r#"[model]
name = "seed_mlp"
hidden = {hidden}
classes = 10
[data]
format = "idx"
dir = "{data}"
batch_size = {batch}
[parallel]
devices = {devices}
mode = "data_parallel"
device_profile = "{profile}"
[train]
optimizer = "momentum"
momentum = 0.9
learning_rate = 0.01
epochs = 1
[output]
dir = "{out}"
"#,
            hidden = rng.pick(&[64, 128, 512]),
            batch = devices * rng.pick(&[1, 4, 16]),
            data = digits().display(),
            out = out.display(),
        );
        return Case {
            text,
            devices,
            gpt: false,
        };
    }
    let heads = rng.pick(&[1, 2, 4, 8]);
    let hidden = (heads * rng.pick(&[16, 32])).clamp(64, 256);
    let mut model = format!(
        "layers = {}\nheads = {heads}\nhidden = {hidden}\nseq_len = {}\n",
        rng.pick(&[1, 2, 4]),
        rng.pick(&[32, 64, 128]),
    );
    if rng.chance(0.2) {
        model += &format!("[model.moe]\nexperts = {}\n", rng.pick(&[2, 4]));
    }
    let batch = devices * rng.pick(&[1, 2, 4]);
    Case {
        text: gpt_text(&model, batch, devices, &profile, out),
        devices,
        gpt: true,
    }
}

/// The predicted step of `text` with `overrides`, ms, or why the configuration is refused (a
/// split the model does not divide).
fn step_ms(text: &str, overrides: &[String]) -> Result<f64, String> {
    let config =
        TrainConfig::parse(text, None, overrides, Path::new("/")).map_err(|e| e.to_string())?;
    runtime::plan(&config)
        .map(|r| r.step_ms())
        .map_err(|e| e.to_string())
}

/// The plans a user writes without searching: data parallel, and for the GPT every Megatron
/// split `semi_auto` takes (model parallel dividing the devices, sequence parallel on or off).
fn written_plans(case: &Case) -> Vec<(String, f64)> {
    let mut plans = Vec::new();
    let dp =
        step_ms(&case.text, &[]).unwrap_or_else(|e| panic!("data parallel: {e}\n{}", case.text));
    plans.push(("data_parallel".to_string(), dp));
    if !case.gpt {
        return plans;
    }
    for mp in [1, 2, 4, 8]
        .into_iter()
        .filter(|mp| case.devices.is_multiple_of(*mp))
    {
        for seq in [false, true] {
            let keys = [
                "parallel.mode=semi_auto".to_string(),
                format!("parallel.model_parallel={mp}"),
                format!("parallel.data_parallel={}", case.devices / mp),
                format!("parallel.use_seq_parallel={seq}"),
            ];
            if let Ok(ms) = step_ms(&case.text, &keys) {
                plans.push((format!("semi_auto mp={mp} seq={seq}"), ms));
            }
        }
    }
    plans
}

/// Every search mode's plan predicts a step no longer than plain data parallel's and every
/// hand-written Megatron split's, for 40 seeded configurations.
#[test]
fn no_search_returns_a_plan_slower_than_one_the_user_could_write() {
    let tmp = tempfile::tempdir().unwrap();
    let profiles = profile_files(tmp.path());
    let out = tmp.path().join("run");
    let mut failures = Vec::new();
    for index in 0..40 {
        let case = draw(0x5EA5C4, index, &profiles, &out);
        let written = written_plans(&case);
        let (best, best_ms) = written
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .cloned()
            .unwrap();
        for mode in MODES {
            let searched = step_ms(&case.text, &[format!("parallel.mode={mode}")])
                .unwrap_or_else(|e| panic!("case {index}: {mode}: {e}\n{}", case.text));
            if searched > best_ms * (1.0 + EPSILON) {
                failures.push(format!(
                    "case {index}: {mode} predicts {searched:.6} ms, {best} {best_ms:.6} ms\n{}",
                    case.text
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The GPT whose `ffn_hidden` (4 × 64) equals its byte vocabulary (256): the LM head reading the
/// tied embedding table has the shapes of the MLP's first product but, not being the table's
/// first reader, no gradient sum of its own. Every search costs its plan as the same
/// strategies are costed when configured (the search once charged the LM head the MLP's sum).
#[test]
fn a_search_costs_its_plan_as_the_plan_is_costed_when_configured() {
    let tmp = tempfile::tempdir().unwrap();
    let text = gpt_text(
        "layers = 2\nheads = 1\nhidden = 64\nseq_len = 32\n",
        16,
        8,
        "h100-nvlink-ib",
        &tmp.path().join("run"),
    );
    let config = TrainConfig::parse(&text, None, &[], Path::new("/")).unwrap();
    let (model, _) = runtime::build_model(&config).unwrap();
    let profile = search::profiles::built_in("h100-nvlink-ib").unwrap();
    for mode in [
        SearchMode::ShardingPropagation,
        SearchMode::RecursiveProgramming,
        SearchMode::DynamicProgramming,
    ] {
        let request = SearchRequest {
            mode,
            profile: &profile,
            devices: 8,
            memory_budget: None,
            optimizer_states: 2,
            fixed: BTreeMap::new(),
            hints: BTreeMap::new(),
            time_budget: None,
            only: None,
        };
        let found = search::search(&model.graph, &request).unwrap();
        let strategies: BTreeMap<_, _> = found.strategies.iter().cloned().collect();
        let costed = search::evaluate_strategies(&model.graph, &request, &strategies).unwrap();
        let (a, b) = (found.cost.time(), costed.time());
        assert!(
            (a - b).abs() <= 1e-12 * b.max(1e-9),
            "{mode:?}: the search ranks its plan at {a} s, costed as configured {b} s"
        );
    }
}
