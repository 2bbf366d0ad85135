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
                check_all_modes(&schedule, &durations, &format!("{scheduler} P={p} M={m}"));
                checked += 1;
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
