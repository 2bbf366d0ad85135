//! The pipeline schedules, configuration and stage assignment (`parallel::pipeline`), checked by
//! simulation: every generator for P ≤ 16 and M ≤ 64 in both simulation modes, the bubble and
//! memory figures against their closed forms, and every error naming its culprit.

use std::collections::HashMap;

use parallel::pipeline::*;

const MAX_P: usize = 16;
const MAX_M: usize = 64;

/// Counts, independently of `Schedule::from_lists`, every (kind, micro-batch, chunk) on every
/// stage and asserts the forward and one backward form occur exactly once.
fn assert_each_action_once(schedule: &Schedule, label: &str) {
    for (stage, actions) in schedule.per_stage().iter().enumerate() {
        let mut counts: HashMap<(ActionKind, usize, usize), usize> = HashMap::new();
        for action in actions {
            *counts
                .entry((action.kind, action.micro_batch, action.chunk))
                .or_default() += 1;
        }
        let mut expected_len = 0;
        for mb in 0..schedule.micro_batches() {
            for chunk in 0..schedule.chunks() {
                let count = |kind| counts.get(&(kind, mb, chunk)).copied().unwrap_or(0);
                assert_eq!(
                    count(ActionKind::Forward),
                    1,
                    "{label} stage {stage} F {mb} {chunk}"
                );
                let full = count(ActionKind::Backward);
                let split = (
                    count(ActionKind::BackwardInput),
                    count(ActionKind::BackwardWeight),
                );
                assert!(
                    (full, split) == (1, (0, 0)) || (full, split) == (0, (1, 1)),
                    "{label} stage {stage} mb {mb} chunk {chunk}: backward {full} {split:?}"
                );
                expected_len += 2 + split.0;
            }
        }
        assert_eq!(actions.len(), expected_len, "{label} stage {stage}");
    }
}

/// Checks, independently of `check_communication`, that every send in the program has exactly
/// one receive on its peer with the same payload, micro-batch and chunks, and that the number of
/// transfers is what the model cut implies.
fn assert_sends_matched(schedule: &Schedule, program: &[Vec<ProgramStep>], label: &str) {
    let mut sends: HashMap<(usize, usize, Payload, usize, usize, usize), usize> = HashMap::new();
    let mut recvs = sends.clone();
    for (stage, steps) in program.iter().enumerate() {
        for step in steps {
            if let ProgramStep::Comm(e) = step {
                match e.direction {
                    Direction::Send => {
                        *sends
                            .entry((
                                stage,
                                e.peer,
                                e.payload,
                                e.micro_batch,
                                e.chunk,
                                e.peer_chunk,
                            ))
                            .or_default() += 1
                    }
                    Direction::Recv => {
                        *recvs
                            .entry((
                                e.peer,
                                stage,
                                e.payload,
                                e.micro_batch,
                                e.peer_chunk,
                                e.chunk,
                            ))
                            .or_default() += 1
                    }
                }
            }
        }
    }
    assert_eq!(sends, recvs, "{label}: sends and receives differ");
    assert!(
        sends.values().all(|n| *n == 1),
        "{label}: a transfer repeats"
    );
    // The model has P·V pieces; each of the P·V − 1 cuts between neighbouring pieces is crossed
    // once forward and once backward per micro-batch, unless both pieces are on the same stage
    // (P = 1).
    let (p, v, m) = (
        schedule.stages(),
        schedule.chunks(),
        schedule.micro_batches(),
    );
    let cuts = if p == 1 { 0 } else { p * v - 1 };
    assert_eq!(sends.len(), 2 * cuts * m, "{label}: transfer count");
}

fn check_all_modes(schedule: &Schedule, durations: &Durations, label: &str) -> CheckReport {
    assert_each_action_once(schedule, label);
    let report = check_schedule(schedule, durations).unwrap_or_else(|e| panic!("{label}: {e}"));
    assert_sends_matched(schedule, &report.program, label);
    // The default (unit-duration) program must be deadlock-free too.
    let unit_program = schedule.program(CommOrder::Linearized).unwrap();
    simulate_blocking(schedule, &unit_program, durations)
        .unwrap_or_else(|e| panic!("{label} unit program: {e}"));
    // Both modes run the same actions, so the same busy time; rendezvous cannot be faster.
    assert_eq!(report.dependency.busy, report.blocking.busy, "{label}");
    assert!(
        report.blocking.makespan >= report.dependency.makespan - 1e-9,
        "{label}: blocking faster than buffered"
    );
    report
}

#[test]
fn every_scheduler_is_deadlock_free_and_complete_for_p_up_to_16_and_m_up_to_64() {
    let durations = Durations::uniform(1.0, 1.0, 1.0);
    let mut checked = 0;
    for p in 1..=MAX_P {
        for m in 1..=MAX_M {
            for scheduler in Scheduler::ALL {
                let mut config = PipelineConfig::new(p, m, scheduler);
                if scheduler == Scheduler::Interleaved1F1B && m % p != 0 {
                    assert!(config.validate(p).is_err());
                    continue;
                }
                config.validate(p).unwrap();
                let schedule = Schedule::generate(&config).unwrap();
                let report =
                    check_all_modes(&schedule, &durations, &format!("{scheduler} P={p} M={m}"));
                checked += 1;
                // Without chunks, the linearized program's rendezvous never make a stage wait
                // longer than buffered sends would.
                if scheduler != Scheduler::Interleaved1F1B {
                    assert_eq!(
                        report.blocking.makespan, report.dependency.makespan,
                        "{scheduler} P={p} M={m}"
                    );
                }
                if scheduler == Scheduler::GPipe && p <= 4 {
                    config = config.with_virtual_stages(3);
                    let schedule = Schedule::generate(&config).unwrap();
                    check_all_modes(&schedule, &durations, &format!("gpipe V=3 P={p} M={m}"));
                }
            }
        }
    }
    assert!(checked > 3 * MAX_P * MAX_M);
}

#[test]
fn interleaved_generator_is_deadlock_free_for_every_chunk_count() {
    let durations = Durations::uniform(1.0, 1.0, 1.0);
    for p in 1..=8 {
        for m in (p..=MAX_M).step_by(p) {
            for v in [2, 3, 4] {
                let schedule = Schedule::interleaved_1f1b(p, m, v).unwrap();
                check_all_modes(
                    &schedule,
                    &durations,
                    &format!("interleaved P={p} M={m} V={v}"),
                );
            }
        }
    }
    for p in [12, 16] {
        for m in (p..=MAX_M).step_by(p) {
            let schedule = Schedule::interleaved_1f1b(p, m, 2).unwrap();
            check_all_modes(
                &schedule,
                &durations,
                &format!("interleaved P={p} M={m} V=2"),
            );
        }
    }
}

