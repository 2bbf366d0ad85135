//! Reshapes that keep split dims, and transposes of split dims, compute on a local cluster what
//! one device computes (forward and gradients).

use graph::{Graph, GraphBuilder, Initializer, ValueId};
use parallel::{DatasetStrategy, ParallelConfig, ParallelMode};
use proptest::prelude::*;
use tensor::DType;

use crate::sharded::{assert_matches_one_device, values};

const DEVICES: usize = 4;

/// `x·w` (split by `factors`), through the op `through` builds (named `op`, same strategy; the
/// gradient of `w` goes through its backward on split dims), times an input `t` of shape `to`,
/// summed; `shard` adds strategies.
fn x_w_through_t(
    from: &[usize],
    to: &[usize],
    factors: &[usize],
    through: impl FnOnce(&mut GraphBuilder, ValueId) -> ValueId,
    shard: &[(&str, &[&[usize]])],
) -> (Graph, ValueId, ParallelConfig) {
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let x = b.input("x", from, DType::F64).unwrap();
    let t = b.input("t", to, DType::F64).unwrap();
    let w = b.parameter("w", from, Initializer::normal(0.5)).unwrap();
    let y = b.mul("mul1", x, w).unwrap();
    let r = through(&mut b, y);
    let z = b.mul("mul2", r, t).unwrap();
    let loss = b.reduce_sum("loss", z, &[], false).unwrap();
    let mut config = ParallelConfig {
        dataset_strategy: DatasetStrategy::FullBatch,
        ..ParallelConfig::new(ParallelMode::SemiAuto, DEVICES)
            .shard("mul1", &[factors, factors])
            .shard("op", &[factors])
    };
    for (name, strategy) in shard {
        config = config.shard(name, strategy);
    }
    (b.finish(), loss, config)
}

/// A reshape (or flatten) of `from` into `to` split by `factors` matches one device.
fn check_reshape(from: &[usize], to: &[usize], factors: &[usize], flatten: bool) {
    let (graph, loss, config) = x_w_through_t(
        from,
        to,
        factors,
        |b, y| {
            if flatten {
                b.flatten("op", y).unwrap()
            } else {
                b.reshape("op", y, to).unwrap()
            }
        },
        &[],
    );
    let inputs = [values(from, 1), values(to, 2)];
    assert_matches_one_device(&graph, loss, &config, &inputs, 1e-12);
}

/// One group of a reshape: its atoms (prime-ish factors), and how the input and the output cut
/// them into dims (bit `k` set: a dim boundary after atom `k`).
fn cut(atoms: &[usize], mask: u8) -> Vec<usize> {
    let mut dims = vec![atoms[0]];
    for (k, &a) in atoms.iter().enumerate().skip(1) {
        if mask & (1 << (k - 1)) != 0 {
            dims.push(a);
        } else {
            *dims.last_mut().unwrap() *= a;
        }
    }
    dims
}

/// A reshape `from` → `to` and a split of its input the rule keeps.
#[derive(Debug, Clone)]
struct Case {
    from: Vec<usize>,
    to: Vec<usize>,
    factors: Vec<usize>,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn arb_case() -> impl Strategy<Value = Case> {
    let group = (
        proptest::collection::vec(prop_oneof![Just(2usize), Just(3), Just(4)], 1..=3),
        any::<u8>(),
        any::<u8>(),
        0usize..3,
    );
    (
        proptest::collection::vec(group, 1..=3),
        proptest::option::of(0usize..4),
        proptest::option::of(0usize..4),
    )
        .prop_map(|(groups, one_in, one_out)| {
            let (mut from, mut to, mut factors) = (Vec::new(), Vec::new(), Vec::new());
            let mut used = 1;
            for (g, (atoms, in_mask, out_mask, choice)) in groups.iter().enumerate() {
                if one_in == Some(g) {
                    from.push(1);
                    factors.push(1);
                }
                if one_out == Some(g) {
                    to.push(1);
                }
                let (a, b) = (cut(atoms, *in_mask), cut(atoms, *out_mask));
                let f = [1, 2, 4][*choice];
                let f = if gcd(a[0], b[0]).is_multiple_of(f) && DEVICES.is_multiple_of(used * f) {
                    f
                } else {
                    1
                };
                used *= f;
                factors.push(f);
                factors.extend(std::iter::repeat_n(1, a.len() - 1));
                from.extend(a);
                to.extend(b);
            }
            if one_in == Some(groups.len()) {
                from.push(1);
                factors.push(1);
            }
            Case { from, to, factors }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn reshapes_keeping_splits_match_one_device(case in arb_case()) {
        check_reshape(&case.from, &case.to, &case.factors, false);
    }
}

#[test]
fn head_split_attention_reshapes_match_one_device() {
    // [B, S, H·D] -> [B, S, H, D] split on B and H, and back (the merge).
    check_reshape(&[2, 3, 8], &[2, 3, 4, 2], &[2, 1, 2], false);
    check_reshape(&[2, 3, 4, 2], &[2, 3, 8], &[1, 1, 4, 1], false);
    // [B, S] split on B -> [B·S].
    check_reshape(&[4, 3], &[12], &[4, 1], false);
    // Flatten of [n, a, b] with n and a split.
    check_reshape(&[2, 4, 3], &[2, 12], &[2, 2, 1], true);
}

#[test]
fn transpose_of_a_head_split_matches_one_device() {
    // [B, S, H, D] -> [B, H, S, D] with H split (and B).
    let (from, to) = ([2, 3, 4, 2], [2, 4, 3, 2]);
    let factors: &[usize] = &[2, 1, 2, 1];
    let (graph, loss, config) = x_w_through_t(
        &from,
        &to,
        factors,
        |b, y| b.transpose("op", y, &[0, 2, 1, 3]).unwrap(),
        &[("mul2", &[&[2, 2, 1, 1], &[2, 2, 1, 1]])],
    );
    // The transposed value stays split on H: mul2 (split on dim 1) needs no reshard of it.
    let program = crate::sharded::compile(&graph, loss, &config);
    let moved: Vec<String> = program
        .steps
        .iter()
        .filter_map(|s| match s {
            parallel::Step::Reshard(r) => {
                Some(program.placed.graph.values()[r.value.0].name.clone())
            }
            parallel::Step::Kernel(_) => None,
        })
        .collect();
    assert!(!moved.iter().any(|n| n == "op"), "{moved:?}");
    let inputs = [values(&from, 1), values(&to, 2)];
    assert_matches_one_device(&graph, loss, &config, &inputs, 1e-12);
}
