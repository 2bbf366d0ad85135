//! Random layout pairs (up to 4 mesh axes, up to 32 ranks, multi-axis and replicated dims,
//! different meshes and rank lists on each side): executing the plan on the local backend gives
//! every rank exactly its box of the global tensor, and the bytes moved equal the lower bound.
//! Partial (pending-sum) sources resolve to the same values.

use comm::{Communicator, LocalCluster};
use layout::{Layout, Mesh, MeshAxis, TensorLayout};
use proptest::prelude::*;
use reshard::{DistLayout, PendingOp};
use reshard_exec::{DistTensor, ReshardRunner};
use std::sync::Arc;
use tensor::{DType, Tensor};

/// A random mesh over `n_ranks` of a world and a random layout on it for a tensor of `shape`
/// (the shape is chosen so every layout divides it).
#[derive(Debug, Clone)]
struct MeshSpec {
    sizes: Vec<usize>,
    ranks: Vec<usize>,
    /// For each axis: the dim it splits (`>= ndim` = unused) and an order key.
    assignment: Vec<(usize, u8)>,
}

fn arb_mesh(world: usize) -> impl Strategy<Value = MeshSpec> {
    proptest::collection::vec(
        prop_oneof![Just(1usize), Just(2), Just(2), Just(4), Just(3)],
        1..=4,
    )
    .prop_filter("fits in the world", move |sizes| {
        sizes.iter().product::<usize>() <= world
    })
    .prop_flat_map(move |sizes| {
        let n: usize = sizes.iter().product();
        let n_axes = sizes.len();
        (
            Just(sizes),
            Just((0..world).collect::<Vec<usize>>()).prop_shuffle(),
            proptest::collection::vec((0usize..3, any::<u8>()), n_axes),
            Just(n),
        )
    })
    .prop_map(|(sizes, shuffled, assignment, n)| MeshSpec {
        sizes,
        ranks: shuffled[..n].to_vec(),
        assignment,
    })
}

impl MeshSpec {
    fn layout(&self, ndim: usize) -> Layout {
        let axes = self
            .sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| MeshAxis {
                name: format!("m{i}"),
                size,
            })
            .collect();
        let mesh = Mesh::from_axes(axes, Some(self.ranks.clone())).unwrap();
        let mut dims: Vec<Vec<(u8, usize)>> = vec![Vec::new(); ndim];
        for (axis, &(dim, key)) in self.assignment.iter().enumerate() {
            if dim < ndim {
                dims[dim].push((key, axis));
            }
        }
        let dims = dims
            .into_iter()
            .map(|mut d| {
                d.sort();
                d.into_iter().map(|(_, a)| a).collect()
            })
            .collect();
        Layout::from_mesh(mesh, dims).unwrap()
    }
}

/// A global tensor with a distinct value per element.
fn global(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(shape, (0..n).map(|i| i as f32).collect()).unwrap()
}

