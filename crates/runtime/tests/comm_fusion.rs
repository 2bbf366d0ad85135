//! Communication fusion and reuse: every fusion mode trains one device's numbers (bitwise in
//! deterministic mode), the buckets cover the fusable gradients once each, identical
//! communications share plans up to `comm_reuse`, and bad values are refused naming the key.

use std::path::Path;

use runtime::{Session, TrainConfig};

use crate::run_util::{self, adam_gpt, train_report, DP2, DP2_MP2};

/// Every gradient reduction is in at most one bucket, and each bucket's steps are reductions
/// into gradient buffers.
fn check_buckets(what: &str, session: &Session) -> usize {
    let program = &session.train;
    let mut seen = std::collections::HashSet::new();
    for b in &program.buckets {
        assert_eq!(b.steps.len(), b.params.len(), "{what}");
        for (&s, &p) in b.steps.iter().zip(&b.params) {
            assert!(seen.insert(s), "{what}: step {s} in two buckets");
            let parallel::Step::Reshard(r) = &program.steps[s] else {
                panic!("{what}: bucket step {s} is not a reshard");
            };
            assert_eq!(Some(r.to), program.params[p].grad_buffer, "{what}");
            assert!(
                b.ready_after <= s,
                "{what}: a bucket runs before its steps would"
            );
        }
    }
    program.buckets.len()
}

/// auto, size and index buckets, for all-reduces (data parallel) and reduce-scatters (hsdp
/// level 2 over dp 2 × mp 2): 20 steps within 1e-4 of one device, and the buckets are where
/// the mode puts them.
#[test]
fn every_fusion_mode_trains_one_devices_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 20;
    let (_, reference) = run_util::train_steps(
        &adam_gpt(&tmp.path().join("sa"), "mode = \"stand_alone\"", steps, &[]),
        steps,
    );
    let level2 = "[parallel.hsdp]\noptimizer_level = \"level2\"\nthreshold = 0\n";
    let cases = [
        ("dp 2, auto", format!("{DP2}[parallel.comm_fusion]\n"), Some(1)),
        (
            "dp 2, size 1 MB",
            format!("{DP2}[parallel.comm_fusion]\nallreduce = {{ mode = \"size\", config = 1 }}\n"),
            Some(1),
        ),
        (
            "dp 2, index",
            format!("{DP2}[parallel.comm_fusion]\nallreduce = {{ mode = \"index\", config = [4, 12] }}\n"),
            Some(3),
        ),
        (
            "dp 2 × mp 2, hsdp level 2",
            format!("{DP2_MP2}{level2}[parallel.comm_fusion]\nreducescatter = {{ mode = \"auto\" }}\n"),
            None,
        ),
        (
            "dp 2 × mp 2, hsdp level 3, gathers prefetched",
            format!("{DP2_MP2}[parallel.hsdp]\noptimizer_level = \"level3\"\nthreshold = 0\n[parallel.overlap]\ncomputation_allgather_overlap = true\n"),
            Some(0),
        ),
        (
            "dp 2, fusion off",
            format!("{DP2}[parallel.comm_fusion]\nopenstate = false\n"),
            Some(0),
        ),
    ];
    for (i, (what, parallel, expected)) in cases.iter().enumerate() {
        let cfg = adam_gpt(&tmp.path().join(format!("case-{i}")), parallel, steps, &[]);
        let (session, losses) = run_util::train_steps(&cfg, steps);
        let buckets = check_buckets(what, &session);
        match expected {
            Some(n) => assert_eq!(buckets, *n, "{what}: buckets"),
            None => {
                assert!(buckets > 0, "{what}: some bucket");
                assert!(
                    session.train.buckets.iter().any(|b| b.scatter),
                    "{what}: reduce-scatters fused"
                );
            }
        }
        run_util::assert_losses_within(what, &losses, &reference, 1e-4);
    }
}

