//! Comparing two checkpoints tensor by tensor, each merged on the fly from its own strategy
//! (`tessera ckpt diff`, issue 17: checking that two runs are bitwise equal).
//!
//! Each side is a checkpoint directory (`rank_<N>/`) and the strategy file it was saved under,
//! of any flavour. Every parameter the strategies list is read whole, one at a time per side,
//! by the same planner that loads a checkpoint for another strategy (only the pieces needed,
//! from a minimal set of files), so memory is bounded by two copies of the largest tensor, not
//! by the checkpoint.

use std::path::{Path, PathBuf};

use layout::SliceBox;
use tensor::{DType, Storage, Tensor};

use super::engine::gather::fill_chunk;
use super::engine::plan::plan_gathers;
use crate::error::{CkptError, Result};
use crate::model::{ResolvedParam, ResolvedStrategy};
use crate::source::SourceSet;

/// One side of a comparison: a checkpoint directory holding `rank_<N>/` folders and the
/// strategy file it was saved under (a training run saves `strategy.json` in its directory).
#[derive(Debug, Clone, Copy)]
pub struct DiffSide<'a> {
    /// The checkpoint directory.
    pub dir: &'a Path,
    /// Its strategy file (any flavour).
    pub strategy: &'a Path,
}

/// How two elements differ, the largest over a tensor.
///
/// For elements `a` and `b` (as f64): the absolute difference `|a − b|`; the relative difference
/// `|a − b| / max(|a|, |b|)` (0 when both are 0); and the *scaled* difference
/// `|a − b| / max(1, |a|, |b|)`, absolute for values of magnitude up to 1 and relative above,
/// which a tolerance is checked against ([`TensorDiff::within`]). Two NaNs count as equal (but
/// not as bitwise equal unless their bits are); a NaN against a number, or infinities of
/// different signs, differ by infinity.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DiffStats {
    /// Elements whose bits differ.
    pub n_differing: usize,
    /// The largest absolute difference.
    pub max_abs: f64,
    /// The largest relative difference.
    pub max_rel: f64,
    /// The largest scaled difference.
    pub max_scaled: f64,
}

/// What the comparison found for one tensor that both checkpoints hold.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorComparison {
    /// Same global shape and dtype: compared element by element.
    Compared(DiffStats),
    /// The global shapes differ (nothing was read).
    ShapeMismatch {
        /// The shape in checkpoint A.
        a: Vec<usize>,
        /// The shape in checkpoint B.
        b: Vec<usize>,
    },
    /// The stored dtypes differ (nothing was compared).
    DTypeMismatch {
        /// The dtype in checkpoint A.
        a: DType,
        /// The dtype in checkpoint B.
        b: DType,
    },
}

/// One tensor held by both checkpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDiff {
    /// The tensor's name.
    pub name: String,
    /// Its global shape (checkpoint A's).
    pub shape: Vec<usize>,
    /// Its dtype (checkpoint A's), when the strategy or file says.
    pub dtype: Option<DType>,
    /// The result.
    pub comparison: TensorComparison,
}

impl TensorDiff {
    /// Whether every element's bits are equal (same shape and dtype).
    pub fn bitwise_equal(&self) -> bool {
        matches!(&self.comparison, TensorComparison::Compared(s) if s.n_differing == 0)
    }

    /// Whether every element is within `tolerance` in the scaled difference of [`DiffStats`]
    /// (`|a − b| ≤ tolerance · max(1, |a|, |b|)`), with the same shape and dtype.
    pub fn within(&self, tolerance: f64) -> bool {
        matches!(&self.comparison, TensorComparison::Compared(s) if s.max_scaled <= tolerance)
    }
}

/// The comparison of two checkpoints.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DiffReport {
    /// Every tensor both hold, in checkpoint A's strategy order.
    pub tensors: Vec<TensorDiff>,
    /// Tensors only checkpoint A holds.
    pub only_in_a: Vec<String>,
    /// Tensors only checkpoint B holds.
    pub only_in_b: Vec<String>,
}

impl DiffReport {
    /// Whether both hold the same tensors, each bitwise equal.
    pub fn bitwise_equal(&self) -> bool {
        self.only_in_a.is_empty()
            && self.only_in_b.is_empty()
            && self.tensors.iter().all(TensorDiff::bitwise_equal)
    }

