//! What `tessera plan` reads of a run's session: each pipeline stage's fullest rank
//! ([`TrainSession::predict_memory_per_stage`], the same figures as
//! [`TrainSession::predict_memory`]), a session built for planning only
//! ([`runtime::Session::for_planning`]), and a search mode's operator strategy file written
//! only once the run passes its checks.

use runtime::{LaunchOptions, Session};

use crate::run_util;

/// Per stage, the fullest rank by [`TrainSession::predict_memory`] of every rank, one by one
/// (the lowest rank among equal peaks).
fn fullest_one_by_one(session: &Session, stages: usize) -> Vec<(usize, usize)> {
    let per_stage = session.devices() / stages;
    (0..stages)
        .map(|stage| {
            let mut fullest: Option<(usize, usize)> = None;
            for rank in stage * per_stage..(stage + 1) * per_stage {
                let peak = session.predict_memory(rank).expect("a prediction").peak;
                if fullest.is_none_or(|(_, most)| peak > most) {
                    fullest = Some((rank, peak));
                }
            }
            fullest.expect("a stage has ranks")
        })
        .collect()
}

/// The per-stage prediction is `predict_memory`'s, stage by stage, with and without
/// pipelined steps, and the session built for planning predicts the same.
#[test]
fn the_fullest_rank_of_each_stage_is_predict_memorys() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("devices = 4\nmode = \"semi_auto\"\ndata_parallel = 2\nmodel_parallel = 2", 1),
        (
            "devices = 4\nmode = \"semi_auto\"\ndata_parallel = 2\n[parallel.pipeline]\nstages = 2\nmicro_batches = 4",
            2,
        ),
        (
            "devices = 4\nmode = \"dynamic_programming\"\n[parallel.pipeline]\nstages = 2\nmicro_batches = 4",
            2,
        ),
        // Ranks whose memory differs within a stage, which must not be taken for one
        // another: uneven blocks of the table (the largest on the last model-parallel rank),
        // ring attention's working blocks, fused weight gathers in groups of 2 of 4 replicas,
        // and gradient buckets in flight.
        (
            "devices = 8\nmode = \"semi_auto\"\ndata_parallel = 2\nmodel_parallel = 4\nvocab_emb_dp = false\n[parallel.manual_split]\nembedding = [40, 40, 56, 120]",
            1,
        ),
        (
            "devices = 4\nmode = \"semi_auto\"\ndata_parallel = 2\ncontext_parallel = 2\ncontext_parallel_algo = \"ring\"",
            1,
        ),
        (
            "devices = 4\nmode = \"semi_auto\"\nmodel_parallel = 1\n[parallel.hsdp]\noptimizer_level = \"zero1\"\nthreshold = 0\nshard_size = 2\n[parallel.comm_fusion]\nallgather = { mode = \"size\", config = 1 }",
            1,
        ),
        (
            "devices = 8\nmode = \"semi_auto\"\ndata_parallel = 2\nmodel_parallel = 2\n[parallel.pipeline]\nstages = 2\nmicro_batches = 2\n[parallel.comm_fusion]\nallreduce = { mode = \"size\", config = 1 }\n[parallel.overlap]\ngrad_computation_allreduce_overlap = true",
            2,
        ),
    ];
    for (i, (parallel, stages)) in cases.into_iter().enumerate() {
        let config =
            run_util::small_gpt(&tmp.path().join(i.to_string()), "adam", "", parallel, &[]);
        let session = Session::new(&config).expect("the session builds");
        let per_stage = session.predict_memory_per_stage().expect("a prediction");
        assert_eq!(per_stage.len(), stages, "{parallel}");
        let expected = fullest_one_by_one(&session, stages);
        for ((rank, report), (want_rank, want_peak)) in per_stage.iter().zip(&expected) {
            assert_eq!((*rank, report.peak), (*want_rank, *want_peak), "{parallel}");
            assert_eq!(Some(*report), session.predict_memory(*rank), "{parallel}");
        }
        let planning = Session::for_planning(&config).expect("the planning session builds");
        assert_eq!(
            planning.op_strategies(),
            session.op_strategies(),
            "{parallel}"
        );
        assert_eq!(
            planning.predict_memory_per_stage().expect("a prediction"),
            per_stage,
            "{parallel}"
        );
    }
}

