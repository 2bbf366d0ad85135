//! Fused reductions on the local backend: several pending sums packed into one buffer, reduced
//! as one collective and unpacked, give each destination the sum the unfused plan gives,
//! whether the packing reuses a stale buffer of the right size or allocates its own.

use std::sync::Arc;

use comm::{Communicator, LocalCluster};
use layout::{DimSpec, Layout};
use reshard::{DistLayout, HalfSum, ReshardPlan};
use reshard_exec::{PackedReduction, ReshardRunner};
use tensor::{DType, Tensor};

/// Plans over 2 ranks, each a tensor of `shape` pending a sum over both ranks, to the layout
/// `dst` (`"None"` everywhere: an all-reduce; `"dp"` on the first dim: a reduce-scatter).
fn plans(shapes: &[Vec<usize>], scatter: bool) -> Vec<Arc<ReshardPlan>> {
    let mesh = Layout::new(&[2], &["dp"], None).unwrap();
    shapes
        .iter()
        .map(|shape| {
            let none: Vec<DimSpec> = shape.iter().map(|_| "None".into()).collect();
            let src = mesh.apply(&none).unwrap().bind(shape).unwrap();
            let mut dst_dims = none.clone();
            if scatter {
                dst_dims[0] = "dp".into();
            }
            let dst = mesh.apply(&dst_dims).unwrap().bind(shape).unwrap();
            let src = DistLayout::partial(src, &[0]).unwrap();
            Arc::new(reshard::plan_from(&src, &dst, DType::F32).unwrap())
        })
        .collect()
}

/// Rank `rank`'s share of tensor `i` of `shape`: distinct values on every rank and tensor.
fn share(rank: usize, i: usize, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let values = (0..n)
        .map(|k| (k as f32) * 0.25 + (rank * 100 + i * 10) as f32 + 0.5)
        .collect();
    Tensor::from_vec(shape, values).unwrap()
}

/// On each of 2 ranks: the fused results without a spare, with a stale spare of the right
/// size, with a spare of the wrong size, and the unfused plans' results.
fn run(shapes: Vec<Vec<usize>>, scatter: bool) -> Vec<[Vec<Tensor>; 4]> {
    let plans = plans(&shapes, scatter);
    let results = LocalCluster::new(2).unwrap().run(move |comm| {
        let rank = comm.rank();
        let mut runner = ReshardRunner::new(Arc::new(comm));
        let local: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| share(rank, i, s))
            .collect();
        let srcs: Vec<&Tensor> = local.iter().collect();
        let refs: Vec<&ReshardPlan> = plans.iter().map(|p| &**p).collect();
        let total: usize = local.iter().map(|t| t.n_elements()).sum();
        let stale = Tensor::from_vec(&[total], vec![f32::NAN; total]).unwrap();
        let wrong = Tensor::from_vec(&[total + 1], vec![f32::NAN; total + 1]).unwrap();
        let modes = (false, HalfSum::default());
        let mut fused = |spare: Option<Tensor>| -> Vec<Tensor> {
            let mut packed = PackedReduction::pack(&refs, &srcs, rank, modes, spare)
                .unwrap()
                .expect("the rank reduces");
            runner.reduce_packed(&mut packed).unwrap();
            let mut outs: Vec<Tensor> = plans
                .iter()
                .map(|p| Tensor::zeros(DType::F32, &p.dst().slot_shape(rank)))
                .collect();
            let mut dsts: Vec<&mut Tensor> = outs.iter_mut().collect();
            packed.unpack(&mut dsts).unwrap();
            outs
        };
        let plain = fused(None);
        let reused = fused(Some(stale));
        let dropped = fused(Some(wrong));
        let unfused = plans
            .iter()
            .zip(&local)
            .map(|(p, t)| runner.run(p, vec![t.clone()]).unwrap().remove(0))
            .collect();
        [plain, reused, dropped, unfused]
    });
    results.into_iter().map(|r| r.unwrap()).collect()
}

#[test]
fn a_fused_all_reduce_gives_each_tensor_its_sum_with_or_without_a_spare() {
    let shapes = vec![vec![4, 8], vec![3], vec![2, 5, 3]];
    for (rank, [plain, reused, dropped, unfused]) in run(shapes.clone(), false).iter().enumerate() {
        for (i, shape) in shapes.iter().enumerate() {
            let sum: Vec<f32> = share(0, i, shape)
                .as_f32()
                .unwrap()
                .iter()
                .zip(share(1, i, shape).as_f32().unwrap())
                .map(|(a, b)| a + b)
                .collect();
            assert_eq!(
                plain[i].as_f32().unwrap(),
                &sum[..],
                "rank {rank} tensor {i}"
            );
            assert_eq!(plain[i], unfused[i], "rank {rank} tensor {i}: unfused");
            assert_eq!(reused[i], plain[i], "rank {rank} tensor {i}: stale spare");
            assert_eq!(dropped[i], plain[i], "rank {rank} tensor {i}: wrong spare");
        }
    }
}

#[test]
fn a_fused_reduce_scatter_gives_each_rank_its_part_of_each_sum() {
    let shapes = vec![vec![4, 8], vec![6], vec![2, 5, 3]];
    for (rank, [plain, reused, dropped, unfused]) in run(shapes.clone(), true).iter().enumerate() {
        for (i, shape) in shapes.iter().enumerate() {
            assert_eq!(plain[i].shape()[0], shape[0] / 2, "rank {rank} tensor {i}");
            assert_eq!(plain[i], unfused[i], "rank {rank} tensor {i}: unfused");
            assert_eq!(reused[i], plain[i], "rank {rank} tensor {i}: stale spare");
            assert_eq!(dropped[i], plain[i], "rank {rank} tensor {i}: wrong spare");
        }
    }
}
