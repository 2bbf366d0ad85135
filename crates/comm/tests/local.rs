//! The local backend: the conformance suite on 1, 2, 3, 4 and 8 ranks, failure behaviour, and a
//! tour of the API.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use comm::conformance::Case;
use comm::{CommError, Communicator, CommunicatorExt, LocalCluster, PeerFailure, ReduceOp};
use tensor::Tensor;

/// Runs one conformance case on every rank count and reports every failing rank.
fn run_local(case: &Case) {
    for n in [1, 2, 3, 4, 8] {
        let results = LocalCluster::new(n)
            .expect("n > 0")
            .with_timeout(Duration::from_secs(120))
            .run(|comm| (case.run)(&comm));
        let failures: Vec<String> = results
            .into_iter()
            .enumerate()
            .filter_map(|(rank, r)| match r {
                Ok(Ok(())) => None,
                Ok(Err(failure)) => Some(format!("  rank {rank}: {failure}")),
                Err(err) => Some(format!("  rank {rank}: {err}")),
            })
            .collect();
        assert!(
            failures.is_empty(),
            "{} on {n} ranks:\n{}",
            case.name,
            failures.join("\n")
        );
    }
}

mod conformance {
    use super::run_local;
    comm::testgen!(run_local);
}

fn expect_peer_failed(result: Result<(), CommError>, peer: usize, want: PeerFailure) {
    match result {
        Err(CommError::PeerFailed { peer: p, cause, .. }) if p == peer => assert_eq!(cause, want),
        other => panic!("expected PeerFailed from rank {peer} ({want}), got {other:?}"),
    }
}

#[test]
fn a_panicking_rank_fails_every_peer_waiting_on_it() {
    // A long timeout: the peers must learn of the panic, not time out.
    let results = LocalCluster::new(4)
        .unwrap()
        .with_timeout(Duration::from_secs(120))
        .run(|comm| {
            if comm.rank() == 2 {
                panic!("rank 2 fails on purpose");
            }
            let mut x = vec![1f32; 100_000];
            comm.all_reduce_in_place(&mut x, ReduceOp::Sum)
        });
    for (rank, r) in results.into_iter().enumerate() {
        if rank == 2 {
            assert!(
                matches!(&r, Err(CommError::RankPanicked { rank: 2, message }) if message.contains("on purpose")),
                "{r:?}"
            );
        } else {
            expect_peer_failed(r.unwrap(), 2, PeerFailure::Panicked);
        }
    }
}

#[test]
fn a_rank_that_leaves_fails_its_peers_and_its_sent_messages_still_arrive() {
    let results = LocalCluster::new(3)
        .unwrap()
        .with_timeout(Duration::from_secs(120))
        .run(|comm| -> Result<(), CommError> {
            match comm.rank() {
                1 => comm.send_bytes(0, 4, b"bye"), // then the closure returns
                0 => {
                    assert_eq!(comm.recv_bytes(1, 4)?, b"bye");
                    expect_peer_failed(comm.recv_bytes(1, 4).map(drop), 1, PeerFailure::Exited);
                    Ok(())
                }
                _ => {
                    expect_peer_failed(comm.recv_bytes(1, 5).map(drop), 1, PeerFailure::Exited);
                    Ok(())
                }
            }
        });
    for r in results {
        r.unwrap().unwrap();
    }
}

#[test]
fn a_rank_that_leaves_before_joining_a_group_fails_the_group_at_once() {
    // Ranks 1..3 form a group rank 0 never creates; ranks 1 and 2 then wait in it for rank 3,
    // which left at once. Its slot in that group never opened, so only the cluster-wide record
    // that rank 3 dropped every communicator can end their wait before the (long) timeout.
    let results = LocalCluster::new(4)
        .unwrap()
        .with_timeout(Duration::from_secs(120))
        .run(|comm| -> Result<(), CommError> {
            match comm.rank() {
                0 | 3 => Ok(()),
                _ => {
                    let group = comm.group(&[1, 2, 3])?;
                    expect_peer_failed(group.barrier(), 2, PeerFailure::Exited);
                    Ok(())
                }
            }
        });
    for r in results {
        r.unwrap().unwrap();
    }
}

#[test]
fn a_rank_that_never_joins_times_out_everyone_then_finds_them_gone() {
    let all_waited = Barrier::new(4);
    let results = LocalCluster::new(4)
        .unwrap()
        .with_timeout(Duration::from_millis(300))
        .run(|comm| {
            if comm.rank() >= 2 {
                // Ranks 2 and 3 join only after the others gave up.
                all_waited.wait();
                let late = comm.barrier();
                assert!(
                    matches!(late, Err(CommError::PeerFailed { .. })),
                    "{late:?}"
                );
                return;
            }
            let mut t = Tensor::from_vec(&[4], vec![1.0f64; 4]).unwrap();
            match comm.all_reduce(&mut t, ReduceOp::Mean) {
                Err(CommError::Timeout {
                    waiting_for, site, ..
                }) => {
                    assert_eq!(waiting_for, vec![2, 3]);
                    assert_eq!((site.op, site.group.as_str()), ("all_reduce", "world"));
                }
                other => panic!("expected a timeout, got {other:?}"),
            }
            // The communicator is poisoned now.
            assert!(matches!(comm.barrier(), Err(CommError::Poisoned { .. })));
            all_waited.wait();
        });
    for r in results {
        r.unwrap();
    }
}

