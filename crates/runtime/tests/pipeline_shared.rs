//! Parameters shared across pipeline stages (the GPT's tied embedding table, read by the
//! embedding on the first stage and by the LM head on the last): every stage holding one has
//! its own copy, the copies' gradients are summed across their stages once per step, and the
//! copies stay bitwise equal; `sync_pipeline_shared_parameters` makes differing copies equal.

use std::sync::Arc;

use comm::Communicator;

use parallel::pipeline::{shared_copy_of, step_phases, StepPhase};
use parallel::Step;
use runtime::{RankExecutor, Session};

use crate::run_util::{self, small_gpt, Run};

const TABLE: &str = "embedding.embedding_table";

/// Every copy of a shared parameter on every rank holds the bits of its owner's shard of the
/// same box; returns how many copy shards were compared.
fn assert_copies_equal_owner(what: &str, report: &runtime::TrainReport) -> usize {
    let mut compared = 0;
    for (rank, outcome) in report.ranks.iter().enumerate() {
        for copy in &outcome.shared_copies {
            let (owner, stage) = shared_copy_of(&copy.name).expect("a copy's name");
            let shard = report
                .ranks
                .iter()
                .flat_map(|r| &r.params)
                .find(|p| p.name == owner && p.region == copy.region)
                .unwrap_or_else(|| panic!("{what}: no owner shard of {} {:?}", owner, copy.region));
            let bits = |t: &tensor::Tensor| -> Vec<u32> {
                t.as_f32().unwrap().iter().map(|x| x.to_bits()).collect()
            };
            assert_eq!(
                bits(&copy.values),
                bits(&shard.values),
                "{what}: rank {rank}'s copy {} (stage {stage}) differs from its owner",
                copy.name
            );
            compared += 1;
        }
    }
    compared
}

/// No parameter crosses stages in a micro-batch's passes: every transfer between stages
/// carries an activation or an activation's gradient.
fn assert_no_parameter_transfers(what: &str, session: &Session, per_stage: usize) {
    let program = &session.train;
    let graph = &program.placed.graph;
    let phases = step_phases(program, per_stage);
    for (step, phase) in program.steps.iter().zip(&phases) {
        if let (Step::Reshard(r), StepPhase::Transfer { .. }) = (step, phase) {
            let value = &graph.values()[r.value.0];
            assert!(
                value.producer.is_some(),
                "{what}: parameter {} moves between stages",
                value.name
            );
        }
    }
}

/// The tied embedding across 2 and 4 stages (with model and vocabulary parallelism inside the
/// stages, with data parallelism, with every scheduler): each stage holding the table has its
/// copy, the copies are bitwise equal after 20 steps, and losses and merged parameters equal
/// one device's.
#[test]
fn tied_embedding_copies_stay_identical_and_train_like_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let reference: Run = run_util::train_run(
        &small_gpt(
            &tmp.path().join("sa"),
            "momentum",
            "",
            "mode = \"stand_alone\"",
            &[],
        ),
        20,
    )
    .1;
    let cases: &[(&str, usize, usize, &str)] = &[
        ("2 stages, 1 micro-batch", 2, 1, "[parallel.pipeline]\nstages = 2"),
        (
            "2 stages, 4 micro-batches, 1F1B",
            2,
            1,
            "[parallel.pipeline]\nstages = 2\nmicro_batches = 4",
        ),
        (
            "2 stages × model parallel 2, vocabulary parallel, GPipe",
            4,
            2,
            "model_parallel = 2\nvocab_emb_dp = false\n[parallel.pipeline]\nstages = 2\nmicro_batches = 2\nscheduler = \"gpipe\"",
        ),
        (
            "2 stages × data parallel 2, zero bubble",
            4,
            2,
            "data_parallel = 2\n[parallel.pipeline]\nstages = 2\nmicro_batches = 2\nscheduler = \"zero_bubble\"",
        ),
        (
            "4 stages, 4 micro-batches, 1F1B",
            4,
            1,
            "[parallel.pipeline]\nstages = 4\nmicro_batches = 4",
        ),
        (
            "2 stages × 2 chunks, interleaved 1F1B",
            2,
            1,
            "[parallel.pipeline]\nstages = 2\nmicro_batches = 2\nscheduler = \"interleaved_1f1b\"\nvirtual_stages = 2",
        ),
    ];
    for (i, (name, devices, per_stage, keys)) in cases.iter().enumerate() {
        let config = small_gpt(
            &tmp.path().join(format!("pipe-{i}")),
            "momentum",
            "",
            &run_util::semi(*devices, keys),
            &[],
        );
        let (session, report, run) = run_util::train_report(&config);
        let copies: Vec<&str> = session
            .train
            .params
            .iter()
            .filter_map(|p| shared_copy_of(&p.name).map(|c| c.0))
            .collect();
        assert_eq!(copies, vec![TABLE], "{name}: the table has one copy");
        assert_eq!(session.train.shared.len(), 1, "{name}");
        assert_no_parameter_transfers(name, &session, *per_stage);
        let compared = assert_copies_equal_owner(name, &report);
        assert_eq!(
            compared, *per_stage,
            "{name}: one copy shard per rank of the last stage"
        );
        run_util::assert_losses_within(name, &run.0, &reference.0, 1e-4);
        run_util::assert_same_run(name, &run, &reference, 2e-4);
    }
}