/// Fused weight gathers (`allgather`, hsdp `zero1` and `zero2`, which gather the updated pieces): every gather of the bucket's
/// parameters runs as one all-gather per group, including groups of a shard size below the
/// replica count; the weights are the unfused gathers' bits, every rank's memory is as
/// predicted, and the buckets are where the mode puts them.
#[test]
fn fused_weight_gathers_train_the_unfused_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 4;
    let dp4 = "devices = 4\nmode = \"semi_auto\"\nmodel_parallel = 1\n";
    let cases = [
        (
            "dp 2, zero1, auto",
            DP2.to_string(),
            "zero1",
            "",
            "{ mode = \"auto\" }",
            Some(1),
        ),
        (
            "dp 2 × mp 2, zero2, index",
            DP2_MP2.to_string(),
            "zero2",
            "",
            "{ mode = \"index\", config = [6] }",
            None,
        ),
        (
            "dp 4, zero1, shard size 2, size 1 MB",
            dp4.to_string(),
            "zero1",
            "shard_size = 2\n",
            "{ mode = \"size\", config = 1 }",
            None,
        ),
    ];
    for (i, (what, parallel, level, extra, mode, expected)) in cases.iter().enumerate() {
        let hsdp =
            format!("[parallel.hsdp]\noptimizer_level = \"{level}\"\nthreshold = 0\n{extra}");
        let unfused = format!("{parallel}{hsdp}");
        let fused = format!("{parallel}{hsdp}[parallel.comm_fusion]\nallreduce = {{ mode = \"auto\" }}\nreducescatter = {{ mode = \"auto\" }}\nallgather = {mode}\n");
        let plain = format!("{parallel}{hsdp}[parallel.comm_fusion]\nallgather = {{ mode = \"index\", config = [] }}\nopenstate = false\n");
        let run = |name: &str, body: &str| {
            train_report(&adam_gpt(
                &tmp.path().join(format!("{i}-{name}")),
                body,
                steps,
                &[],
            ))
        };
        let (_, _, reference) = run("unfused", &unfused);
        let (session, report, with) = run("fused", &fused);
        let buckets = &session.train.gather_buckets;
        assert!(!buckets.is_empty(), "{what}: a fused gather");
        if let Some(n) = expected {
            assert_eq!(buckets.len(), *n, "{what}: buckets");
        }
        let mut seen = std::collections::HashSet::new();
        for b in buckets {
            for &g in &b.gathers {
                assert!(seen.insert(g), "{what}: gather {g} in two buckets");
            }
            let mut ranks: Vec<usize> = b.groups.iter().flatten().copied().collect();
            ranks.sort_unstable();
            assert_eq!(
                ranks,
                (0..session.devices()).collect::<Vec<_>>(),
                "{what}: every rank once"
            );
        }
        run_util::assert_bitwise_run(what, &with, &reference);
        for (rank, m) in report.ranks[0].memory_by_rank.iter().enumerate() {
            assert_eq!(
                Some(*m),
                session.predict_memory(rank),
                "{what}: rank {rank}'s memory"
            );
        }
        let (session, _, _) = run("off", &plain);
        assert!(
            session.train.gather_buckets.is_empty(),
            "{what}: openstate = false"
        );
    }
}

/// In deterministic mode a fused bucket adds in the canonical tree, as unfused reductions do:
/// data parallel 2 with fusion trains bitwise one device's losses and parameters.
#[test]
fn fused_reductions_stay_bitwise_in_deterministic_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 10;
    let det = ["train.deterministic=true"];
    let (_, _, one) = train_report(&adam_gpt(
        &tmp.path().join("one"),
        "mode = \"stand_alone\"",
        steps,
        &det,
    ));
    let fused =
        format!("{DP2}[parallel.comm_fusion]\nallreduce = {{ mode = \"index\", config = [8] }}\n");
    let (session, _, two) = train_report(&adam_gpt(&tmp.path().join("two"), &fused, steps, &det));
    assert_eq!(check_buckets("deterministic", &session), 2);
    run_util::assert_bitwise_run("fused, deterministic", &two, &one);
}