#[test]
fn mismatched_collectives_are_errors_not_hangs() {
    let results = LocalCluster::new(2)
        .unwrap()
        .with_timeout(Duration::from_secs(120))
        .run(|comm| {
            let mut x = [1u32; 8];
            if comm.rank() == 0 {
                comm.all_reduce_in_place(&mut x, ReduceOp::Sum)
            } else {
                let mut out = [0u32; 16];
                comm.all_gather_into(&x, &mut out)
            }
        });
    for r in results {
        let err = r.unwrap().unwrap_err();
        assert!(
            matches!(
                err,
                CommError::Mismatch { .. }
                    | CommError::PeerFailed {
                        cause: PeerFailure::Aborted(_),
                        ..
                    }
            ),
            "{err}"
        );
    }
}

#[test]
fn all_reduce_is_bitwise_the_rank_order_sum_on_every_rank() {
    let n = 8;
    let len = 100_003;
    let value = |rank: usize, i: usize| {
        // A cheap hash to floats with all mantissa bits in use.
        let h = (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        (h >> 40) as f32 / 1_000.0 - 8_000.0
    };
    let want: Vec<f32> = (0..len)
        .map(|i| (1..n).fold(value(0, i), |acc, r| acc + value(r, i)))
        .collect();
    let results = LocalCluster::new(n).unwrap().run(|comm| {
        let mut x: Vec<f32> = (0..len).map(|i| value(comm.rank(), i)).collect();
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum).map(|()| x)
    });
    for r in results {
        let got = r.unwrap().unwrap();
        assert!(got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

#[test]
fn api_walkthrough() {
    // A communicator is a trait object the runtime can hold and share.
    let results = LocalCluster::new(2)
        .unwrap()
        .run(|comm| -> Result<(), CommError> {
            let shared: Arc<dyn Communicator> = Arc::new(comm);
            assert_eq!(
                (shared.backend(), shared.label(), shared.size()),
                ("local", "world", 2)
            );
            assert_eq!(shared.timeout(), LocalCluster::DEFAULT_TIMEOUT);
            // Tensor-level calls…
            let mut t = Tensor::from_vec(&[2], vec![shared.rank() as f32 + 1.0, 10.0]).unwrap();
            shared.all_reduce(&mut t, ReduceOp::Max)?;
            assert_eq!(t.as_f32().unwrap(), &[2.0, 10.0]);
            // …slice-level calls through the extension trait, on `dyn` too…
            let mut grads = [0.5f32; 3];
            shared.all_reduce_in_place(&mut grads, ReduceOp::Mean)?;
            assert_eq!(grads, [0.5; 3]);
            // …and sub-groups, numbered in the order given.
            let solo: Box<dyn Communicator> = shared.group(&[shared.rank()])?;
            assert_eq!((solo.rank(), solo.size()), (0, 1));
            assert_eq!(solo.label(), format!("world[{}]", shared.rank()));
            Ok(())
        });
    for r in results {
        r.unwrap().unwrap();
    }
    assert!(matches!(LocalCluster::new(0), Err(CommError::Setup { .. })));
}

/// An all-gather large enough that its copies stream (non-temporal stores above 16 MiB written
/// in all), with an odd per-rank length so the copies have unaligned heads and tails: every
/// rank holds every rank's data.
#[test]
fn large_all_gathers_stream_every_byte() {
    let n = 3;
    let len = (3 << 20) + 5; // u32s: 12 MiB + 20 bytes per rank, 108 MiB written in all
    let value = |rank: usize, i: usize| (rank as u32).wrapping_mul(0x9E37_79B9) ^ i as u32;
    let results = LocalCluster::new(n).unwrap().run(|comm| {
        let me = comm.rank();
        let x: Vec<u32> = (0..len).map(|i| value(me, i)).collect();
        let mut out = vec![0u32; len * n];
        comm.all_gather_into(&x, &mut out)?;
        Ok::<_, CommError>(out)
    });
    for r in results {
        let out = r.unwrap().unwrap();
        for rank in 0..n {
            let chunk = &out[rank * len..(rank + 1) * len];
            assert!(
                chunk.iter().enumerate().all(|(i, &v)| v == value(rank, i)),
                "rank {rank}'s chunk"
            );
        }
    }
}

/// The all-reduce and reduce-scatter in the element type add bf16 and f16 in the half type, in
/// rank order, rounding after every addition: on 3 and 4 ranks each result equals the
/// sequential sum written out by hand, and differs from the ordinary all-reduce (f32
/// accumulation, one rounding) on values chosen so that it must. With `small` a third of the
/// half type's unit in the last place at 1 (`ulp / 2 - small` rounds away, `3·small` does
/// not): `1 ⊕ small ⊕ small ⊕ …` stays 1 in the half type, while the f32 sum `1 + 2·small`
/// (3 ranks) or `1 + 3·small` (4 ranks) rounds up to `1 + ulp`; and the order matters:
/// `small ⊕ small ⊕ 1` (rank 0 and 1 small, rank 2 holding 1) is `2·small ⊕ 1 = 1 + ulp`.
#[test]
fn half_precision_sums_in_the_element_type_round_after_every_addition_in_rank_order() {
    fn half(dtype: tensor::DType, x: f64) -> Tensor {
        Tensor::from_vec(&[1], vec![x]).unwrap().to_dtype(dtype)
    }
    for (dtype, ulp) in [
        (tensor::DType::BF16, 2f64.powi(-7)),
        (tensor::DType::F16, 2f64.powi(-10)),
    ] {
        // 3/8 of an ulp: below half an ulp alone, above it twice, and exact in the type.
        let small = 0.375 * ulp;
        for n in [3usize, 4] {
            // Element 0: rank 0 holds 1, the others `small`; element 1: the last rank holds 1.
            let value = |rank: usize, element: usize| {
                let big = if element == 0 { 0 } else { n - 1 };
                if rank == big {
                    1.0
                } else {
                    small
                }
            };
            let by_hand_in_type = |element: usize| -> f64 {
                // The sequential sum, rounded to the type after every addition.
                let mut acc = value(0, element);
                for rank in 1..n {
                    acc = half(dtype, acc + value(rank, element)).to_f64_vec()[0];
                }
                acc
            };
            let want_in_type = [by_hand_in_type(0), by_hand_in_type(1)];
            assert_eq!(want_in_type, [1.0, 1.0 + ulp], "{dtype}: the hand sums");
            let f32_once = 1.0 + ulp; // 1 + (n − 1)·small rounds up either way.
            let results = LocalCluster::new(n).unwrap().run(|comm| {
                let mine =
                    Tensor::from_vec(&[2], vec![value(comm.rank(), 0), value(comm.rank(), 1)])
                        .unwrap()
                        .to_dtype(dtype);
                let mut in_type = mine.clone();
                comm.all_reduce_in_element_type(&mut in_type, ReduceOp::Sum)
                    .unwrap();
                let mut once = mine.clone();
                comm.all_reduce(&mut once, ReduceOp::Sum).unwrap();
                // Reduce-scatter of 2 elements over n ranks: ranks 0 and 1 get one each.
                let counts = comm::split_counts(2, n);
                let mut part = Tensor::zeros(dtype, &[counts[comm.rank()]]);
                comm.reduce_scatter_in_element_type_v(
                    comm::Buf::from_tensor(&mine),
                    comm::BufMut::from_tensor(&mut part),
                    &counts,
                    ReduceOp::Sum,
                )
                .unwrap();
                (in_type.to_f64_vec(), once.to_f64_vec(), part.to_f64_vec())
            });
            for (rank, r) in results.into_iter().enumerate() {
                let (in_type, once, part) = r.unwrap();
                assert_eq!(in_type, want_in_type, "{dtype} on {n} ranks, rank {rank}");
                assert_eq!(once, [f32_once, f32_once], "{dtype} on {n} ranks: f32 once");
                assert_ne!(in_type, once, "{dtype} on {n} ranks: the two differ");
                let want_part: Vec<f64> = want_in_type.get(rank).copied().into_iter().collect();
                assert_eq!(
                    part, want_part,
                    "{dtype} on {n} ranks, rank {rank}: scattered"
                );
            }
        }
    }
}

/// A rank that reaches a collective before its peer accumulates the wait in its thread's
/// [`comm::thread_wait_time`]; the peer that arrives last (its wait already over) gains far
/// less.
#[test]
fn the_rank_that_waits_for_its_peer_counts_the_wait() {
    let late = Duration::from_millis(80);
    let grown = LocalCluster::new(2).unwrap().run(move |comm| {
        let before = comm::thread_wait_time();
        if comm.rank() == 1 {
            std::thread::sleep(late);
        }
        comm.barrier().unwrap();
        comm::thread_wait_time() - before
    });
    let grown: Vec<Duration> = grown.into_iter().map(Result::unwrap).collect();
    assert!(grown[0] >= late / 2, "rank 0 waited {:?}", grown[0]);
    assert!(grown[1] < grown[0] / 2, "{grown:?}");
}