#[test]
fn gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1_exactly() {
    // F = B = 1 (full backward = Bi + W = 1 + 0), and B = 2F: the makespan is (M + P − 1)(F + B)
    // and every stage is busy M(F + B), so the bubble is (P − 1)/(M + P − 1) for both ratios.
    for (forward, backward) in [(1.0, 1.0), (1.0, 2.0)] {
        let durations = Durations::uniform(forward, backward, 0.0);
        for p in 1..=MAX_P {
            for m in 1..=MAX_M {
                for schedule in [
                    Schedule::gpipe(p, m, 1).unwrap(),
                    Schedule::one_f_one_b(p, m).unwrap(),
                ] {
                    let report = simulate(&schedule, &durations).unwrap();
                    let expected = (m + p - 1) as f64 * (forward + backward);
                    assert_eq!(report.makespan, expected, "P={p} M={m} B={backward}");
                    let bubble = (p - 1) as f64 / (m + p - 1) as f64;
                    assert!((report.bubble_fraction - bubble).abs() < 1e-12);
                }
            }
        }
    }
}

#[test]
fn one_f_one_b_holds_min_p_minus_s_m_activations_and_gpipe_holds_m() {
    for p in 1..=MAX_P {
        for m in 1..=MAX_M {
            let durations = Durations::uniform(1.0, 1.0, 1.0);
            let one_f_one_b = simulate(&Schedule::one_f_one_b(p, m).unwrap(), &durations).unwrap();
            let gpipe = simulate(&Schedule::gpipe(p, m, 1).unwrap(), &durations).unwrap();
            let zero_bubble =
                simulate(&Schedule::zero_bubble_h1(p, m).unwrap(), &durations).unwrap();
            for s in 0..p {
                assert_eq!(
                    one_f_one_b.peak_activations[s],
                    (p - s).min(m),
                    "P={p} M={m} s={s}"
                );
                assert_eq!(gpipe.peak_activations[s], m, "P={p} M={m} s={s}");
                // ZB-H1 keeps 1F1B's activation peak, never more than P micro-batches' inputs
                // for the deferred weight gradients, and at most s + 1 pending weight halves.
                assert_eq!(zero_bubble.peak_activations[s], (p - s).min(m));
                assert!(
                    zero_bubble.peak_retained[s] <= p.min(m),
                    "P={p} M={m} s={s}"
                );
                assert!(zero_bubble.peak_pending_weight_gradients[s] <= (s + 1).min(m));
                assert_eq!(one_f_one_b.peak_pending_weight_gradients[s], 0);
            }
        }
    }
}

#[test]
fn zero_bubble_beats_1f1b_and_meets_the_zb_h1_formula() {
    // F = Bi = W = 1; 1F1B's full backward takes Bi + W = 2. ZB-H1's bubble per stage is
    // (P − 1)(F + Bi − W) = P − 1 against 1F1B's (P − 1)(F + Bi + W) = 3(P − 1).
    let durations = Durations::uniform(1.0, 1.0, 1.0);
    for p in 2..=MAX_P {
        for m in p..=MAX_M {
            let zero_bubble =
                simulate(&Schedule::zero_bubble_h1(p, m).unwrap(), &durations).unwrap();
            let one_f_one_b = simulate(&Schedule::one_f_one_b(p, m).unwrap(), &durations).unwrap();
            assert!(
                zero_bubble.bubble_fraction < one_f_one_b.bubble_fraction,
                "P={p} M={m}: {} vs {}",
                zero_bubble.bubble_fraction,
                one_f_one_b.bubble_fraction
            );
            assert_eq!(zero_bubble.makespan, (3 * m + p - 1) as f64, "P={p} M={m}");
        }
    }
}

#[test]
fn interleaving_lowers_the_bubble_to_megatrons_formula() {
    assert_eq!(
        Schedule::interleaved_1f1b(4, 5, 3),
        Err(PipelineError::MicroBatchesNotMultipleOfStages {
            micro_batches: 5,
            stages: 4
        })
    );
    // With V chunks each chunk's pass takes 1/V of the stage's: F = 1/V, B = 2/V. Megatron's
    // bubble time is (P − 1)(F + B)/V over the whole step's M(F + B).
    for p in 2..=8 {
        for m in (p..=MAX_M).step_by(p) {
            let one_f_one_b = simulate(
                &Schedule::one_f_one_b(p, m).unwrap(),
                &Durations::uniform(1.0, 2.0, 0.0),
            )
            .unwrap();
            for v in [2usize, 4] {
                let unit = 1.0 / v as f64;
                let durations = Durations::uniform(unit, 2.0 * unit, 0.0);
                let interleaved =
                    simulate(&Schedule::interleaved_1f1b(p, m, v).unwrap(), &durations).unwrap();
                assert!(
                    interleaved.bubble_fraction < one_f_one_b.bubble_fraction,
                    "P={p} M={m} V={v}"
                );
                let expected = 3.0 * m as f64 + 3.0 * (p - 1) as f64 / v as f64;
                assert!(
                    (interleaved.makespan - expected).abs() < 1e-9,
                    "P={p} M={m} V={v}: makespan {} expected {expected}",
                    interleaved.makespan
                );
            }
        }
    }
}

#[test]
fn p2p_latency_adds_to_each_hop() {
    // GPipe, P = 2, M = 1: F, hop, F, B, hop, B.
    let schedule = Schedule::gpipe(2, 1, 1).unwrap();
    let durations = Durations::uniform(1.0, 2.0, 0.0).with_latency(0.5);
    let report = check_schedule(&schedule, &durations).unwrap();
    assert_eq!(report.dependency.makespan, 7.0);
    assert_eq!(report.blocking.makespan, 7.0);
}