/// `comm_reuse = -1` shares every identical communication's plan, `0` none, `N` at most N.
#[test]
fn comm_reuse_shares_identical_plans_up_to_its_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let reuse = |value: &str| {
        let parallel = format!("{DP2_MP2}comm_reuse = {value}\n");
        let session = Session::new(&adam_gpt(tmp.path(), &parallel, 1, &[])).unwrap();
        let program = session.train.clone();
        let plans: Vec<&std::sync::Arc<reshard::ReshardPlan>> = program
            .steps
            .iter()
            .filter_map(|s| match s {
                parallel::Step::Reshard(r) => Some(&r.plan),
                parallel::Step::Kernel(_) => None,
            })
            .collect();
        let mut distinct: Vec<*const reshard::ReshardPlan> =
            plans.iter().map(|p| std::sync::Arc::as_ptr(p)).collect();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            program.plan_reuse.total,
            plans.len() + program.weight_gathers.len()
        );
        assert_eq!(
            program.plan_reuse.distinct,
            distinct.len() + program.weight_gathers.len()
        );
        program.plan_reuse
    };
    let all = reuse("-1");
    let none = reuse("0");
    let three = reuse("3");
    assert_eq!(none.distinct, none.total);
    assert!(
        all.distinct < all.total,
        "the GPT repeats its layers' communications"
    );
    assert_eq!(three.distinct, three.total - 3);
}

/// Bad `[parallel.comm_fusion]` and `comm_reuse` values are refused naming the key.
#[test]
fn bad_fusion_settings_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[parallel.comm_fusion]\nallreduce = { mode = \"bogus\" }",
            "parallel.comm_fusion.allreduce.mode",
        ),
        (
            "[parallel.comm_fusion]\nallreduce = { mode = \"size\" }",
            "parallel.comm_fusion.allreduce.config",
        ),
        (
            "[parallel.comm_fusion]\nallreduce = { mode = \"size\", config = 0 }",
            "parallel.comm_fusion.allreduce.config",
        ),
        (
            "[parallel.comm_fusion]\nallreduce = { mode = \"index\", config = [5, 5] }",
            "parallel.comm_fusion.allreduce.config",
        ),
        (
            "[parallel.comm_fusion]\nallreduce = { mode = \"auto\", config = 3 }",
            "parallel.comm_fusion.allreduce.config",
        ),
        (
            "[parallel.comm_fusion]\nbroadcast = { mode = \"auto\" }",
            "parallel.comm_fusion.broadcast",
        ),
        ("comm_reuse = -2", "parallel.comm_reuse"),
    ];
    for (body, key) in cases {
        let (base, table) = match body.strip_prefix("comm_reuse") {
            Some(_) => (format!("{DP2}{body}\n"), ""),
            None => (DP2.to_string(), body),
        };
        let text = format!(
            "[model]\nname = \"gpt\"\nlayers = 1\nheads = 2\nhidden = 8\nseq_len = 8\n[data]\nformat = \"text\"\npath = \"{}\"\nbatch_size = 4\n[parallel]\n{base}{table}\n[train]\nepochs = 1\noptimizer = \"adam\"\nlearning_rate = 0.01\n[output]\ndir = \"{}\"\n",
            run_util::kjv().display(),
            tmp.path().display()
        );
        let err = TrainConfig::parse(&text, None, &[], Path::new("/"))
            .expect_err(body)
            .to_string();
        assert!(err.contains(key), "{body}: {err}");
    }
}

/// A pipelined run fuses its gradient reductions too: the buckets cover them once each and
/// the run gives the unfused pipelined run's losses bit for bit (every element is still the
/// sum over the same ranks, in the same order).
#[test]
fn pipelined_runs_fuse_their_gradients() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 6;
    let pipeline = "devices = 4\nmode = \"semi_auto\"\ndata_parallel = 2\nmodel_parallel = 1\n\
                    [parallel.pipeline]\nstages = 2\nmicro_batches = 2\n";
    let unfused = adam_gpt(&tmp.path().join("unfused"), pipeline, steps, &[]);
    let (session, reference) = run_util::train_steps(&unfused, steps);
    assert_eq!(check_buckets("unfused", &session), 0);
    let fused = adam_gpt(
        &tmp.path().join("fused"),
        &format!("{pipeline}[parallel.comm_fusion]\n"),
        steps,
        &[],
    );
    let (session, losses) = run_util::train_steps(&fused, steps);
    assert!(check_buckets("fused", &session) > 0, "some bucket");
    assert_eq!(losses, reference);
}
