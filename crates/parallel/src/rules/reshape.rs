//! Which splits a reshape keeps.
//!
//! The input and output dims are grouped into minimal runs of equal element count (size-1 dims
//! stand alone): `[B, S, H·D]` → `[B, S, H, D]` groups `B|B`, `S|S`, `H·D|H,D`. Within a group
//! the elements of a rank's block are one contiguous run of the group's row-major order exactly
//! when only the group's outermost input dim is split; that run is a block of the group's
//! outermost output dim when the split factor divides that dim. So a split is kept — the output
//! dim takes the input dim's mesh axes — under those two conditions, and refused otherwise.

/// One group of dims: input dims `input` reshape to output dims `output` (each in order, at least
/// one of them non-empty; size-1 dims form groups of their own).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Group {
    input: Vec<usize>,
    output: Vec<usize>,
}

/// The minimal groups of `from` → `to` (equal element counts, no zero-sized dim).
fn groups(from: &[usize], to: &[usize]) -> Vec<Group> {
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    loop {
        // Size-1 dims on either side stand alone.
        if i < from.len() && from[i] == 1 {
            out.push(Group {
                input: vec![i],
                output: Vec::new(),
            });
            i += 1;
            continue;
        }
        if j < to.len() && to[j] == 1 {
            out.push(Group {
                input: Vec::new(),
                output: vec![j],
            });
            j += 1;
            continue;
        }
        if i >= from.len() || j >= to.len() {
            break;
        }
        let mut group = Group {
            input: vec![i],
            output: vec![j],
        };
        let (mut a, mut b) = (from[i], to[j]);
        i += 1;
        j += 1;
        while a != b {
            if a < b && i < from.len() {
                a *= from[i];
                group.input.push(i);
                i += 1;
            } else if j < to.len() {
                b *= to[j];
                group.output.push(j);
                j += 1;
            } else {
                break; // unequal counts: shape inference rejects the op before this
            }
        }
        out.push(group);
    }
    out
}

/// For a reshape of `from` into `to` whose input dims are split `factors[d]` ways: for every
/// output dim, the input dim whose split it takes (`None`: unsplit). An error names the dim whose
/// split cannot be kept.
pub fn kept_splits(
    from: &[usize],
    to: &[usize],
    factors: &[usize],
) -> Result<Vec<Option<usize>>, String> {
    let mut map = vec![None; to.len()];
    if from.contains(&0) || to.contains(&0) {
        return match factors.iter().position(|&f| f > 1) {
            Some(d) => Err(format!(
                "dim {d} of the input is split, but the reshape {from:?} -> {to:?} has no elements"
            )),
            None => Ok(map),
        };
    }
    for group in groups(from, to) {
        let describe = || {
            let sizes = |dims: &[usize], shape: &[usize]| -> Vec<usize> {
                dims.iter().map(|&d| shape[d]).collect()
            };
            format!(
                "input dims {:?} {:?} become output dims {:?} {:?}",
                group.input,
                sizes(&group.input, from),
                group.output,
                sizes(&group.output, to)
            )
        };
        if let Some(&d) = group.input.iter().skip(1).find(|&&d| factors[d] > 1) {
            return Err(format!(
                "dim {d} of the input is split {} ways, but only the outermost dim of a reshaped \
                 group may be split ({})",
                factors[d],
                describe()
            ));
        }
        let (Some(&first_in), Some(&first_out)) = (group.input.first(), group.output.first())
        else {
            continue; // a size-1 dim: never split
        };
        let f = factors[first_in];
        if f == 1 {
            continue;
        }
        if !to[first_out].is_multiple_of(f) {
            return Err(format!(
                "dim {first_in} of the input is split {f} ways, which does not divide output dim \
                 {first_out} (size {}) that it becomes ({})",
                to[first_out],
                describe()
            ));
        }
        map[first_out] = Some(first_in);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_minimal_runs_with_size_one_dims_alone() {
        let g = groups(&[2, 3, 12], &[2, 3, 4, 3]);
        assert_eq!(g.len(), 3);
        assert_eq!(g[2].input, vec![2]);
        assert_eq!(g[2].output, vec![2, 3]);
        // A size-1 dim inside a run belongs to it; around runs it stands alone.
        let g = groups(&[4, 1, 6], &[24, 1]);
        assert_eq!(
            g,
            vec![
                Group {
                    input: vec![0, 1, 2],
                    output: vec![0],
                },
                Group {
                    input: Vec::new(),
                    output: vec![1],
                },
            ]
        );
    }

    #[test]
    fn splits_follow_the_outermost_dim() {
        assert_eq!(
            kept_splits(&[4, 6, 12], &[4, 6, 3, 4], &[2, 1, 3]).unwrap(),
            vec![Some(0), None, Some(2), None]
        );
        assert_eq!(
            kept_splits(&[4, 6, 3, 4], &[4, 6, 12], &[1, 2, 3, 1]).unwrap(),
            vec![None, Some(1), Some(2)]
        );
        assert_eq!(kept_splits(&[4, 6], &[24], &[4, 1]).unwrap(), vec![Some(0)]);
        assert_eq!(
            kept_splits(&[4, 1, 6], &[4, 6, 1], &[2, 1, 3]).unwrap(),
            vec![Some(0), Some(2), None]
        );
    }

    #[test]
    fn refusals_name_the_dim() {
        let e = kept_splits(&[4, 6], &[24], &[1, 2]).unwrap_err();
        assert!(e.starts_with("dim 1 of the input is split 2 ways"), "{e}");
        assert!(e.contains("outermost"), "{e}");
        let e = kept_splits(&[4, 6], &[2, 12], &[4, 1]).unwrap_err();
        assert!(e.contains("does not divide output dim 0 (size 2)"), "{e}");
    }
}