    /// Whether both hold the same tensors, each [within](TensorDiff::within) `tolerance`.
    pub fn within(&self, tolerance: f64) -> bool {
        self.only_in_a.is_empty()
            && self.only_in_b.is_empty()
            && self.tensors.iter().all(|t| t.within(tolerance))
    }
}

/// One side, opened.
struct Opened {
    dir: PathBuf,
    sources: SourceSet,
    strategy: ResolvedStrategy,
}

impl Opened {
    fn open(side: &DiffSide<'_>) -> Result<Opened> {
        let sources = SourceSet::rank_dirs(side.dir)?;
        let strategy = sources.load_strategy(side.strategy)?;
        let (strategy, _) = sources.resolve_source(&strategy)?;
        Ok(Opened {
            dir: side.dir.to_path_buf(),
            sources,
            strategy,
        })
    }

    /// Reads `param` whole (merged from the pieces the ranks hold).
    fn read_whole(&self, param: &ResolvedParam) -> Result<Tensor> {
        let plan = plan_gathers(&self.sources, vec![(param, SliceBox::full(&param.shape))])?;
        let item = plan.items.first().ok_or_else(|| CkptError::TensorMissing {
            path: self.dir.clone(),
            tensor: param.name.clone(),
            rule: "the strategy lists it but no file of the checkpoint holds it".to_string(),
        })?;
        let dtype = item.meta.dtype().ok_or_else(|| CkptError::Unsupported {
            path: self.dir.clone(),
            tensor: param.name.clone(),
            reason: "its element type is not numeric, so it cannot be compared".to_string(),
        })?;
        let mut tensor = Tensor::zeros(dtype, &item.meta.shape);
        let whole = SliceBox::full(&item.meta.shape);
        let mut scratch = Vec::new();
        fill_chunk(
            &self.sources,
            item,
            &whole,
            tensor.as_bytes_mut(),
            &mut scratch,
        )?;
        Ok(tensor)
    }
}

/// Compares checkpoints `a` and `b` (any strategies): every parameter either strategy lists,
/// merged whole on the fly, one tensor at a time. `on_tensor` sees each tensor's result as it
/// is found (for progress). Tensors present on one side only are listed in the report, not
/// errors; unreadable checkpoints (missing files, bad strategies) are errors.
pub fn diff_checkpoints(
    a: &DiffSide<'_>,
    b: &DiffSide<'_>,
    on_tensor: &mut dyn FnMut(&TensorDiff),
) -> Result<DiffReport> {
    let (a, b) = (Opened::open(a)?, Opened::open(b)?);
    let mut report = DiffReport::default();
    for pa in a.strategy.params() {
        let Some(pb) = b.strategy.param(&pa.name) else {
            report.only_in_a.push(pa.name.clone());
            continue;
        };
        let mut diff = TensorDiff {
            name: pa.name.clone(),
            shape: pa.shape.clone(),
            dtype: pa.dtype,
            comparison: TensorComparison::ShapeMismatch {
                a: pa.shape.clone(),
                b: pb.shape.clone(),
            },
        };
        if pa.shape == pb.shape {
            if let (Some(da), Some(db)) = (pa.dtype, pb.dtype) {
                if da != db {
                    diff.comparison = TensorComparison::DTypeMismatch { a: da, b: db };
                }
            }
            if !matches!(diff.comparison, TensorComparison::DTypeMismatch { .. }) {
                let ta = a.read_whole(pa)?;
                let tb = b.read_whole(pb)?;
                diff.dtype = Some(ta.dtype());
                diff.comparison = if ta.dtype() != tb.dtype() {
                    TensorComparison::DTypeMismatch {
                        a: ta.dtype(),
                        b: tb.dtype(),
                    }
                } else {
                    TensorComparison::Compared(compare_tensors(&ta, &tb))
                };
            }
        }
        on_tensor(&diff);
        report.tensors.push(diff);
    }
    report.only_in_b = b
        .strategy
        .params()
        .iter()
        .filter(|p| a.strategy.param(&p.name).is_none())
        .map(|p| p.name.clone())
        .collect();
    Ok(report)
}