#[test]
fn per_stage_durations_put_the_slow_stage_on_the_critical_path() {
    let schedule = Schedule::one_f_one_b(2, 4).unwrap();
    let durations = Durations::per_stage(vec![1.0, 2.0], vec![1.0, 2.0], vec![0.0, 0.0]);
    let report = simulate(&schedule, &durations).unwrap();
    assert_eq!(report.busy, vec![8.0, 16.0]);
    // Stage 1 runs back to back once its first input arrives at t = 1.
    assert_eq!(report.makespan, 1.0 + 16.0 + 1.0);
}

#[test]
fn p2_m8_figures() {
    // The figures quoted in the issue note: P = 2, M = 8, F = Bi = W = 1 (full B = 2),
    // interleaved with 2 chunks of half the time each.
    let figures = |scheduler: Scheduler| {
        let config = PipelineConfig::new(2, 8, scheduler);
        let v = config.chunks() as f64;
        let schedule = Schedule::generate(&config).unwrap();
        let report =
            check_schedule(&schedule, &Durations::uniform(1.0 / v, 1.0 / v, 1.0 / v)).unwrap();
        println!(
            "{scheduler}: bubble {:.4} (blocking {:.4}), makespan {}, peak activations {:?}",
            report.dependency.bubble_fraction,
            report.blocking.bubble_fraction,
            report.dependency.makespan,
            report.dependency.peak_activations
        );
        report
    };
    assert!((figures(Scheduler::GPipe).dependency.bubble_fraction - 1.0 / 9.0).abs() < 1e-12);
    assert!((figures(Scheduler::OneFOneB).dependency.bubble_fraction - 1.0 / 9.0).abs() < 1e-12);
    let interleaved = figures(Scheduler::Interleaved1F1B).dependency;
    assert!((interleaved.bubble_fraction - 1.5 / 25.5).abs() < 1e-12);
    let zero_bubble = figures(Scheduler::ZeroBubble).dependency;
    assert!((zero_bubble.bubble_fraction - 1.0 / 25.0).abs() < 1e-12);
}

// ---- the checker catches broken schedules and programs ----

fn action(kind: ActionKind, mb: usize) -> Action {
    Action::new(kind, mb, 0)
}

#[test]
fn a_cross_stage_cycle_is_reported_as_a_deadlock_naming_both_stages() {
    use ActionKind::{Backward as B, Forward as F};
    // Stage 0 needs stage 1's B(0) before F(1); stage 1 runs F(1) first.
    let schedule = Schedule::from_lists(
        2,
        2,
        1,
        vec![
            vec![action(F, 0), action(B, 0), action(F, 1), action(B, 1)],
            vec![action(F, 1), action(B, 1), action(F, 0), action(B, 0)],
        ],
    )
    .unwrap();
    let error = simulate(&schedule, &Durations::uniform(1.0, 1.0, 1.0)).unwrap_err();
    let PipelineError::Deadlock { mode, stuck } = &error else {
        panic!("{error}");
    };
    assert_eq!(*mode, "dependency");
    assert_eq!(stuck.len(), 2);
    assert_eq!(stuck[0].stage, 0);
    assert_eq!(stuck[0].step, "B(mb 0, chunk 0)");
    assert_eq!(stuck[0].waiting_for, "B(mb 0, chunk 0) on stage 1");
    assert_eq!(stuck[1].step, "F(mb 1, chunk 0)");
    assert!(
        error
            .to_string()
            .contains("stage 1 stuck at F(mb 1, chunk 0)"),
        "{error}"
    );
    // No program can be ordered for it either.
    assert!(matches!(
        schedule.program(CommOrder::Linearized),
        Err(PipelineError::Deadlock { .. })
    ));
}

#[test]
fn sends_placed_at_use_deadlock_1f1b_under_rendezvous_but_not_when_buffered() {
    let schedule = Schedule::one_f_one_b(2, 4).unwrap();
    let durations = Durations::uniform(1.0, 1.0, 1.0);
    let at_use = schedule.program(CommOrder::AtUse).unwrap();
    check_communication(&schedule, &at_use).unwrap();
    simulate(&schedule, &durations).unwrap();
    let error = simulate_blocking(&schedule, &at_use, &durations).unwrap_err();
    let PipelineError::Deadlock { mode, stuck } = &error else {
        panic!("{error}");
    };
    assert_eq!(*mode, "blocking");
    // Stage 0 sends F(1)'s activation while stage 1 sends B(0)'s gradient.
    assert!(
        stuck[0].step.starts_with("send activation of mb 1"),
        "{error}"
    );
    assert!(
        stuck[1].step.starts_with("send gradient of mb 0"),
        "{error}"
    );
    // The linearized program of the same schedule runs.
    let linearized = schedule.program(CommOrder::Linearized).unwrap();
    simulate_blocking(&schedule, &linearized, &durations).unwrap();
}