/// Untied embeddings share nothing: no copies.
#[test]
fn untied_embeddings_have_no_copies() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_gpt(
        tmp.path(),
        "momentum",
        "tie_embeddings = false",
        &run_util::semi(2, "[parallel.pipeline]\nstages = 2\nmicro_batches = 2"),
        &["train.max_steps=1".to_string()],
    );
    let session = Session::new(&config).unwrap();
    assert!(session.train.shared.is_empty());
    assert!(session
        .train
        .params
        .iter()
        .all(|p| shared_copy_of(&p.name).is_none()));
}

/// `sync_pipeline_shared_parameters`: copies that start different (each rank initialised from
/// its own seed) end equal to their owner's values, which do not change; the evaluation
/// (inference) program of 2 stages × model parallel 2.
#[test]
fn sync_pipeline_shared_parameters_makes_differing_copies_equal() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_gpt(
        tmp.path(),
        "momentum",
        "",
        &run_util::semi(
            4,
            "model_parallel = 2\nvocab_emb_dp = false\n[parallel.pipeline]\nstages = 2\nmicro_batches = 2",
        ),
        &["train.max_steps=1".to_string()],
    );
    let session = Session::new(&config).unwrap();
    let program = session.eval.clone();
    assert_eq!(program.shared.len(), 1);
    let shared = program.shared[0].clone();
    let cluster = comm::LocalCluster::new(session.devices()).unwrap();
    let results = cluster.run(|comm| {
        let rank = comm.rank();
        let world: Arc<dyn comm::Communicator> = Arc::new(comm);
        let mut exec = RankExecutor::new(program.clone(), world.clone()).unwrap();
        exec.init_parameters(7 + rank as u64).unwrap();
        let mine = shared
            .params
            .iter()
            .copied()
            .find(|&i| exec.holds_param(i))
            .expect("every rank holds the owner or a copy");
        let region = exec.box_of(&program.params[mine].layout).unwrap();
        let before = exec.param(mine).as_f32().unwrap().to_vec();
        let synced = runtime::sync_pipeline_shared_parameters(&mut exec, world.as_ref()).unwrap();
        let after = exec.param(mine).as_f32().unwrap().to_vec();
        (mine, region, before, after, synced)
    });
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    let owner = shared.params[0];
    let mut changed = 0;
    for (rank, (index, region, before, after, synced)) in results.iter().enumerate() {
        assert_eq!(synced, &vec![TABLE.to_string()], "rank {rank}");
        let (_, _, owner_before, owner_after, _) = results
            .iter()
            .find(|(i, r, ..)| *i == owner && r == region)
            .expect("an owner shard of the same box");
        assert_eq!(owner_before, owner_after, "the owner keeps its values");
        assert_eq!(after, owner_before, "rank {rank} holds its owner's values");
        if *index != owner {
            assert_ne!(before, after, "rank {rank}'s copy started different");
            changed += 1;
        }
    }
    assert_eq!(changed, 2, "the two ranks of the last stage hold copies");
}

