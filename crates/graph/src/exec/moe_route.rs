//! The router's kernel of a mixture of experts ([`crate::Op::MoeRoute`]): top-k choices with
//! ties broken by the lower expert index, and capacity slots assigned in token order.
//!
//! Per group `g` of `probs [G, T, E]`, every token's `k` experts are its `k` largest
//! probabilities (equal ones: the lower expert index first; a NaN is never larger than
//! anything). Slots are given out as Switch Transformer and GShard do: first every token's
//! first choice in token order, then every token's second choice, …; the `c`-th token sent to
//! expert `e` takes slot `c` if `c < capacity`, and is dropped for that expert otherwise.

use tensor::kernels::Float;
use tensor::TensorError;

/// The sizes of one [`route_into`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RouteShape {
    /// Groups (`G`): routed independently of each other.
    pub groups: usize,
    /// Tokens per group (`T`).
    pub tokens: usize,
    /// Experts (`E`).
    pub experts: usize,
    /// Experts chosen per token (`k`).
    pub top_k: usize,
    /// Slots per expert and group (`C`).
    pub capacity: usize,
}

/// The outputs of [`route_into`], each written whole.
pub(crate) struct RouteOutputs<'a, T> {
    /// `[G, T, E, C]`: 1 where token `t` holds slot `c` of expert `e`, else 0.
    pub dispatch: &'a mut [T],
    /// `[G, T, E]`: 1 where `e` is one of token `t`'s `k` choices (kept or dropped).
    pub chosen: &'a mut [T],
    /// `[G, T, E]`: 1 where `e` is token `t`'s first choice.
    pub first: &'a mut [T],
}

/// Whether probability `p` ranks above `q`: larger, or a number against a NaN.
fn beats<T: Float>(p: T, q: T) -> bool {
    p > q || (q.to_f64().is_nan() && !p.to_f64().is_nan())
}

/// The `top_k` expert indices of `row`, largest first; ties go to the lower index.
fn top_k_of<T: Float>(row: &[T], top_k: usize, picks: &mut Vec<usize>) {
    picks.clear();
    for _ in 0..top_k {
        let mut best: Option<usize> = None;
        for (e, &p) in row.iter().enumerate() {
            if picks.contains(&e) {
                continue;
            }
            // Strictly larger only: an equal probability keeps the lower index.
            if best.is_none_or(|b| beats(p, row[b])) {
                best = Some(e);
            }
        }
        picks.extend(best);
    }
}