#[test]
fn a_missing_receive_a_duplicate_send_and_a_misplaced_send_are_caught() {
    let schedule = Schedule::one_f_one_b(3, 3).unwrap();
    let program = schedule.program(CommOrder::Linearized).unwrap();
    let is_recv =
        |step: &ProgramStep| matches!(step, ProgramStep::Comm(e) if e.direction == Direction::Recv);
    let is_send =
        |step: &ProgramStep| matches!(step, ProgramStep::Comm(e) if e.direction == Direction::Send);

    let mut missing = program.clone();
    let at = missing[1].iter().position(is_recv).unwrap();
    missing[1].remove(at);
    let error = check_communication(&schedule, &missing).unwrap_err();
    assert!(
        matches!(error, PipelineError::UnmatchedCommunication { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("1 sends and 0 receives"),
        "{error}"
    );

    let mut duplicated = program.clone();
    let at = duplicated[0].iter().position(is_send).unwrap();
    let send = duplicated[0][at];
    duplicated[0].insert(at, send);
    let error = check_communication(&schedule, &duplicated).unwrap_err();
    assert!(
        error.to_string().contains("2 sends and 1 receives"),
        "{error}"
    );

    // A program of another schedule, or of too few stages.
    // (Stage 0 of 1F1B at P = M = 3 is GPipe's list: F F F B B B; stage 1 is the first to differ.)
    let other = Schedule::gpipe(3, 3, 1).unwrap();
    assert_eq!(
        check_communication(&other, &program),
        Err(PipelineError::ProgramDiffersFromSchedule { stage: 1 })
    );
    assert!(matches!(
        check_communication(&schedule, &program[..2]),
        Err(PipelineError::WrongStageCount {
            what: "program",
            ..
        })
    ));

    // A send moved before the forward that produces it.
    let mut early = program.clone();
    let at = early[0].iter().position(is_send).unwrap();
    let send = early[0].remove(at);
    early[0].insert(0, send);
    let error =
        simulate_blocking(&schedule, &early, &Durations::uniform(1.0, 1.0, 1.0)).unwrap_err();
    assert!(
        matches!(error, PipelineError::InputNotReady { stage: 0, .. }),
        "{error}"
    );
}

#[test]
fn a_missing_or_repeated_action_is_refused_naming_it() {
    use ActionKind::{Backward as B, BackwardInput as Bi, BackwardWeight as W, Forward as F};
    let error = Schedule::from_lists(
        1,
        2,
        1,
        vec![vec![action(F, 0), action(B, 0), action(F, 1)]],
    )
    .unwrap_err();
    assert_eq!(
        error,
        PipelineError::ActionCount {
            stage: 0,
            action: "B(mb 1, chunk 0)".to_string(),
            count: 0,
            expected: 1
        }
    );
    let error = Schedule::from_lists(
        1,
        1,
        1,
        vec![vec![action(F, 0), action(F, 0), action(B, 0)]],
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("F(mb 0, chunk 0) occurs 2 times"),
        "{error}"
    );
    // A split backward without its weight half.
    let error = Schedule::from_lists(1, 1, 1, vec![vec![action(F, 0), action(Bi, 0)]]).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("W(mb 0, chunk 0) occurs 0 times"),
        "{error}"
    );
    // Both a full and a split backward.
    let error = Schedule::from_lists(
        1,
        1,
        1,
        vec![vec![
            action(F, 0),
            action(B, 0),
            action(Bi, 0),
            action(W, 0),
        ]],
    )
    .unwrap_err();
    assert!(
        matches!(error, PipelineError::ActionCount { .. }),
        "{error}"
    );
    // Out of range micro-batch, wrong stage count.
    let error = Schedule::from_lists(1, 1, 1, vec![vec![action(F, 3)]]).unwrap_err();
    assert!(
        matches!(error, PipelineError::ActionOutOfRange { .. }),
        "{error}"
    );
    let schedule = Schedule::one_f_one_b(2, 2).unwrap();
    assert_eq!(schedule.dependencies(2, action(F, 0)), None);
    assert_eq!(schedule.dependencies(0, action(F, 2)), None);
    assert_eq!(schedule.dependencies(0, Action::new(F, 0, 1)), None);
    assert_eq!(schedule.dependencies(0, action(F, 0)), Some(vec![]));
    assert_eq!(
        Schedule::from_lists(2, 1, 1, vec![vec![]]),
        Err(PipelineError::WrongStageCount {
            what: "schedule",
            given: 1,
            stages: 2
        })
    );
}

#[test]
fn a_weight_half_before_its_input_half_deadlocks_on_its_own_stage() {
    use ActionKind::{BackwardInput as Bi, BackwardWeight as W, Forward as F};
    let schedule = Schedule::from_lists(
        1,
        1,
        1,
        vec![vec![action(F, 0), action(W, 0), action(Bi, 0)]],
    )
    .unwrap();
    let error = simulate(&schedule, &Durations::uniform(1.0, 1.0, 1.0)).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("stuck at W(mb 0, chunk 0) waiting for Bi(mb 0, chunk 0)"),
        "{error}"
    );
}

#[test]
fn bad_durations_are_refused() {
    let schedule = Schedule::one_f_one_b(2, 2).unwrap();
    for durations in [
        Durations::uniform(-1.0, 1.0, 1.0),
        Durations::uniform(f64::NAN, 1.0, 1.0),
        Durations::uniform(1.0, 1.0, 1.0).with_latency(f64::INFINITY),
        Durations::per_stage(vec![1.0; 3], vec![1.0], vec![1.0]),
    ] {
        let error = simulate(&schedule, &durations).unwrap_err();
        assert!(
            matches!(error, PipelineError::InvalidDuration { .. }),
            "{error}"
        );
    }
    // Zero durations are allowed and still give a deadlock-free program.
    check_schedule(&schedule, &Durations::uniform(1.0, 0.0, 0.0)).unwrap();
    check_schedule(&schedule, &Durations::uniform(0.0, 0.0, 0.0)).unwrap();
}

// ---- configuration ----