/// Probe E2: a pipeline whose last stage saves no parameter (a `stage_config` giving the
/// logits and the loss their own stage: the tied table's copy there is not saved) commits a
/// set whose strategy places nothing on that stage's ranks, beside their `rank_<r>/` folders
/// (the step counter only). Every reader takes it: the run resumes on the same pipeline (the
/// losses and parameters of the run that never stopped, bitwise) and on one device, generates,
/// and `ckpt diff`, `verify`, `convert` and `merge` read it.
#[test]
fn a_last_stage_saving_no_parameter_leaves_a_readable_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let pp = run_util::semi(
        2,
        "[parallel.pipeline]\nstages = 2\n[parallel.pipeline.stage_config]\nlogits = 1",
    );
    let alone = "mode = \"stand_alone\"";
    let gpt = |dir: &str, parallel: &str, overrides: &[String]| {
        small_gpt(&tmp.path().join(dir), "adam", "", parallel, overrides)
    };
    // Uninterrupted 20-step runs under the pipeline and on one device.
    let (session, whole_losses) = run_util::train_steps(&gpt("whole", &pp, &[]), 20);
    let (_, alone_losses) = run_util::train_steps(&gpt("alone", alone, &[]), 20);
    let whole = tmp.path().join("whole");
    let strategy = whole.join("strategy.json");
    let resolved = ckpt::Strategy::load(&strategy)
        .unwrap()
        .resolve_scale_free()
        .unwrap();
    assert_eq!(
        resolved.ranks(),
        vec![0],
        "the last stage saves no parameter"
    );
    assert!(whole.join("rank_1").is_dir(), "but it has its rank folder");

    // 10 steps under the pipeline, then the other 10 resumed on the same pipeline and on one
    // device.
    let first_cfg = gpt("first", &pp, &["train.max_steps=10".to_string()]);
    let (_, first_losses) = run_util::train_steps(&first_cfg, 10);
    let resume = format!(
        "output.resume_from=\"{}\"",
        first_cfg.output().dir.display()
    );
    let (_, same) = run_util::train_steps(&gpt("same", &pp, std::slice::from_ref(&resume)), 10);
    let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let continued = [first_losses.clone(), same].concat();
    assert_eq!(
        bits(&continued),
        bits(&whole_losses),
        "resumed on the same pipeline: {continued:?} vs {whole_losses:?}"
    );
    let (_, one) = run_util::train_steps(&gpt("one", alone, &[resume]), 10);
    let continued = [first_losses, one].concat();
    run_util::assert_losses_within("resumed on one device", &continued, &alone_losses, 1e-4);

    // `ckpt diff`: the resumed pipeline's set holds the uninterrupted run's bits; one device's
    // run holds the same parameters within a tolerance.
    let side = |dir: &std::path::Path| (dir.to_path_buf(), dir.join("strategy.json"));
    let diff = |a: &str, b: &str| {
        let (a, sa) = side(&tmp.path().join(a));
        let (b, sb) = side(&tmp.path().join(b));
        ckpt::diff_checkpoints(
            &ckpt::DiffSide {
                dir: &a,
                strategy: &sa,
            },
            &ckpt::DiffSide {
                dir: &b,
                strategy: &sb,
            },
            &mut |_| {},
        )
        .unwrap()
    };
    let report = diff("whole", "same");
    assert!(report.bitwise_equal(), "{report:?}");
    assert!(diff("whole", "alone").within(1e-3));

    // `verify`, `convert` (onto one device's strategy) and `merge` read the set.
    let verified = ckpt::verify_checkpoints(&whole, &strategy, true).unwrap();
    assert!(verified.faults.is_empty(), "{:?}", verified.faults);
    let converted = tmp.path().join("converted");
    ckpt::convert_checkpoints(
        &whole,
        &strategy,
        &converted,
        Some(&tmp.path().join("alone").join("strategy.json")),
        &ckpt::ConvertOptions::default(),
    )
    .unwrap();
    assert!(converted.join("rank_0").is_dir());
    let names = run_util::param_names(&session);
    assert_eq!(run_util::merged_params(&whole, &names).len(), names.len());

    // `tessera generate` loads it: the same text as the resumed run's identical parameters.
    let options = runtime::GenerateOptions {
        prompt: "And God said".to_string(),
        tokens: 12,
        temperature: 0.0,
        seed: 1,
    };
    let text = runtime::generate(&whole, &options).unwrap();
    assert!(text.starts_with("And God said"), "{text}");
    assert_eq!(
        runtime::generate(&tmp.path().join("same"), &options).unwrap(),
        text
    );
}
