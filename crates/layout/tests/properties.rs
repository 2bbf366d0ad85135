//! Properties of the layout algebra over random meshes (1–4 axes, up to 64 slots) and random
//! valid layouts, including explicit rank lists, interleaving and optimizer sharding.

use layout::{Layout, Mesh, MeshAxis, SliceBox, TensorLayout, INTERLEAVED_ALIAS};
use proptest::prelude::*;

/// A random mesh, layout and shape.
#[derive(Debug, Clone)]
struct Case {
    layout: TensorLayout,
}

fn arb_case() -> impl Strategy<Value = Case> {
    (1usize..=4)
        .prop_flat_map(|n_axes| {
            (
                proptest::collection::vec(1usize..=4, n_axes),
                any::<bool>(),
                any::<bool>(),
                any::<u64>(),
            )
        })
        .prop_filter("at most 64 slots", |(sizes, ..)| {
            sizes.iter().product::<usize>() <= 64
        })
        .prop_flat_map(|(sizes, interleaved, permuted, seed)| {
            let n_axes = sizes.len();
            let ndim = 0usize..=3;
            (
                Just(sizes),
                Just(interleaved),
                Just(permuted),
                Just(seed),
                ndim,
                // For each axis: which dim it splits (or none), and a sort key for its order.
                proptest::collection::vec((0usize..4, any::<u8>()), n_axes),
                proptest::collection::vec(1usize..=2, 3),
            )
        })
        .prop_map(
            |(sizes, interleaved, permuted, seed, ndim, assignment, multipliers)| {
                let mut axes: Vec<MeshAxis> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &size)| MeshAxis {
                        name: format!("a{i}"),
                        size,
                    })
                    .collect();
                if interleaved && sizes.len() > 1 {
                    axes.last_mut().unwrap().name = INTERLEAVED_ALIAS.to_string();
                }
                // Copies per device: the interleaved axis's size (virtual rank r*k + j is copy j
                // of device r, so the k slots of a mesh position are one device's copies).
                let k = if interleaved && sizes.len() > 1 {
                    *sizes.last().unwrap()
                } else {
                    1
                };
                let n_devices: usize = sizes.iter().product::<usize>() / k;
                let rank_list = permuted.then(|| {
                    // A deterministic shuffle of the devices from the seed, offset to look like
                    // a stage; each device's k virtual ranks stay together, in copy order.
                    let mut devices: Vec<usize> = (0..n_devices).map(|r| r + 100).collect();
                    let mut s = seed | 1;
                    for i in (1..devices.len()).rev() {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        devices.swap(i, (s % (i as u64 + 1)) as usize);
                    }
                    devices
                        .iter()
                        .flat_map(|&d| (0..k).map(move |j| d * k + j))
                        .collect::<Vec<usize>>()
                });
                let mesh = Mesh::from_axes(axes, rank_list).unwrap();
                let mut dims: Vec<Vec<(u8, usize)>> = vec![Vec::new(); ndim];
                for (axis, &(dim, key)) in assignment.iter().enumerate() {
                    if dim < ndim {
                        dims[dim].push((key, axis));
                    }
                }
                let dims: Vec<Vec<usize>> = dims
                    .into_iter()
                    .map(|mut d| {
                        d.sort();
                        d.into_iter().map(|(_, a)| a).collect()
                    })
                    .collect();
                let layout = Layout::from_mesh(mesh.clone(), dims.clone()).unwrap();
                let shape: Vec<usize> = dims
                    .iter()
                    .enumerate()
                    .map(|(d, axes)| {
                        axes.iter().map(|&a| mesh.axis_size(a)).product::<usize>() * multipliers[d]
                    })
                    .collect();
                Case {
                    layout: layout.bind(&shape).unwrap(),
                }
            },
        )
}

/// Counts how many of `boxes` cover each element of a tensor of `shape`.
fn coverage(shape: &[usize], boxes: &[SliceBox]) -> Vec<usize> {
    let n: usize = shape.iter().product();
    let strides = layout::row_major_strides(shape);
    let mut count = vec![0; n];
    for b in boxes {
        for (i, c) in count.iter_mut().enumerate() {
            let index: Vec<usize> = (0..shape.len())
                .map(|d| (i / strides[d]) % shape[d])
                .collect();
            if b.contains_point(&index) {
                *c += 1;
            }
        }
    }
    count
}