#[test]
fn every_config_rule_has_its_error_naming_the_key_and_value() {
    let base = |scheduler| PipelineConfig::new(2, 4, scheduler);
    let cases: Vec<(PipelineConfig, usize, &str, &str)> = vec![
        (
            PipelineConfig::new(0, 4, Scheduler::OneFOneB),
            4,
            "parallel.pipeline.stages = 0",
            "at least 1",
        ),
        (
            PipelineConfig::new(5000, 4, Scheduler::OneFOneB),
            5000,
            "parallel.pipeline.stages = 5000",
            "at most 4096",
        ),
        (
            base(Scheduler::OneFOneB),
            3,
            "parallel.pipeline.stages = 2",
            "divide the device count 3",
        ),
        (
            PipelineConfig::new(2, 0, Scheduler::OneFOneB),
            4,
            "parallel.pipeline.micro_batches = 0",
            "at least 1",
        ),
        (
            PipelineConfig::new(2, 70000, Scheduler::GPipe),
            4,
            "parallel.pipeline.micro_batches = 70000",
            "at most 65536",
        ),
        (
            base(Scheduler::GPipe).with_virtual_stages(1),
            4,
            "parallel.pipeline.virtual_stages = 1",
            "between 2 and 64",
        ),
        (
            base(Scheduler::GPipe).with_virtual_stages(65),
            4,
            "parallel.pipeline.virtual_stages = 65",
            "between 2 and 64",
        ),
        (
            base(Scheduler::OneFOneB).with_virtual_stages(2),
            4,
            "parallel.pipeline.interleave = true",
            "\"1f1b\"",
        ),
        (
            base(Scheduler::ZeroBubble).with_virtual_stages(2),
            4,
            "parallel.pipeline.interleave = true",
            "\"zero_bubble\"",
        ),
        (
            PipelineConfig {
                interleave: false,
                ..base(Scheduler::Interleaved1F1B)
            },
            4,
            "parallel.pipeline.scheduler = \"interleaved_1f1b\"",
            "needs interleave = true",
        ),
        (
            PipelineConfig::new(4, 6, Scheduler::Interleaved1F1B),
            4,
            "parallel.pipeline.micro_batches = 6",
            "multiple of parallel.pipeline.stages = 4",
        ),
        (
            PipelineConfig::new(4096, 4096, Scheduler::GPipe).with_virtual_stages(2),
            4096,
            "parallel.pipeline",
            "more than the bound",
        ),
        (
            base(Scheduler::GPipe).with_stage("blocks.0", 2),
            4,
            "parallel.pipeline.stage_config.\"blocks.0\" = 2",
            "below 2",
        ),
        (
            base(Scheduler::GPipe).with_stage("", 0),
            4,
            "parallel.pipeline.stage_config",
            "empty",
        ),
        (
            base(Scheduler::GPipe).with_stage("a", 0).with_stage("a", 1),
            4,
            "parallel.pipeline.stage_config.\"a\"",
            "twice",
        ),
    ];
    for (config, devices, key, rule) in cases {
        let error = config.validate(devices).unwrap_err();
        let message = error.to_string();
        assert!(message.contains(key) && message.contains(rule), "{message}");
        // The generators refuse the same configurations (all but the device-count rule).
        if devices % config.stages.max(1) == 0 {
            assert!(Schedule::generate(&config).is_err(), "{message}");
        }
    }
    assert_eq!(
        PipelineConfig::new(2, 4, Scheduler::OneFOneB).validate(3),
        Err(PipelineError::StagesDoNotDivideDevices {
            stages: 2,
            devices: 3
        })
    );
    assert!(matches!(
        PipelineConfig::new(1, 1, Scheduler::GPipe).validate(0),
        Err(PipelineError::StagesDoNotDivideDevices { devices: 0, .. })
    ));
    // Fewer micro-batches than stages is fine for every non-interleaved scheduler.
    for scheduler in [Scheduler::GPipe, Scheduler::OneFOneB, Scheduler::ZeroBubble] {
        PipelineConfig::new(8, 3, scheduler).validate(8).unwrap();
    }
    // interleave = true with GPipe runs chunks under GPipe.
    let config = PipelineConfig::new(2, 4, Scheduler::GPipe).with_virtual_stages(3);
    config.validate(2).unwrap();
    assert_eq!(Schedule::generate(&config).unwrap().chunks(), 3);
}

// ---- stage assignment ----

fn layers(counts: &[u64]) -> Vec<Layer> {
    counts
        .iter()
        .enumerate()
        .map(|(i, n)| Layer::new(format!("blocks.{i}"), *n))
        .collect()
}