/// A session built for planning does not compile the evaluation program (its `eval` is the
/// training program) and cannot train: the run is refused before any rank starts, naming
/// `Session::for_planning`, and writes nothing.
#[test]
fn a_planning_session_cannot_train() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let config = run_util::small_gpt(&out, "momentum", "", "devices = 2", &[]);
    let planning = Session::for_planning(&config).expect("the planning session builds");
    assert!(std::sync::Arc::ptr_eq(&planning.eval, &planning.train));
    let full = Session::new(&config).expect("the session builds");
    assert!(!std::sync::Arc::ptr_eq(&full.eval, &full.train));
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    let err = runtime::train_local(&planning, &options)
        .expect_err("a planning session trained")
        .to_string();
    assert!(err.contains("Session::for_planning"), "{err}");
    assert!(!out.exists(), "a refused run created {}", out.display());
}

/// In a search mode, `parallel.save_operator_strategy_file` is written when the run starts
/// (after its checks, so that a refused run writes nothing), not when the session is built.
#[test]
fn the_searched_strategies_are_saved_when_the_run_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("ops").join("ops.json");
    let config = run_util::small_gpt(
        &tmp.path().join("run"),
        "momentum",
        "",
        &format!(
            "devices = 2\nmode = \"dynamic_programming\"\nsave_operator_strategy_file = \"{}\"",
            file.display()
        ),
        &[],
    );
    let session = Session::new(&config).expect("the session builds");
    assert!(
        !file.exists(),
        "building the session wrote {}",
        file.display()
    );
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    runtime::train_local(&session, &options).expect("training runs");
    let records = ckpt::read_operator_strategy_file(&file).expect("the saved strategies");
    let placed: Vec<String> = session
        .op_strategies()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert!(records.iter().all(|r| placed.contains(&r.name)));
    assert!(!records.is_empty());
}

/// A search mode's session keeps the plan it was placed by
/// ([`runtime::TrainSession::searched_plan`], what `tessera plan` prints instead of searching
/// a second time), and it is [`runtime::plan`]'s for the configuration: strategies, costs,
/// pipeline and memory estimate (`search_ms` aside); outside the search modes there is none.
#[test]
fn a_search_modes_session_keeps_the_plan_it_was_placed_by() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        "devices = 4\nmode = \"sharding_propagation\"",
        "devices = 4\nmode = \"recursive_programming\"",
        "devices = 4\nmode = \"dynamic_programming\"",
        "devices = 4\nmode = \"dynamic_programming\"\n[parallel.pipeline]\nstages = 2\nmicro_batches = 4",
        "devices = 2\nmode = \"dynamic_programming\"\nauto_pipeline = true\n[parallel.pipeline]\nstages = 1\nmicro_batches = 4",
    ];
    for (i, parallel) in cases.into_iter().enumerate() {
        let config =
            run_util::small_gpt(&tmp.path().join(i.to_string()), "adam", "", parallel, &[]);
        let planned = runtime::plan(&config).expect("a plan");
        let session = Session::for_planning(&config).expect("the planning session builds");
        let kept = session.searched_plan().expect("a searched plan");
        assert_eq!(kept.strategies, planned.strategies, "{parallel}");
        assert_eq!(
            format!("{:?}", kept.cost),
            format!("{:?}", planned.cost),
            "{parallel}"
        );
        assert_eq!(
            format!("{:?}", kept.pipeline),
            format!("{:?}", planned.pipeline),
            "{parallel}"
        );
        assert_eq!(
            (kept.devices, kept.memory_budget, kept.gap, kept.n_ops),
            (
                planned.devices,
                planned.memory_budget,
                planned.gap,
                planned.n_ops
            ),
            "{parallel}"
        );
        let placed: std::collections::BTreeMap<String, Vec<Vec<usize>>> = session
            .op_strategies()
            .into_iter()
            .map(|r| (r.name, r.inputs))
            .collect();
        for (name, strategy) in &kept.strategies {
            assert_eq!(placed.get(name), Some(strategy), "{parallel}: {name}");
        }
    }
    let config = run_util::small_gpt(
        &tmp.path().join("semi"),
        "adam",
        "",
        "devices = 2\nmode = \"semi_auto\"",
        &[],
    );
    let session = Session::for_planning(&config).expect("the planning session builds");
    assert!(session.searched_plan().is_none());
}

