//! Running a reshard plan on local ranks and checking every rank's result against its box of
//! the global tensor (`tessera reshard --run`); the sources are the same global values
//! [`crate::reshard`] times.
//!
//! (It sits here rather than in `reshard` because `reshard` is being split into planning and
//! execution; it belongs beside the executor once that split lands.)

use std::sync::Arc;

use comm::{CommError, Communicator, LocalCluster};
use reshard::ReshardPlan;
use reshard_exec::{DistTensor, ReshardRunner};
use tensor::{DType, Tensor};

use crate::BenchError;

/// Number of ranks needed to run `plan`: one past the largest rank of either mesh.
pub fn world_size(plan: &ReshardPlan) -> usize {
    let ranks = plan
        .src()
        .layout()
        .mesh()
        .device_ranks()
        .into_iter()
        .chain(plan.dst().mesh().device_ranks());
    ranks.max().map_or(1, |r| r.saturating_add(1))
}

/// A global tensor with a distinct value per element (exact in f32 up to 2^24 elements; beyond
/// that values repeat with period 2^24, which still catches misplaced blocks).
pub fn iota(shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(shape, (0..n).map(|i| (i % (1 << 24)) as f32).collect())
        .expect("the shape matches the data")
        .to_dtype(dtype)
}

/// This rank's source slices; for a partial source, member `j` of each partial group holds a
/// share such that the shares add up to the global values.
pub fn source_slices(
    plan: &ReshardPlan,
    global: &Tensor,
    rank: usize,
) -> Result<Vec<Tensor>, BenchError> {
    let src = plan.src();
    let mut local = DistTensor::from_global(global, src.layout(), rank)?.into_local();
    if src.is_partial() {
        let mesh = src.layout().mesh();
        let groups = src.partial_slot_groups();
        let slots: Vec<usize> = (0..mesh.n_slots())
            .filter(|&s| mesh.device_of_slot(s) == rank)
            .collect();
        for (t, &slot) in local.iter_mut().zip(&slots) {
            let j = groups
                .iter()
                .find_map(|g| g.iter().position(|&s| s == slot))
                .expect("every slot is in a partial group");
            if j > 0 {
                *t = Tensor::zeros(t.dtype(), t.shape());
            }
        }
    }
    Ok(local)
}

/// The bytes [`run_and_check`] holds at once: the global tensor (made in f32, then
/// converted), every source slice, and every destination slice with the expected copy it is
/// compared against; `None` when that does not fit in 64 bits.
pub fn run_bytes(plan: &ReshardPlan) -> Option<usize> {
    let elem = plan.dtype().size_in_bytes();
    let src = plan.src().layout();
    let dst = plan.dst();
    let global = src.n_elements().checked_mul(4 + elem)?;
    let sources = src.mesh().n_slots().checked_mul(src.slice_elements())?;
    let results = dst.mesh().n_slots().checked_mul(dst.slice_elements())?;
    let elements = sources.checked_add(results.checked_mul(2)?)?;
    global.checked_add(elements.checked_mul(elem)?)
}

/// How one rank's run ended.
#[derive(Debug)]
pub enum RankCheck {
    /// Every destination slice it holds is its box of the global tensor.
    Matches,
    /// It holds data different from its box.
    Differs,
    /// Its run failed.
    Failed(BenchError),
    /// Its thread panicked.
    Panicked(CommError),
}

/// Runs `plan` on [`world_size`] local ranks (one thread each) from the values of [`iota`]
/// and checks every rank's result; one outcome per rank, in rank order. The caller checks
/// first that the run fits the machine ([`run_bytes`]).
pub fn run_and_check(plan: &ReshardPlan) -> Result<Vec<RankCheck>, BenchError> {
    let world = world_size(plan);
    let global = iota(plan.dst().shape(), plan.dtype());
    let results = LocalCluster::new(world)?.run(|comm| -> Result<bool, BenchError> {
        let rank = comm.rank();
        let local = source_slices(plan, &global, rank)?;
        let mut runner = ReshardRunner::new(Arc::new(comm));
        let got = runner.run(plan, local)?;
        let dst = plan.dst();
        let mesh = dst.mesh();
        let slots = (0..mesh.n_slots()).filter(|&s| mesh.device_of_slot(s) == rank);
        let mut ok = true;
        for (t, slot) in got.iter().zip(slots) {
            ok &= *t == global.extract_box(&dst.slot_box(slot))?;
        }
        Ok(ok)
    });
    Ok(results
        .into_iter()
        .map(|r| match r {
            Ok(Ok(true)) => RankCheck::Matches,
            Ok(Ok(false)) => RankCheck::Differs,
            Ok(Err(e)) => RankCheck::Failed(e),
            Err(e) => RankCheck::Panicked(e),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use layout::{DimSpec, Layout};
    use reshard::DistLayout;

    use super::*;

    #[test]
    fn every_rank_of_a_partial_source_gets_its_box() {
        let mesh = || Layout::new(&[2, 2], &["a", "b"], None).unwrap();
        let src = mesh()
            .apply(&[DimSpec::parse("a"), DimSpec::parse("None")])
            .unwrap()
            .bind(&[4, 8])
            .unwrap();
        let dst = mesh()
            .apply(&[DimSpec::parse("None"), DimSpec::parse("a+b")])
            .unwrap()
            .bind(&[4, 8])
            .unwrap();
        // A pending sum over `b`: the shares of each pair add up to the global values.
        let src = DistLayout::partial(src, &[1]).unwrap();
        let plan = reshard::plan_from(&src, &dst, DType::F32).unwrap();
        assert_eq!(world_size(&plan), 4);
        assert!(run_bytes(&plan).is_some_and(|b| b > 0));
        let outcomes = run_and_check(&plan).unwrap();
        assert_eq!(outcomes.len(), 4);
        assert!(
            outcomes.iter().all(|o| matches!(o, RankCheck::Matches)),
            "{outcomes:?}"
        );
    }
}