#[test]
fn layers_split_evenly_by_parameter_count() {
    let config = PipelineConfig::new(2, 4, Scheduler::OneFOneB);
    let assignment = assign_stages(&layers(&[10; 8]), &config).unwrap();
    assert_eq!(assignment.group_of_layer, vec![0, 0, 0, 0, 1, 1, 1, 1]);
    // A heavy embedding and LM head: the split minimises the heaviest stage (100 + 10 + 10 is
    // not better than 100 alone on stage 0).
    let assignment = assign_stages(&layers(&[100, 10, 10, 10, 10, 100]), &config).unwrap();
    assert_eq!(assignment.group_of_layer, vec![0, 0, 0, 1, 1, 1]);
    assert_eq!(assignment.parameters_per_group, vec![120, 120]);
    let config = PipelineConfig::new(3, 3, Scheduler::OneFOneB);
    let assignment = assign_stages(&layers(&[100, 10, 10, 10, 10, 100]), &config).unwrap();
    assert_eq!(assignment.group_of_layer, vec![0, 1, 1, 1, 1, 2]);
    assert_eq!(assignment.parameters_per_group, vec![100, 40, 100]);
    // Brute force: no contiguous split into 3 has a smaller maximum, on a few lists.
    for counts in [
        vec![5, 1, 9, 2, 2, 7, 3],
        vec![1, 1, 1, 1, 50],
        vec![0, 0, 0, 3],
    ] {
        let assignment = assign_stages(&layers(&counts), &config).unwrap();
        let got = *assignment.parameters_per_group.iter().max().unwrap();
        let n = counts.len();
        let mut best = u64::MAX;
        for a in 1..n {
            for b in a + 1..n {
                let sums =
                    [&counts[..a], &counts[a..b], &counts[b..]].map(|s| s.iter().sum::<u64>());
                best = best.min(*sums.iter().max().unwrap());
            }
        }
        assert_eq!(got, best, "{counts:?}");
        // Contiguous, non-decreasing, every group used.
        assert!(assignment.group_of_layer.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(assignment.group_of_layer.last(), Some(&2));
    }
}

#[test]
fn virtual_stages_give_chunk_c_of_stage_s_the_group_c_p_plus_s() {
    let config = PipelineConfig::new(2, 4, Scheduler::Interleaved1F1B); // 2 chunks
    let assignment = assign_stages(&layers(&[1; 8]), &config).unwrap();
    assert_eq!(assignment.group_of_layer, vec![0, 0, 1, 1, 2, 2, 3, 3]);
    let places: Vec<(usize, usize)> = (0..8)
        .map(|i| {
            (
                assignment.stage_of(i).unwrap(),
                assignment.chunk_of(i).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        places,
        vec![
            (0, 0),
            (0, 0),
            (1, 0),
            (1, 0),
            (0, 1),
            (0, 1),
            (1, 1),
            (1, 1)
        ]
    );
    assert_eq!(assignment.parameters_of_stage(0), 4);
    assert_eq!(assignment.stage_of(8), None);
    let broken = StageAssignment {
        stages: 0,
        ..assignment
    };
    assert_eq!(broken.stage_of(0), None);
    assert_eq!(broken.parameters_of_stage(0), 0);
}

#[test]
fn stage_config_prefixes_longest_match_on_dot_boundaries() {
    let names = [
        "embedding",
        "blocks.0.attn",
        "blocks.0.mlp",
        "blocks.1.attn",
        "blocks.1.mlp",
        "blocks.10.attn",
        "final_norm",
        "lm_head",
    ];
    let model: Vec<Layer> = names.iter().map(|n| Layer::new(*n, 1)).collect();
    let config = PipelineConfig::new(3, 3, Scheduler::OneFOneB)
        .with_stage("blocks", 1)
        .with_stage("blocks.1", 1)
        .with_stage("blocks.0", 0)
        .with_stage("blocks.10", 2);
    let assignment = assign_stages(&model, &config).unwrap();
    // embedding: no prefix, first → 0; blocks.0.* → 0 ("blocks.0" beats "blocks");
    // blocks.1.* → 1 ("blocks.1" does not match blocks.10); blocks.10 → 2; the rest inherit 2.
    assert_eq!(assignment.group_of_layer, vec![0, 0, 0, 1, 1, 2, 2, 2]);
}

#[test]
fn stage_config_errors_name_the_cell_or_stage() {
    let model: Vec<Layer> = ["a", "b", "c"].iter().map(|n| Layer::new(*n, 1)).collect();
    let config = PipelineConfig::new(2, 2, Scheduler::OneFOneB)
        .with_stage("a", 1)
        .with_stage("b", 0);
    assert_eq!(
        assign_stages(&model, &config),
        Err(PipelineError::StageOrderDecreasing {
            cell: "b".to_string(),
            stage: 0,
            previous: "a".to_string(),
            previous_stage: 1
        })
    );
    let config = PipelineConfig::new(3, 3, Scheduler::OneFOneB)
        .with_stage("a", 0)
        .with_stage("c", 2);
    assert_eq!(
        assign_stages(&model, &config),
        Err(PipelineError::EmptyStage {
            stage: 1,
            keys: Vec::new()
        })
    );
    // A key whose layers a longer key takes: the error names it.
    let config = PipelineConfig::new(2, 2, Scheduler::OneFOneB)
        .with_stage("blocks", 1)
        .with_stage("blocks.0", 0)
        .with_stage("blocks.1", 0);
    let blocks: Vec<Layer> = ["blocks.0", "blocks.1"]
        .iter()
        .map(|n| Layer::new(*n, 1))
        .collect();
    let error = assign_stages(&blocks, &config).unwrap_err();
    assert_eq!(
        error,
        PipelineError::EmptyStage {
            stage: 1,
            keys: vec!["blocks".to_string()]
        }
    );
    assert!(error.to_string().contains("\"blocks\""), "{error}");
    // A typo matches no layer: refused, naming the key and the layers.
    for typo in ["d", "a.x", "bb"] {
        let config = PipelineConfig::new(2, 2, Scheduler::OneFOneB)
            .with_stage("a", 0)
            .with_stage(typo, 1);
        let error = assign_stages(&model, &config).unwrap_err();
        assert_eq!(
            error,
            PipelineError::StageConfigMatchesNoLayer {
                prefix: typo.to_string(),
                layers: "a, b, c".to_string()
            }
        );
    }
    let error = assign_stages(&model, &PipelineConfig::new(4, 4, Scheduler::GPipe)).unwrap_err();
    assert_eq!(
        error,
        PipelineError::FewerLayersThanStages {
            layers: 3,
            groups: 4
        }
    );
    assert_eq!(
        assign_stages(&[], &PipelineConfig::new(1, 1, Scheduler::GPipe)),
        Err(PipelineError::NoLayers)
    );
    let error = assign_stages(
        &model,
        &PipelineConfig::new(2, 2, Scheduler::GPipe).with_stage("a", 9),
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("stage_config.\"a\" = 9"),
        "{error}"
    );
}

#[test]
fn a_stage_without_parameters_before_one_with_some_is_refused_naming_it() {
    use graph::{GraphBuilder, Initializer};
    use tensor::DType;
    // l0 and l2 hold parameters, l1 and l3 none.
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[4, 8], DType::F32).unwrap();
    let w0 = b
        .parameter("l0.w", &[8, 8], Initializer::normal(1.0))
        .unwrap();
    let h = b.matmul("l0.matmul", x, w0).unwrap();
    let h = b.gelu("l1.gelu", h, true).unwrap();
    let w2 = b
        .parameter("l2.w", &[8, 8], Initializer::normal(1.0))
        .unwrap();
    let h = b.matmul("l2.matmul", h, w2).unwrap();
    b.gelu("l3.gelu", h, true).unwrap();
    let g = b.finish();
    let staged = |cuts: &[(&str, usize)]| {
        cuts.iter()
            .fold(PipelineConfig::new(3, 1, Scheduler::GPipe), |c, (k, s)| {
                c.with_stage(*k, *s)
            })
    };
    // l1 alone on stage 1 before l2 on stage 2: the run's checkpoint would be unreadable.
    let err = node_stages(&g, &staged(&[("l0", 0), ("l1", 1), ("l2", 2)]))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "parallel.pipeline.stage_config: stage 1 holds no trainable parameter (its cells: l1) \
             but stage 2 does"
        ),
        "{err}"
    );
    // The same gap left by the cut by parameter counts names the stage count.
    let err = node_stages(&g, &PipelineConfig::new(4, 1, Scheduler::GPipe))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("parallel.pipeline.stages (the cut by parameter counts): stage 1"),
        "{err}"
    );
    // A trailing stage without parameters (l3 alone on the last stage) is allowed.
    let stages = node_stages(&g, &staged(&[("l0", 0), ("l2", 1), ("l3", 2)])).unwrap();
    let names: Vec<(&str, usize)> = stages
        .layers
        .iter()
        .map(|(n, s)| (n.as_str(), *s))
        .collect();
    assert_eq!(names, vec![("l0", 0), ("l1", 0), ("l2", 1), ("l3", 2)]);
    // A frozen parameter is not saved: a stage holding only one is refused alike.
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[4, 8], DType::F32).unwrap();
    let w0 = b
        .parameter("l0.w", &[8, 8], Initializer::normal(1.0))
        .unwrap();
    let h = b.matmul("l0.matmul", x, w0).unwrap();
    let shift = b
        .parameter_with(
            "l1.shift",
            &[8],
            DType::F32,
            Initializer::normal(1.0),
            false,
        )
        .unwrap();
    let h = b.add("l1.add", h, shift).unwrap();
    let w2 = b
        .parameter("l2.w", &[8, 8], Initializer::normal(1.0))
        .unwrap();
    b.matmul("l2.matmul", h, w2).unwrap();
    let err = node_stages(&b.finish(), &staged(&[("l0", 0), ("l1", 1), ("l2", 2)]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("stage 1 holds no trainable parameter"),
        "{err}"
    );
}