/// Element-wise differences of two tensors of one dtype and shape.
pub fn compare_tensors(a: &Tensor, b: &Tensor) -> DiffStats {
    let mut stats = DiffStats::default();
    match (a.storage(), b.storage()) {
        (Storage::F32(x), Storage::F32(y)) => {
            for (&p, &q) in x.iter().zip(y) {
                if p.to_bits() != q.to_bits() {
                    add(&mut stats, f64::from(p), f64::from(q));
                }
            }
        }
        (Storage::F64(x), Storage::F64(y)) => {
            for (&p, &q) in x.iter().zip(y) {
                if p.to_bits() != q.to_bits() {
                    add(&mut stats, p, q);
                }
            }
        }
        _ => {
            if a.as_bytes() != b.as_bytes() {
                let size = a.dtype().size_in_bytes();
                let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
                let chunks = a.as_bytes().chunks(size).zip(b.as_bytes().chunks(size));
                for ((p, q), (ba, bb)) in x.iter().zip(&y).zip(chunks) {
                    if ba != bb {
                        add(&mut stats, *p, *q);
                    }
                }
            }
        }
    }
    stats
}

/// Accounts one pair of elements whose bits differ.
fn add(stats: &mut DiffStats, a: f64, b: f64) {
    stats.n_differing += 1;
    let abs = if a.is_nan() && b.is_nan() {
        0.0
    } else if a == b {
        // 0.0 and -0.0, or the same infinity: equal values, different bits.
        0.0
    } else {
        let d = (a - b).abs();
        if d.is_nan() {
            f64::INFINITY
        } else {
            d
        }
    };
    let magnitude = a.abs().max(b.abs());
    let rel = if abs == 0.0 {
        0.0
    } else if magnitude.is_finite() {
        abs / magnitude
    } else {
        f64::INFINITY
    };
    let scaled = if abs == 0.0 {
        0.0
    } else {
        abs / magnitude.max(1.0)
    };
    stats.max_abs = stats.max_abs.max(abs);
    stats.max_rel = stats.max_rel.max(rel);
    stats.max_scaled = stats.max_scaled.max(if scaled.is_nan() {
        f64::INFINITY
    } else {
        scaled
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_ulp_is_a_difference_within_a_small_tolerance() {
        let a = Tensor::from_vec(&[3], vec![1.0f32, -2.5, 1000.0]).unwrap();
        let next = f32::from_bits(1000f32.to_bits() + 1);
        let b = Tensor::from_vec(&[3], vec![1.0f32, -2.5, next]).unwrap();
        let s = compare_tensors(&a, &b);
        assert_eq!(s.n_differing, 1);
        assert_eq!(s.max_abs, f64::from(next) - 1000.0);
        assert!(s.max_rel > 0.0 && s.max_rel < 1e-7, "{s:?}");
        assert_eq!(s.max_rel, s.max_scaled);
        assert_eq!(compare_tensors(&a, &a), DiffStats::default());
    }

    #[test]
    fn zeros_of_both_signs_and_nans_differ_in_bits_only() {
        let a = Tensor::from_vec(&[2], vec![0.0f64, f64::NAN]).unwrap();
        let b = Tensor::from_vec(&[2], vec![-0.0f64, -f64::NAN]).unwrap();
        let s = compare_tensors(&a, &b);
        assert_eq!(s.n_differing, 2);
        assert_eq!((s.max_abs, s.max_rel, s.max_scaled), (0.0, 0.0, 0.0));
        let c = Tensor::from_vec(&[2], vec![0.0f64, 1.0]).unwrap();
        assert_eq!(compare_tensors(&a, &c).max_scaled, f64::INFINITY);
    }

    #[test]
    fn small_values_are_compared_absolutely_and_integers_by_value() {
        let a = Tensor::from_vec(&[2], vec![1e-9f32, 5.0]).unwrap();
        let b = Tensor::from_vec(&[2], vec![2e-9f32, 5.0]).unwrap();
        let s = compare_tensors(&a, &b);
        assert!(s.max_rel > 0.49, "{s:?}");
        assert!(s.max_scaled < 2e-9, "{s:?}");
        let i = Tensor::from_vec(&[3], vec![1i64, 7, -3]).unwrap();
        let j = Tensor::from_vec(&[3], vec![1i64, 4, -3]).unwrap();
        let s = compare_tensors(&i, &j);
        assert_eq!((s.n_differing, s.max_abs), (1, 3.0));
    }
}
