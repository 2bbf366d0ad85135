//! Redundancy worked out once per distinct placement ([`ckpt::parameter_redundancy`],
//! [`ckpt::remove_param_redundancy`]) equals the direct computation, parameter by parameter, on
//! seeded random strategies whose parameters share placements that differ from each other in
//! one thing only (rank list, its order, tensor map, optimizer shard, axis sizes, shape).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ckpt::{ParamLayout, ResolvedParam, ResolvedStrategy};
use layout::{Layout, Mesh, MeshAxis, TensorLayout};

use crate::util::Rng;

/// A random placement: mesh of 1-3 axes, a rank list that is the default, shifted, or
/// shuffled, each axis splitting a dim or replicating.
fn random_placement(rng: &mut Rng) -> (usize, Layout, usize) {
    let stage = rng.below(3);
    let n_axes = 1 + rng.below(3);
    let sizes: Vec<usize> = (0..n_axes).map(|_| [1, 2, 2, 3, 4][rng.below(5)]).collect();
    let n: usize = sizes.iter().product();
    let mut ranks: Vec<usize> = (stage * 24..stage * 24 + n).collect();
    match rng.below(3) {
        0 => {}
        1 => {
            for i in (1..n).rev() {
                ranks.swap(i, rng.below(i + 1));
            }
        }
        _ => ranks.reverse(),
    }
    let axes = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| MeshAxis {
            name: format!("a{i}"),
            size,
        })
        .collect();
    let mesh = Mesh::from_axes(axes, Some(ranks)).unwrap();
    let n_dims = rng.below(4);
    let mut dims = vec![Vec::new(); n_dims];
    for axis in 0..n_axes {
        if n_dims > 0 && rng.below(2) == 0 {
            dims[rng.below(n_dims)].push(axis);
        }
    }
    let unused: usize = (0..n_axes)
        .filter(|a| !dims.iter().flatten().any(|d| d == a))
        .map(|a| sizes[a])
        .product();
    let divisors: Vec<usize> = (1..=unused).filter(|&k| unused.is_multiple_of(k)).collect();
    let opt_shard = divisors[rng.below(divisors.len())];
    (stage, Layout::from_mesh(mesh, dims).unwrap(), opt_shard)
}

/// A parameter placed by `pool[i]` for each `i` of `picks`, of a random shape that divides.
fn param(
    rng: &mut Rng,
    name: String,
    pool: &[(usize, Layout, usize)],
    picks: &[usize],
) -> ResolvedParam {
    let ndim = pool[picks[0]].1.ndim();
    let shape: Vec<usize> = (0..ndim).map(|_| 576 * (1 + rng.below(3))).collect();
    let placements = picks
        .iter()
        .map(|&i| {
            let (stage, layout, opt) = &pool[i];
            // Every placement of one parameter needs its shape's rank: those of another rank
            // replicate it over their mesh instead.
            let layout = if layout.ndim() == ndim {
                layout.clone()
            } else {
                Layout::from_mesh(layout.mesh().clone(), vec![Vec::new(); ndim]).unwrap()
            };
            let mp = TensorLayout::new(layout, &shape).unwrap();
            ParamLayout::new(*stage, mp.clone(), *opt)
                .or_else(|_| ParamLayout::new(*stage, mp, 1))
                .unwrap()
        })
        .collect();
    ResolvedParam {
        name,
        shape,
        dtype: None,
        placements,
    }
}

/// MindSpore's owner assignment as it is written there: a scan of the groups seen so far.
fn owners_direct(map: &[(String, Vec<Vec<usize>>)]) -> BTreeMap<usize, BTreeSet<String>> {
    let mut by_group: Vec<(Vec<usize>, Vec<String>)> = Vec::new();
    for (name, groups) in map {
        for g in groups {
            match by_group.iter_mut().find(|(k, _)| k == g) {
                Some((_, names)) => names.push(name.clone()),
                None => by_group.push((g.clone(), vec![name.clone()])),
            }
        }
    }
    let mut owners: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for (group, names) in by_group {
        for (i, name) in names.into_iter().enumerate() {
            owners
                .entry(group[i % group.len()])
                .or_default()
                .insert(name);
        }
    }
    owners
}

#[test]
fn grouped_redundancy_equals_the_direct_computation_on_random_strategies() {
    for seed in 0..12u64 {
        let mut rng = Rng(seed);
        let pool: Vec<_> = (0..10).map(|_| random_placement(&mut rng)).collect();
        let mut picked: BTreeMap<String, (ResolvedParam, Vec<usize>)> = BTreeMap::new();
        let params: Vec<ResolvedParam> = (0..300)
            .map(|i| {
                let picks: Vec<usize> = (0..1 + rng.below(2))
                    .map(|_| rng.below(pool.len()))
                    .collect();
                let name = format!("p{:03}.{i}", rng.below(1000));
                let p = param(&mut rng, name.clone(), &pool, &picks);
                picked.insert(name, (p.clone(), picks));
                p
            })
            .collect();
        let strategy = ResolvedStrategy::new(params.clone()).unwrap();
        let map = ckpt::parameter_redundancy(&strategy);
        // Each parameter alone: nothing to share its placements' groups with.
        let mut direct: Vec<(String, Vec<Vec<usize>>)> = params
            .iter()
            .map(|p| {
                let alone = ResolvedStrategy::new(vec![p.clone()]).unwrap();
                let [(name, groups)] = &ckpt::parameter_redundancy(&alone)[..] else {
                    panic!("one parameter, one entry");
                };
                (name.clone(), groups.to_vec())
            })
            .collect();
        direct.sort();
        assert_eq!(map.len(), direct.len(), "seed {seed}");
        for ((name, groups), (d_name, d_groups)) in map.iter().zip(&direct) {
            assert_eq!(name, d_name, "seed {seed}");
            assert_eq!(&groups[..], &d_groups[..], "seed {seed}: {name}");
        }
        assert_eq!(
            ckpt::remove_param_redundancy(&map),
            owners_direct(&direct),
            "seed {seed}"
        );
        // Parameters of one placement hold one list of groups, not a copy each.
        let mut lists: BTreeMap<(usize, usize), &Arc<[Vec<usize>]>> = BTreeMap::new();
        for (name, groups) in &map {
            let (p, picks) = &picked[name];
            if let ([pick], [pl]) = (&picks[..], &p.placements[..]) {
                let first = lists.entry((*pick, pl.opt_shard)).or_insert(groups);
                assert!(Arc::ptr_eq(first, groups), "seed {seed}: {name}");
            }
        }
    }
}
