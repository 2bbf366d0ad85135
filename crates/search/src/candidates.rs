//! Candidate strategies of one op, from its sharding rule.
//!
//! For every way `devices = dp × mp` (dp a power of two or the device count), the op's
//! data-parallel strategy over `dp` devices, and that strategy with one more dim split `mp`
//! ways: each dim of each operand in turn, alone or together with the same-sized dims of the
//! other operands (a matmul's reduction dim in both inputs, attention's heads in both products).
//! The op's rule ([`parallel::rules::strategy::input_layouts`]) keeps the valid ones, so a GPT's
//! vocabulary-parallel embedding (the table's rows), sequence-parallel stream (the sequence
//! dim) and head splits appear as they are legal. Extra strategies (hints, a user's) are added
//! when valid.

use std::collections::BTreeSet;

use graph::{Graph, Node, Op};
use parallel::rules::{strategy, OpContext};

/// The shapes a strategy has one tuple for: the inputs', or a OneHot's output.
fn operand_shapes<'a>(ctx: &OpContext<'a>) -> Vec<&'a [usize]> {
    match ctx.op {
        Op::OneHot { .. } => vec![ctx.output_shapes[0]],
        _ => ctx.input_shapes.clone(),
    }
}

/// The splits of the batch: powers of two up to `devices`, and `devices` itself.
pub fn batch_splits(devices: usize) -> Vec<usize> {
    let mut out: Vec<usize> = std::iter::successors(Some(1usize), |&d| d.checked_mul(2))
        .take_while(|&d| d <= devices)
        .filter(|d| devices.is_multiple_of(*d))
        .collect();
    if out.last() != Some(&devices) {
        out.push(devices);
    }
    out
}

/// Strategies derived from `base` by splitting one more dim `mp` ways (with its same-sized
/// partners in the other operands, one at a time and all together).
pub fn with_one_more_split(
    shapes: &[&[usize]],
    base: &[Vec<usize>],
    mp: usize,
) -> Vec<Vec<Vec<usize>>> {
    let mut out = Vec::new();
    for (i, shape) in shapes.iter().enumerate() {
        for (d, &size) in shape.iter().enumerate() {
            let current = base[i][d];
            if size % (current * mp) != 0 {
                continue;
            }
            let mut single = base.to_vec();
            single[i][d] *= mp;
            let partners: Vec<(usize, usize)> = shapes
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .flat_map(|(j, other)| {
                    other
                        .iter()
                        .enumerate()
                        .filter(move |&(e, &s)| s == size && base[j][e] == current)
                        .map(move |(e, _)| (j, e))
                })
                .collect();
            let mut all = single.clone();
            let mut first_per_operand = BTreeSet::new();
            for &(j, e) in &partners {
                let mut one = single.clone();
                one[j][e] *= mp;
                out.push(one);
                if first_per_operand.insert(j) {
                    all[j][e] *= mp;
                }
            }
            out.push(single);
            if first_per_operand.len() > 1 {
                out.push(all);
            }
        }
    }
    out
}

/// Candidate strategies of `node` on `devices` devices (unchecked: the caller evaluates them,
/// which rejects those the op's rule refuses), without duplicates, in a fixed order.
pub fn candidates(graph: &Graph, node: &Node, devices: usize) -> Vec<Vec<Vec<usize>>> {
    let ctx = OpContext::of(graph, node);
    let shapes = operand_shapes(&ctx);
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut push = |s: Vec<Vec<usize>>| {
        if seen.insert(s.clone()) {
            out.push(s);
        }
    };
    push(strategy::unsplit_strategy(&ctx));
    for dp in batch_splits(devices) {
        let base = strategy::default_strategy(&ctx, dp);
        if base.len() != shapes.len() {
            continue;
        }
        let mp = devices / dp;
        if mp == 1 {
            push(base);
            continue;
        }
        for s in with_one_more_split(&shapes, &base, mp) {
            push(s);
        }
        if dp > 1 {
            push(base);
        }
    }
    out
}