/// Routes `probs [G, T, E]` into `out` (see the module docs).
pub(crate) fn route_into<T: Float>(
    probs: &[T],
    shape: RouteShape,
    out: RouteOutputs<'_, T>,
) -> Result<(), TensorError> {
    let RouteShape {
        groups,
        tokens,
        experts,
        top_k,
        capacity,
    } = shape;
    let rows = groups * tokens;
    if probs.len() != rows * experts
        || out.chosen.len() != rows * experts
        || out.first.len() != rows * experts
        || out.dispatch.len() != rows * experts * capacity
        || top_k == 0
        || top_k > experts
    {
        return Err(TensorError::InvalidArgument {
            op: "moe_route",
            reason: format!(
                "{} probabilities, {} dispatch slots and {}/{} mask elements do not fit \
                 {groups} groups × {tokens} tokens × {experts} experts × capacity {capacity} \
                 with top-{top_k}",
                probs.len(),
                out.dispatch.len(),
                out.chosen.len(),
                out.first.len()
            ),
        });
    }
    out.dispatch.fill(T::ZERO);
    out.chosen.fill(T::ZERO);
    out.first.fill(T::ZERO);
    let mut choices = vec![0usize; tokens * top_k];
    let mut picks = Vec::with_capacity(top_k);
    let mut used = vec![0usize; experts];
    for g in 0..groups {
        let group = g * tokens;
        for t in 0..tokens {
            let row = group + t;
            top_k_of(
                &probs[row * experts..(row + 1) * experts],
                top_k,
                &mut picks,
            );
            choices[t * top_k..(t + 1) * top_k].copy_from_slice(&picks);
            out.first[row * experts + picks[0]] = T::ONE;
            for &e in &picks {
                out.chosen[row * experts + e] = T::ONE;
            }
        }
        used.fill(0);
        for j in 0..top_k {
            for t in 0..tokens {
                let e = choices[t * top_k + j];
                let slot = used[e];
                used[e] += 1;
                if slot < capacity {
                    let row = group + t;
                    out.dispatch[(row * experts + e) * capacity + slot] = T::ONE;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Routes one group; returns (dispatch, chosen, first).
    fn route(
        probs: &[f64],
        tokens: usize,
        experts: usize,
        top_k: usize,
        capacity: usize,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut dispatch = vec![9.0; tokens * experts * capacity];
        let mut chosen = vec![9.0; tokens * experts];
        let mut first = vec![9.0; tokens * experts];
        let shape = RouteShape {
            groups: 1,
            tokens,
            experts,
            top_k,
            capacity,
        };
        let out = RouteOutputs {
            dispatch: &mut dispatch,
            chosen: &mut chosen,
            first: &mut first,
        };
        route_into(probs, shape, out).unwrap();
        (dispatch, chosen, first)
    }

    /// The (expert, slot) of every 1 of token `t`'s dispatch rows.
    fn slots(dispatch: &[f64], t: usize, experts: usize, capacity: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for e in 0..experts {
            for c in 0..capacity {
                if dispatch[(t * experts + e) * capacity + c] == 1.0 {
                    out.push((e, c));
                }
            }
        }
        out
    }

    #[test]
    fn ties_go_to_the_lower_expert_index() {
        // Three experts all equal, then a tie between experts 1 and 2 below expert 0.
        let probs = [1.0, 1.0, 1.0, 0.5, 0.25, 0.25];
        let (_, chosen, first) = route(&probs, 2, 3, 2, 4);
        assert_eq!(first, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
        assert_eq!(chosen, [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]);
    }

    #[test]
    fn a_nan_is_never_chosen_over_a_number() {
        let (_, chosen, _) = route(&[f64::NAN, 0.1, 0.2], 1, 3, 2, 1);
        assert_eq!(chosen, [0.0, 1.0, 1.0]);
    }

    #[test]
    fn capacity_takes_first_choices_in_token_order_then_second_choices() {
        // 4 tokens, 2 experts, top-2, capacity 3: every token picks both experts.
        // First choices: t0 → 0, t1 → 1, t2 → 0, t3 → 0; second choices: t0 → 1, t1 → 0,
        // t2 → 1, t3 → 1.
        let probs = [0.9, 0.1, 0.2, 0.8, 0.6, 0.4, 0.7, 0.3];
        let (dispatch, chosen, first) = route(&probs, 4, 2, 2, 3);
        assert_eq!(slots(&dispatch, 0, 2, 3), [(0, 0), (1, 1)]);
        assert_eq!(
            slots(&dispatch, 1, 2, 3),
            [(1, 0)],
            "t1's second choice is dropped"
        );
        assert_eq!(slots(&dispatch, 2, 2, 3), [(0, 1), (1, 2)]);
        assert_eq!(
            slots(&dispatch, 3, 2, 3),
            [(0, 2)],
            "t3's second choice is dropped"
        );
        let kept: f64 = dispatch.iter().sum();
        let routed: f64 = chosen.iter().sum();
        assert_eq!((routed - kept) as usize, 2, "dropped token-choices");
        assert_eq!(first, [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]);
    }

    #[test]
    fn groups_route_independently() {
        // The same group twice: the second starts with empty experts again.
        let probs = [0.9, 0.1, 0.8, 0.2, 0.9, 0.1, 0.8, 0.2];
        let mut dispatch = vec![0.0; 8];
        let (mut chosen, mut first) = (vec![0.0; 8], vec![0.0; 8]);
        let shape = RouteShape {
            groups: 2,
            tokens: 2,
            experts: 2,
            top_k: 1,
            capacity: 1,
        };
        let out = RouteOutputs {
            dispatch: &mut dispatch,
            chosen: &mut chosen,
            first: &mut first,
        };
        route_into(&probs, shape, out).unwrap();
        assert_eq!(dispatch, [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn bad_sizes_are_errors() {
        let shape = RouteShape {
            groups: 1,
            tokens: 1,
            experts: 2,
            top_k: 3,
            capacity: 1,
        };
        let (mut d, mut c, mut f) = (vec![0.0; 2], vec![0.0; 2], vec![0.0; 2]);
        let out = RouteOutputs {
            dispatch: &mut d,
            chosen: &mut c,
            first: &mut f,
        };
        assert!(route_into(&[0.5f64, 0.5], shape, out).is_err());
    }
}