/// The preflight memory check's figures ([`runtime::TrainSession::predict_footprints`], one
/// prediction per distinct footprint) are [`runtime::TrainSession::predict_footprint`]'s rank
/// by rank, in any order of the ranks: where all ranks share one class (data parallel), where
/// stages hold different micro-batches, and where ranks of one stage hold uneven blocks.
#[test]
fn footprints_predicted_once_per_class_are_each_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        "devices = 8\nmode = \"semi_auto\"\ndata_parallel = 8",
        "devices = 8\nmode = \"semi_auto\"\ndata_parallel = 2\nmodel_parallel = 2\n[parallel.pipeline]\nstages = 2\nmicro_batches = 4",
        "devices = 8\nmode = \"semi_auto\"\ndata_parallel = 2\nmodel_parallel = 4\nvocab_emb_dp = false\n[parallel.manual_split]\nembedding = [40, 40, 56, 120]",
    ];
    for (i, parallel) in cases.into_iter().enumerate() {
        let config =
            run_util::small_gpt(&tmp.path().join(i.to_string()), "adam", "", parallel, &[]);
        let session = Session::new(&config).expect("the session builds");
        let mut ranks: Vec<usize> = (0..session.devices()).collect();
        ranks.reverse();
        ranks.extend([3, 0, 5]);
        for local in [true, false] {
            let each: Vec<_> = ranks
                .iter()
                .map(|&rank| session.predict_footprint(rank, local))
                .collect();
            assert!(each.iter().all(Option::is_some), "{parallel}");
            // Past the first case the ranks' footprints differ: one class for all would fail.
            assert_eq!(
                each.iter().any(|f| *f != each[0]),
                i > 0,
                "{parallel} (local backend: {local})"
            );
            assert_eq!(
                session.predict_footprints(&ranks, local),
                each,
                "{parallel} (local backend: {local})"
            );
        }
    }
}

/// A search mode builds the GPT with FlashAttention (ring attention's sequence split is among
/// its candidates) and searches the packed attention's graph too where the sequence stays
/// whole, keeping the plan that predicts the shorter step: the plan is never slower than
/// either graph's own search, and on a 12-head GPT over 8 devices the packed graph's is the
/// faster (the search alone on FlashAttention's graph predicted 11.17 ms there against plain
/// data parallel's 10.08 ms, `tessera plan` of `scripts/bench_plan.sh`'s config).
#[test]
fn a_search_mode_keeps_the_faster_of_its_two_attention_graphs() {
    let tmp = tempfile::tempdir().unwrap();
    let config = run_util::small_gpt(
        tmp.path(),
        "adamw",
        "",
        "devices = 8\nmode = \"dynamic_programming\"",
        &[
            "model.heads=16".to_string(),
            "model.hidden=256".to_string(),
            "model.seq_len=64".to_string(),
            "model.ffn_hidden=1024".to_string(),
            "data.batch_size=1024".to_string(),
            "data.steps_per_epoch=1".to_string(),
        ],
    );
    let (model, gpt) = runtime::build_model(&config).unwrap();
    let gpt = gpt.expect("a GPT");
    assert!(!gpt.packed_attention, "a search mode builds FlashAttention");
    let flash = runtime::plan_model(&config, &model, Some(&gpt)).unwrap();
    let packed_gpt = models::GptConfig {
        packed_attention: true,
        ..gpt.clone()
    };
    let packed_model = models::gpt(&packed_gpt, tensor::DType::F32).unwrap();
    let packed = runtime::plan_model(&config, &packed_model, Some(&packed_gpt)).unwrap();
    assert!(
        packed.step_ms() < flash.step_ms(),
        "packed {} ms, flash {} ms",
        packed.step_ms(),
        flash.step_ms()
    );
    let chosen = runtime::plan(&config).unwrap();
    assert_eq!(chosen.strategies, packed.strategies);
    let session = Session::for_planning(&config).unwrap();
    let kept = session.searched_plan().expect("a searched plan");
    // The session placed the packed graph: its strategies name that graph's ops.
    assert_eq!(kept.strategies, packed.strategies);
}
