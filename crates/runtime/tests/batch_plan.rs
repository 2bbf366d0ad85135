//! Batch plans: shuffled permutations, determinism, dropped remainders and padded evaluation.

use std::collections::BTreeSet;

use runtime::{BatchPlan, RuntimeError};

fn all_indices(plan: &BatchPlan) -> Vec<usize> {
    plan.iter().flat_map(|b| b.indices.to_vec()).collect()
}

#[test]
fn a_shuffled_training_epoch_is_a_permutation_minus_the_dropped_remainder() {
    let plan = BatchPlan::train(1500, 32, true, 1, 1).unwrap();
    assert_eq!(
        (plan.len(), plan.batch_size(), plan.n_real()),
        (46, 32, 1472)
    );
    let indices = all_indices(&plan);
    let distinct: BTreeSet<usize> = indices.iter().copied().collect();
    assert_eq!(distinct.len(), 1472, "a sample appears twice");
    assert!(indices.iter().all(|&i| i < 1500));
    assert_ne!(indices, (0..1472).collect::<Vec<_>>(), "not shuffled");
    for batch in plan.iter() {
        assert_eq!(batch.indices.len(), 32);
        assert_eq!(batch.n_real, 32);
    }
}

#[test]
fn the_order_depends_only_on_seed_and_epoch() {
    let a = BatchPlan::train(100, 10, true, 42, 3).unwrap();
    assert_eq!(a, BatchPlan::train(100, 10, true, 42, 3).unwrap());
    assert_ne!(a, BatchPlan::train(100, 10, true, 42, 4).unwrap());
    assert_ne!(a, BatchPlan::train(100, 10, true, 43, 3).unwrap());
    // The batch size only cuts the same order differently.
    let by_five = BatchPlan::train(100, 5, true, 42, 3).unwrap();
    assert_eq!(all_indices(&a), all_indices(&by_five));
}

#[test]
fn without_shuffle_batches_are_in_order_and_the_remainder_is_dropped() {
    let plan = BatchPlan::train(10, 4, false, 9, 1).unwrap();
    assert_eq!(plan.len(), 2);
    assert_eq!(plan.batch(0).unwrap().indices, &[0, 1, 2, 3]);
    assert_eq!(plan.batch(1).unwrap().indices, &[4, 5, 6, 7]);
    assert!(plan.batch(2).is_none());
}

#[test]
fn evaluation_covers_every_sample_once_and_pads_the_last_batch() {
    let plan = BatchPlan::eval(297, 32).unwrap();
    assert_eq!((plan.len(), plan.n_real()), (10, 297));
    let mut real = Vec::new();
    for batch in plan.iter() {
        assert_eq!(batch.indices.len(), 32);
        real.extend_from_slice(&batch.indices[..batch.n_real]);
        // Padding rows repeat a real sample, so every rank can read them.
        assert!(batch.indices.iter().all(|&i| i < 297));
    }
    assert_eq!(real, (0..297).collect::<Vec<_>>());
    let last = plan.batch(9).unwrap();
    assert_eq!(last.n_real, 297 - 9 * 32);
    assert!(last.is_real(last.n_real - 1) && !last.is_real(last.n_real));

    // Exact accuracy on any device count: count correct rows among the real ones only. With a
    // "model" that is right on even samples, accuracy is #even / 297 whatever the split of rows.
    let correct = |i: usize| i.is_multiple_of(2);
    let want = (0..297).filter(|&i| correct(i)).count();
    for devices in [1, 2, 4, 8] {
        let rows = 32 / devices;
        let mut counted = 0;
        for batch in plan.iter() {
            for rank in 0..devices {
                let share = batch.rows(rank * rows, rows).unwrap();
                counted += share
                    .iter()
                    .enumerate()
                    .filter(|&(k, &i)| batch.is_real(rank * rows + k) && correct(i))
                    .count();
            }
        }
        assert_eq!(counted, want, "{devices} devices");
    }
}

#[test]
fn an_exact_fit_needs_no_padding() {
    let plan = BatchPlan::eval(64, 32).unwrap();
    assert_eq!(plan.len(), 2);
    assert!(plan.iter().all(|b| b.n_real == 32));
}

#[test]
fn impossible_plans_are_errors() {
    let key = |err: RuntimeError| match err {
        RuntimeError::Config { key, reason } => {
            assert!(!reason.is_empty());
            key
        }
        other => panic!("expected a Config error, got {other}"),
    };
    assert_eq!(
        key(BatchPlan::train(10, 0, true, 1, 1).unwrap_err()),
        "data.batch_size"
    );
    assert_eq!(key(BatchPlan::eval(10, 0).unwrap_err()), "data.batch_size");
    // No full training batch fits.
    assert_eq!(
        key(BatchPlan::train(10, 11, true, 1, 1).unwrap_err()),
        "data.batch_size"
    );
    assert!(BatchPlan::eval(0, 4).is_err());
    let plan = BatchPlan::eval(10, 4).unwrap();
    assert!(plan.batch(0).unwrap().rows(2, 3).is_err());
    assert!(plan.batch(0).unwrap().rows(usize::MAX, 2).is_err());
}