/// Runs `plan` from `src` (optionally partial over `partial`) to `dst` on `world` local ranks,
/// at once and as a started reshard finished later ([`ReshardRunner::start_into`], which starts
/// an all-gather plan's collective), and checks every destination slice of both against the
/// global tensor.
fn run_and_check(world: usize, src: &DistLayout, dst: &TensorLayout) {
    let g = global(dst.shape());
    let plan = reshard::plan_from(src, dst, DType::F32).unwrap();
    let plan = Arc::new(plan);
    let results = LocalCluster::new(world).unwrap().run({
        let plan = plan.clone();
        let g = g.clone();
        let src = src.clone();
        move |comm| -> Result<Vec<Tensor>, String> {
            let rank = comm.rank();
            let mut runner = ReshardRunner::new(Arc::new(comm));
            let mut local = DistTensor::from_global(&g, src.layout(), rank)
                .map_err(|e| e.to_string())?
                .into_local();
            // A partial source: member j of each partial group holds a share of the value.
            if src.is_partial() {
                let mesh = src.layout().mesh();
                let slots: Vec<usize> = (0..mesh.n_slots())
                    .filter(|&s| mesh.device_of_slot(s) == rank)
                    .collect();
                for (t, &slot) in local.iter_mut().zip(&slots) {
                    let n = src.partial_count();
                    let j = src
                        .partial_slot_groups()
                        .iter()
                        .find_map(|grp| grp.iter().position(|&s| s == slot))
                        .unwrap();
                    let offsets: f32 = (0..n - 1).map(|k| (k + 1) as f32).sum();
                    let max = src.pending_op() == PendingOp::Max;
                    for x in t.as_f32_mut().unwrap() {
                        *x = match (j + 1 < n, max) {
                            // Partial maxima: the last member holds the value, the others less.
                            (true, true) => *x - (j + 1) as f32,
                            (false, true) => *x,
                            (true, false) => (j + 1) as f32,
                            (false, false) => *x - offsets,
                        };
                    }
                }
            }
            let dst = plan.dst();
            let out: Vec<Tensor> = (0..dst.mesh().n_slots())
                .filter(|&s| dst.mesh().device_of_slot(s) == rank)
                .map(|s| Tensor::zeros(DType::F32, &dst.slot_shape(s)))
                .collect();
            let refs: Vec<&Tensor> = local.iter().collect();
            let started = runner
                .start_into(&plan, &refs, out)
                .and_then(|s| runner.finish_into(&plan, s))
                .map_err(|e| e.to_string())?;
            let at_once = runner.run(&plan, local).map_err(|e| e.to_string())?;
            if started != at_once {
                return Err("the started reshard differs from the one run at once".to_string());
            }
            Ok(at_once)
        }
    });
    let mesh = dst.mesh();
    for (rank, result) in results.into_iter().enumerate() {
        let got = result
            .unwrap_or_else(|e| panic!("rank {rank}: {e}"))
            .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        let slots: Vec<usize> = (0..mesh.n_slots())
            .filter(|&s| mesh.device_of_slot(s) == rank)
            .collect();
        assert_eq!(got.len(), slots.len(), "rank {rank}");
        for (t, &s) in got.iter().zip(&slots) {
            let want = g.extract_box(&dst.slot_box(s)).unwrap();
            assert_eq!(t, &want, "rank {rank} slot {s}: {}", plan.explain());
        }
    }
}