/// Every element is covered exactly once by the slots with replica index `j`, for every `j`.
fn assert_exactly_once_per_replica(t: &TensorLayout) {
    let n_slots = t.mesh().n_slots();
    for j in 0..t.replica_count() {
        let boxes: Vec<SliceBox> = (0..n_slots)
            .filter(|&s| t.replica_index(s) == j)
            .map(|s| t.slot_box(s))
            .collect();
        let count = coverage(t.shape(), &boxes);
        assert!(
            count.iter().all(|&c| c == 1),
            "replica {j} of {t}: coverage {count:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_element_is_covered_exactly_once_per_replica(case in arb_case()) {
        assert_exactly_once_per_replica(&case.layout);
    }

    #[test]
    fn replica_groups_partition_the_ranks(case in arb_case()) {
        let t = &case.layout;
        let groups = t.replica_slot_groups();
        let mut seen = vec![0; t.mesh().n_slots()];
        for g in &groups {
            prop_assert_eq!(g.len(), t.replica_count());
            for &s in g {
                seen[s] += 1;
                prop_assert_eq!(t.slot_box(s), t.slot_box(g[0]));
            }
        }
        prop_assert!(seen.iter().all(|&c| c == 1));
        // Different groups hold different boxes.
        let mut firsts: Vec<SliceBox> = groups.iter().map(|g| t.slot_box(g[0])).collect();
        firsts.sort();
        firsts.dedup();
        prop_assert_eq!(firsts.len(), groups.len());
        // Ranks form the same partition as slots.
        let rank_groups = t.replica_groups();
        for (g, r) in groups.iter().zip(&rank_groups) {
            let expected: Vec<usize> = g.iter().map(|&s| t.mesh().rank_of_slot(s)).collect();
            prop_assert_eq!(&expected, r);
        }
    }

    #[test]
    fn tensor_map_export_import_round_trips(case in arb_case()) {
        let layout = case.layout.layout();
        let map = layout.ms_tensor_map().unwrap();
        let back = Layout::from_ms_tensor_map(layout.mesh().clone(), &map).unwrap();
        prop_assert_eq!(&back, layout);
        if let Some(flat) = layout.ms_flat_tensor_map() {
            let dm = layout.mesh().device_matrix();
            let from_flat = Layout::from_ms_flat(&dm, &flat, Some(layout.mesh().rank_list().to_vec())).unwrap();
            prop_assert_eq!(from_flat.dims().unwrap(), layout.dims().unwrap());
        }
        let extended = Layout::from_ms_extended(
            &layout.mesh().device_matrix(), &map, Some(layout.mesh().rank_list().to_vec())).unwrap();
        prop_assert_eq!(extended.dims().unwrap(), layout.dims().unwrap());
    }

    #[test]
    fn normalisation_keeps_every_rank_box(case in arb_case()) {
        let t = &case.layout;
        let n = t.normalized();
        prop_assert!(n.mesh().axes().iter().all(|a| a.size > 1) || n.mesh().n_axes() == 1);
        prop_assert!(t.same_placement(&n));
        prop_assert_eq!(n.replica_groups(), t.replica_groups());
    }

    #[test]
    fn optimizer_shard_splits_each_replica_box(case in arb_case(), pick in 0usize..8) {
        let t = &case.layout;
        if t.shape().is_empty() {
            return Ok(());
        }
        let replicas = t.replica_count();
        let divisors: Vec<usize> = (1..=replicas).filter(|k| replicas % k == 0).collect();
        let k = divisors[pick % divisors.len()];
        // Make dim 0 divisible by k on top of its split.
        let mut shape = t.shape().to_vec();
        shape[0] *= k;
        let t = t.layout().bind(&shape).unwrap();
        match t.with_optimizer_shard(Some(k)) {
            Ok(opt) => {
                prop_assert_eq!(opt.replica_count(), replicas / k);
                assert_exactly_once_per_replica(&opt);
                for slot in 0..t.mesh().n_slots() {
                    prop_assert!(t.slot_box(slot).contains(&opt.slot_box(slot)));
                    prop_assert_eq!(opt.mesh().rank_of_slot(slot), t.mesh().rank_of_slot(slot));
                }
                // Chunk mates (same model-parallel box, same optimizer chunk) are consecutive in
                // the replica group, as MindSpore cuts it.
                for group in t.replica_slot_groups() {
                    for chunk in group.chunks(k) {
                        let boxes: Vec<SliceBox> = chunk.iter().map(|&s| opt.slot_box(s)).collect();
                        let mut distinct = boxes.clone();
                        distinct.sort();
                        distinct.dedup();
                        prop_assert_eq!(distinct.len(), k);
                    }
                }
            }
            Err(layout::LayoutError::OptimizerShard { .. }) => {
                // Only when the replica axes cannot be cut into chunks of k (odd factorisations).
                let sizes: Vec<usize> = t.layout().unused_axes().iter().map(|&a| t.mesh().axis_size(a)).collect();
                prop_assert!(sizes.contains(&3), "unexpected refusal for sizes {:?}, k {}", sizes, k);
            }
            Err(e) => prop_assert!(false, "unexpected error {}", e),
        }
    }

    #[test]
    fn box_algebra(a in arb_box(), b in arb_box()) {
        let ab = a.intersect(&b);
        prop_assert_eq!(&ab, &b.intersect(&a));
        if let Some(c) = &ab {
            prop_assert!(a.contains(c) && b.contains(c));
        }
        if !b.is_empty() {
            prop_assert_eq!(a.contains(&b), ab.as_ref() == Some(&b));
        }
        let pieces = a.subtract(&b);
        let covered: usize = pieces.iter().map(SliceBox::n_elements).sum();
        prop_assert_eq!(covered + ab.as_ref().map_or(0, SliceBox::n_elements), a.n_elements());
        for (i, p) in pieces.iter().enumerate() {
            prop_assert!(a.contains(p));
            prop_assert!(p.intersect(&b).is_none());
            for q in &pieces[i + 1..] {
                prop_assert!(p.intersect(q).is_none());
            }
        }
    }

    #[test]
    fn axis_groups_are_consistent(case in arb_case()) {
        let mesh = case.layout.mesh();
        for slot in 0..mesh.n_slots() {
            prop_assert_eq!(mesh.slot_of_coord(&mesh.coord(slot)), slot);
            prop_assert_eq!(mesh.slot_of_rank(mesh.rank_of_slot(slot)), Some(slot));
            for axis in 0..mesh.n_axes() {
                let along = mesh.slots_along_axis(slot, axis);
                prop_assert_eq!(along.len(), mesh.axis_size(axis));
                prop_assert!(along.contains(&slot));
                for &s in &along {
                    for other in 0..mesh.n_axes() {
                        if other != axis {
                            prop_assert_eq!(mesh.coord_along(s, other), mesh.coord_along(slot, other));
                        }
                    }
                }
            }
        }
    }
}

fn arb_box() -> impl Strategy<Value = SliceBox> {
    proptest::collection::vec((0usize..6, 0usize..5), 2).prop_map(|dims| {
        SliceBox::new(
            dims.iter().map(|d| d.0).collect::<Vec<_>>(),
            dims.iter().map(|d| d.1).collect::<Vec<_>>(),
        )
    })
}

#[test]
fn interleaved_layout_covers_each_device_pair() {
    // dev (2,2,2) with interleaved_parallel: dim 0 over dp and the virtual axis.
    let l = Layout::new(&[2, 2, 2], &["dp", "mp", INTERLEAVED_ALIAS], None)
        .unwrap()
        .apply(&[["dp", INTERLEAVED_ALIAS].into(), "mp".into()])
        .unwrap()
        .bind(&[8, 4])
        .unwrap();
    assert_eq!(l.split_factors(), vec![4, 2]);
    // Device 0 runs virtual ranks 0 and 1: rows 0..2 and 2..4 of column block 0.
    assert_eq!(
        l.device_boxes(0),
        vec![
            SliceBox::new(vec![0, 0], vec![2, 2]),
            SliceBox::new(vec![2, 0], vec![2, 2])
        ]
    );
    assert_exactly_once_per_replica(&l);
}