#[test]
fn stages_hold_contiguous_rank_groups_in_mindspore_order() {
    assert_eq!(stage_ranks(0, 2, 8), Some(0..4));
    assert_eq!(stage_ranks(1, 2, 8), Some(4..8));
    assert_eq!(stage_ranks(3, 4, 8), Some(6..8));
    assert_eq!(stage_ranks(2, 2, 8), None);
    assert_eq!(stage_ranks(0, 3, 8), None);
    assert_eq!(stage_ranks(0, 0, 8), None);
    for rank in 0..8 {
        let stage = stage_of_rank(rank, 4, 8).unwrap();
        assert!(stage_ranks(stage, 4, 8).unwrap().contains(&rank));
    }
    assert_eq!(stage_of_rank(8, 4, 8), None);
}

// ---- properties over random schedules ----

mod random {
    use super::*;
    use proptest::prelude::*;

    /// Every action a stage must run: forward and a full or split backward per (mb, chunk).
    fn required(p: usize, m: usize, v: usize, split: bool) -> Vec<Vec<Action>> {
        (0..p)
            .map(|_| {
                let mut actions = Vec::new();
                for mb in 0..m {
                    for chunk in 0..v {
                        actions.push(Action::new(ActionKind::Forward, mb, chunk));
                        if split {
                            actions.push(Action::new(ActionKind::BackwardInput, mb, chunk));
                            actions.push(Action::new(ActionKind::BackwardWeight, mb, chunk));
                        } else {
                            actions.push(Action::new(ActionKind::Backward, mb, chunk));
                        }
                    }
                }
                actions
            })
            .collect()
    }

    /// The inputs of an action, written out again from the model cut (piece g = c·P + s),
    /// independently of `Schedule::dependencies`.
    fn inputs(p: usize, v: usize, split: bool, stage: usize, a: Action) -> Vec<(usize, Action)> {
        let piece = a.chunk * p + stage;
        let place = |g: usize| (g % p, g / p);
        let backward = if split {
            ActionKind::BackwardInput
        } else {
            ActionKind::Backward
        };
        match a.kind {
            ActionKind::Forward if piece > 0 => {
                let (s, c) = place(piece - 1);
                vec![(s, Action::new(ActionKind::Forward, a.micro_batch, c))]
            }
            ActionKind::Forward => vec![],
            ActionKind::Backward | ActionKind::BackwardInput => {
                let mut needs = vec![(
                    stage,
                    Action::new(ActionKind::Forward, a.micro_batch, a.chunk),
                )];
                if piece + 1 < p * v {
                    let (s, c) = place(piece + 1);
                    needs.push((s, Action::new(backward, a.micro_batch, c)));
                }
                needs
            }
            ActionKind::BackwardWeight => {
                vec![(
                    stage,
                    Action::new(ActionKind::BackwardInput, a.micro_batch, a.chunk),
                )]
            }
        }
    }

    /// A random valid execution: repeatedly pick one ready action of any stage.
    fn random_topological(
        p: usize,
        m: usize,
        v: usize,
        split: bool,
        choices: &[u32],
    ) -> Vec<Vec<Action>> {
        let mut remaining = required(p, m, v, split);
        let mut done: std::collections::HashSet<(usize, Action)> = Default::default();
        let mut lists = vec![Vec::new(); p];
        let mut step = 0;
        while remaining.iter().any(|r| !r.is_empty()) {
            let ready: Vec<(usize, usize)> = remaining
                .iter()
                .enumerate()
                .flat_map(|(s, r)| r.iter().enumerate().map(move |(i, a)| (s, i, *a)))
                .filter(|(s, _, a)| inputs(p, v, split, *s, *a).iter().all(|x| done.contains(x)))
                .map(|(s, i, _)| (s, i))
                .collect();
            let (s, i) = ready[choices[step % choices.len()] as usize % ready.len()];
            step += 1;
            let a = remaining[s].remove(i);
            done.insert((s, a));
            lists[s].push(a);
        }
        lists
    }

    fn durations(times: &[u8]) -> Durations {
        let t = |i: usize| f64::from(times[i % times.len()] % 4);
        Durations::uniform(t(0), t(1), t(2)).with_latency(t(3) / 2.0)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        /// Any schedule some valid execution order produced runs under blocking point-to-point
        /// in its linearized program, whatever the durations, with every transfer matched.
        #[test]
        fn any_valid_order_runs_under_rendezvous(
            p in 1usize..=4, m in 1usize..=4, v in 1usize..=2, split in any::<bool>(),
            choices in prop::collection::vec(any::<u32>(), 1..64),
            times in prop::collection::vec(any::<u8>(), 4),
        ) {
            let lists = random_topological(p, m, v, split, &choices);
            let schedule = Schedule::from_lists(p, m, v, lists).unwrap();
            for (stage, actions) in schedule.per_stage().iter().enumerate() {
                for a in actions {
                    let mut ours: Vec<(usize, Action)> = inputs(p, v, split, stage, *a);
                    let mut theirs: Vec<(usize, Action)> = schedule
                        .dependencies(stage, *a)
                        .unwrap()
                        .iter()
                        .map(|d| (d.stage, d.action))
                        .collect();
                    ours.sort();
                    theirs.sort();
                    prop_assert_eq!(ours, theirs);
                }
            }
            let durations = durations(&times);
            let report = check_schedule(&schedule, &durations).unwrap();
            assert_sends_matched(&schedule, &report.program, "random");
            let unit = schedule.program(CommOrder::Linearized).unwrap();
            simulate_blocking(&schedule, &unit, &durations).unwrap();
        }

        /// A random order of the required actions either deadlocks in the buffered simulation
        /// (and then has no linearized program) or runs in both modes.
        #[test]
        fn random_orders_deadlock_or_run_in_both_modes(
            p in 1usize..=3, m in 1usize..=3, split in any::<bool>(),
            keys in prop::collection::vec(any::<u32>(), 3 * 3 * 3),
        ) {
            let mut lists = required(p, m, 1, split);
            for (stage, list) in lists.iter_mut().enumerate() {
                let mut keyed: Vec<(u32, Action)> = list
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (keys[(stage * 9 + i) % keys.len()], *a))
                    .collect();
                keyed.sort();
                *list = keyed.into_iter().map(|(_, a)| a).collect();
            }
            let schedule = Schedule::from_lists(p, m, 1, lists).unwrap();
            let durations = Durations::uniform(1.0, 1.0, 1.0);
            match simulate(&schedule, &durations) {
                Ok(_) => {
                    check_schedule(&schedule, &durations).unwrap();
                }
                Err(PipelineError::Deadlock { stuck, .. }) => {
                    prop_assert!(!stuck.is_empty());
                    let refused = matches!(
                        schedule.program(CommOrder::Linearized),
                        Err(PipelineError::Deadlock { .. })
                    );
                    prop_assert!(refused);
                }
                Err(other) => prop_assert!(false, "{}", other),
            }
        }