/// A world size and two meshes drawn from it.
fn arb_pair(max_world: usize) -> impl Strategy<Value = (usize, MeshSpec, MeshSpec)> {
    (2usize..=max_world).prop_flat_map(|world| (Just(world), arb_mesh(world), arb_mesh(world)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn executed_plans_deliver_every_box_with_minimal_bytes(
        (world, spec_a, spec_b) in arb_pair(32),
        ndim in 1usize..=3,
        mult in proptest::collection::vec(1usize..=2, 3),
    ) {
        let la = spec_a.layout(ndim);
        let lb = spec_b.layout(ndim);
        // A shape every split of both layouts divides.
        let shape: Vec<usize> = (0..ndim)
            .map(|d| la.split_factors()[d] * lb.split_factors()[d] * mult[d])
            .collect();
        let a = la.bind(&shape).unwrap();
        let b = lb.bind(&shape).unwrap();
        let plan = reshard::plan(&a, &b, DType::F32).unwrap();
        prop_assert_eq!(plan.bytes_total(), plan.bytes_lower_bound());
        run_and_check(world, &a.clone().into(), &b);
        // And back.
        run_and_check(world, &b.clone().into(), &a);
    }

    #[test]
    fn partial_sources_resolve_to_the_sum(
        (world, spec_a, spec_b) in arb_pair(16),
        ndim in 1usize..=2,
        max in any::<bool>(),
    ) {
        let la = spec_a.layout(ndim);
        let lb = spec_b.layout(ndim);
        let unused = la.unused_axes();
        if unused.is_empty() {
            return Ok(());
        }
        let shape: Vec<usize> = (0..ndim)
            .map(|d| la.split_factors()[d] * lb.split_factors()[d] * 4 * 3)
            .collect();
        let a = la.bind(&shape).unwrap();
        let b = lb.bind(&shape).unwrap();
        let src = DistLayout::partial(a, &unused).unwrap();
        let src = if max { src.with_op(PendingOp::Max) } else { src };
        run_and_check(world, &src, &b);
    }
}

/// Splits `total` rows into `parts` blocks of at least one row each, spreading the rest by `seeds`.
fn composition(total: usize, parts: usize, seeds: &[u8]) -> Vec<usize> {
    let mut rows = vec![1; parts];
    for i in 0..total - parts {
        rows[usize::from(seeds[i % seeds.len()]) % parts] += 1;
    }
    rows
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Manual (uneven) row splits on either side, and a pending sum over an uneven source: the
    /// plan still delivers every box and moves the fewest bytes.
    #[test]
    fn uneven_row_splits_reshard_exactly(
        (world, spec_a, spec_b) in arb_pair(16),
        ndim in 1usize..=2,
        extra in 0usize..6,
        seeds_a in proptest::collection::vec(any::<u8>(), 1..8),
        seeds_b in proptest::collection::vec(any::<u8>(), 1..8),
        partial in any::<bool>(),
    ) {
        let la = spec_a.layout(ndim);
        let lb = spec_b.layout(ndim);
        let (fa, fb) = (la.split_factors(), lb.split_factors());
        let rows = fa[0] + fb[0] + extra;
        let mut shape: Vec<usize> = (0..ndim).map(|d| fa[d] * fb[d] * 2).collect();
        shape[0] = rows;
        let bind_uneven = |l: &Layout, f: usize, seeds: &[u8]| -> TensorLayout {
            TensorLayout::with_rows(l.clone(), &shape, &composition(rows, f, seeds)).unwrap()
        };
        let a = bind_uneven(&la, fa[0], &seeds_a);
        let b = bind_uneven(&lb, fb[0], &seeds_b);
        let src: DistLayout = if partial && !la.unused_axes().is_empty() {
            DistLayout::partial(a.clone(), &la.unused_axes()).unwrap()
        } else {
            a.clone().into()
        };
        let plan = reshard::plan_from(&src, &b, DType::F32).unwrap();
        prop_assert_eq!(plan.bytes_total(), plan.bytes_lower_bound());
        run_and_check(world, &src, &b);
        run_and_check(world, &b.clone().into(), &a);
    }
}

#[test]
fn pending_maxima_all_reduce_or_reduce_scatter_with_max() {
    let mesh = Layout::new(&[2, 2], &["dp", "tp"], None).unwrap();
    let bind = |a: &str, b: &str| {
        mesh.apply(&[a.into(), b.into()])
            .unwrap()
            .bind(&[4, 8])
            .unwrap()
    };
    let src = DistLayout::partial(bind("dp", "None"), &[1])
        .unwrap()
        .with_op(PendingOp::Max);
    assert!(src.to_string().contains("pending max over tp"), "{src}");
    for (dst, what) in [
        (bind("dp", "tp"), "reduce-scatter (max) along dim 1"),
        (bind("dp", "None"), "all-reduce (max)"),
    ] {
        let plan = reshard::plan_from(&src, &dst, DType::F32).unwrap();
        let sum_plan = reshard::plan_from(
            &DistLayout::partial(src.layout().clone(), &[1]).unwrap(),
            &dst,
            DType::F32,
        )
        .unwrap();
        assert!(plan.explain().contains(what), "{}", plan.explain());
        // A maximum moves what a sum moves.
        assert_eq!(plan.bytes_total(), sum_plan.bytes_total());
        run_and_check(4, &src, &dst);
    }
}

#[test]
fn matmul_output_reduce_scatters_onto_the_consumer_split() {
    // (dp, None) pending a sum over tp -> (dp, tp): a reduce-scatter, nothing else.
    let mesh = Layout::new(&[2, 2], &["dp", "tp"], None).unwrap();
    let src = mesh
        .apply(&["dp".into(), "None".into()])
        .unwrap()
        .bind(&[4, 8])
        .unwrap();
    let dst = mesh
        .apply(&["dp".into(), "tp".into()])
        .unwrap()
        .bind(&[4, 8])
        .unwrap();
    let src = DistLayout::partial(src, &[1]).unwrap();
    let plan = reshard::plan_from(&src, &dst, DType::F32).unwrap();
    assert!(plan.transfers().all(|t| t.is_local()));
    // Each rank receives half of its 2x8 box: 8 floats.
    assert_eq!(plan.bytes_total(), 4 * 8 * 4);
    run_and_check(4, &src, &dst);
}