        /// The even split is contiguous, uses every group, and its heaviest group is the least
        /// possible (checked against an exact dynamic programme).
        #[test]
        fn even_split_is_optimal(
            counts in prop::collection::vec(0u64..1000, 1..12),
            groups in 1usize..6,
        ) {
            prop_assume!(counts.len() >= groups);
            let config = PipelineConfig::new(groups, groups, Scheduler::GPipe);
            let assignment = assign_stages(&layers(&counts), &config).unwrap();
            prop_assert!(assignment.group_of_layer.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
            prop_assert_eq!(assignment.group_of_layer[0], 0);
            prop_assert_eq!(*assignment.group_of_layer.last().unwrap(), groups - 1);
            // best[k][i]: least max over splits of the first i layers into k groups.
            let n = counts.len();
            let mut best = vec![vec![u64::MAX; n + 1]; groups + 1];
            best[0][0] = 0;
            for k in 1..=groups {
                for i in k..=n {
                    for j in (k - 1)..i {
                        if best[k - 1][j] == u64::MAX { continue; }
                        let sum: u64 = counts[j..i].iter().sum();
                        best[k][i] = best[k][i].min(best[k - 1][j].max(sum));
                    }
                }
            }
            prop_assert_eq!(*assignment.parameters_per_group.iter().max().unwrap(), best[groups][n]);
        }
    }
}

#[test]
fn large_pipelines_check_in_linear_time() {
    // 256 stages × 512 micro-batches: 262 144 actions. The simulators are worklists, so this
    // runs in well under a second (repeated passes over every stage would take minutes).
    let schedule = Schedule::one_f_one_b(256, 512).unwrap();
    let report = check_schedule(&schedule, &Durations::uniform(1.0, 1.0, 1.0)).unwrap();
    assert_eq!(report.dependency.makespan, (512 + 255) as f64 * 3.0);
    assert_eq!(report.blocking.makespan, report.dependency.makespan);
}

/// The exact lists, checked by hand against the papers' figures (chunk 0 is left out).
#[test]
fn listings_match_the_published_orders() {
    let listing = |schedule: Schedule| schedule.listing().replace(", chunk 0)", ")");
    assert_eq!(
        listing(Schedule::gpipe(2, 2, 1).unwrap()),
        "stage 0: F(mb 0) F(mb 1) B(mb 0) B(mb 1)\n\
         stage 1: F(mb 0) F(mb 1) B(mb 0) B(mb 1)\n"
    );
    assert_eq!(
        listing(Schedule::one_f_one_b(3, 4).unwrap()),
        "stage 0: F(mb 0) F(mb 1) F(mb 2) B(mb 0) F(mb 3) B(mb 1) B(mb 2) B(mb 3)\n\
         stage 1: F(mb 0) F(mb 1) B(mb 0) F(mb 2) B(mb 1) F(mb 3) B(mb 2) B(mb 3)\n\
         stage 2: F(mb 0) B(mb 0) F(mb 1) B(mb 1) F(mb 2) B(mb 2) F(mb 3) B(mb 3)\n"
    );
    // Megatron: warm-up 2(P − s − 1) + (V − 1)P, groups of P micro-batches, chunks ascending
    // forward and descending backward.
    assert_eq!(
        listing(Schedule::interleaved_1f1b(2, 4, 2).unwrap()),
        "stage 0: F(mb 0) F(mb 1) F(mb 0, chunk 1) F(mb 1, chunk 1) F(mb 2) B(mb 0, chunk 1) \
         F(mb 3) B(mb 1, chunk 1) F(mb 2, chunk 1) B(mb 0) F(mb 3, chunk 1) B(mb 1) \
         B(mb 2, chunk 1) B(mb 3, chunk 1) B(mb 2) B(mb 3)\n\
         stage 1: F(mb 0) F(mb 1) F(mb 0, chunk 1) B(mb 0, chunk 1) F(mb 1, chunk 1) \
         B(mb 1, chunk 1) F(mb 2) B(mb 0) F(mb 3) B(mb 1) F(mb 2, chunk 1) B(mb 2, chunk 1) \
         F(mb 3, chunk 1) B(mb 3, chunk 1) B(mb 2) B(mb 3)\n"
    );
    // ZB-H1: 1F1B's F/Bi order; stage s keeps at most s weight halves pending.
    assert_eq!(
        listing(Schedule::zero_bubble_h1(3, 4).unwrap()),
        "stage 0: F(mb 0) F(mb 1) F(mb 2) Bi(mb 0) W(mb 0) F(mb 3) Bi(mb 1) W(mb 1) Bi(mb 2) \
         W(mb 2) Bi(mb 3) W(mb 3)\n\
         stage 1: F(mb 0) F(mb 1) Bi(mb 0) F(mb 2) Bi(mb 1) W(mb 0) F(mb 3) Bi(mb 2) W(mb 1) \
         Bi(mb 3) W(mb 2) W(mb 3)\n\
         stage 2: F(mb 0) Bi(mb 0) F(mb 1) Bi(mb 1) F(mb 2) Bi(mb 2) W(mb 0) F(mb 3) Bi(mb 3) \
         W(mb 1) W(mb 2) W(mb 3)\n"
    );
}

#[test]
fn interleaved_holds_its_warm_up_plus_one_activations() {
    for p in 1..=8 {
        for m in (p..=MAX_M).step_by(p) {
            for v in [2, 3] {
                let schedule = Schedule::interleaved_1f1b(p, m, v).unwrap();
                let report = simulate(&schedule, &Durations::uniform(1.0, 1.0, 0.0)).unwrap();
                for s in 0..p {
                    let warmup = 2 * (p - s - 1) + (v - 1) * p;
                    let expected = (warmup + 1).min(m * v);
                    assert_eq!(
                        report.peak_activations[s], expected,
                        "P={p} M={m} V={v} s={s}"
                    );
                }
            }
        }
    }
}
