//! Property: for random layouts A and B on random meshes (pipeline stages, multi-axis splits,
//! optimizer sharding, every dtype), converting A → B and then B → A gives back the original
//! files bit for bit. The source is written as safetensors, the intermediate as `.ckpt` or
//! safetensors, and the strategies in every flavour.

use std::path::Path;

use ckpt::{ConvertOptions, Format, ParamLayout, ResolvedParam, ResolvedStrategy, StrategyFlavour};
use layout::{Layout, Mesh};
use proptest::prelude::*;
use tensor::{DType, Tensor};

use crate::util::{lcm, read_all, tmp};

/// A random strategy shape: per stage, a device matrix; per parameter, per-dim axis choices.
#[derive(Debug, Clone)]
struct Side {
    n_stages: usize,
    dev: Vec<usize>,
    /// Per parameter: for each mesh axis, the tensor dim it splits (or none), in an order.
    axes: Vec<Vec<(usize, Option<usize>)>>,
    /// Per parameter: requested optimizer-shard size.
    opt: Vec<usize>,
}

fn side(n_params: usize, ndims: Vec<usize>) -> impl Strategy<Value = Side> {
    (
        1usize..=2,
        prop::collection::vec(prop::sample::select(vec![1usize, 2, 3, 4]), 1..=3),
    )
        .prop_filter("at most 8 devices per stage", |(_, dev)| {
            dev.iter().product::<usize>() <= 8
        })
        .prop_flat_map(move |(n_stages, dev)| {
            let n_axes = dev.len();
            let per_param: Vec<_> = ndims
                .iter()
                .map(|&nd| {
                    prop::collection::vec(prop::option::of(0..nd), n_axes)
                        .prop_map(|dims| dims.into_iter().enumerate().collect::<Vec<_>>())
                        .prop_shuffle()
                })
                .collect();
            (
                Just(n_stages),
                Just(dev),
                per_param,
                prop::collection::vec(prop::sample::select(vec![1usize, 1, 2, 4]), n_params),
            )
        })
        .prop_map(|(n_stages, dev, axes, opt)| Side {
            n_stages,
            dev,
            axes,
            opt,
        })
}

/// The (unbound) layout of parameter `i` in `stage`, and its optimizer shard.
fn param_layout(s: &Side, i: usize, ndim: usize, stage: usize) -> (Layout, usize) {
    let n: usize = s.dev.iter().product();
    let names: Vec<String> = (0..s.dev.len()).map(|a| format!("a{a}")).collect();
    let mesh = Mesh::new(&s.dev, &names, Some((stage * n..(stage + 1) * n).collect())).unwrap();
    let mut dims = vec![Vec::new(); ndim];
    for &(axis, dim) in &s.axes[i] {
        if let Some(d) = dim {
            dims[d].push(axis);
        }
    }
    let layout = Layout::from_mesh(mesh, dims).unwrap();
    let k = s.opt[i];
    let k = if k > 1 && layout.with_optimizer_shard(Some(k)).is_ok() && layout.replica_count() >= k
    {
        k
    } else {
        1
    };
    (layout, k)
}

fn held_factors(layout: &Layout, k: usize) -> Vec<usize> {
    if k > 1 {
        layout
            .with_optimizer_shard(Some(k))
            .unwrap()
            .split_factors()
    } else {
        layout.split_factors()
    }
}

/// Stages holding parameter `i`: stage `i % n` always, all stages for the last parameter.
fn stages_of(i: usize, n_params: usize, n_stages: usize) -> Vec<usize> {
    if i + 1 == n_params {
        (0..n_stages).collect()
    } else {
        vec![i % n_stages]
    }
}

fn build(s: &Side, shapes: &[Vec<usize>], dtypes: &[DType]) -> ResolvedStrategy {
    let params = shapes
        .iter()
        .enumerate()
        .map(|(i, shape)| {
            let placements = stages_of(i, shapes.len(), s.n_stages)
                .into_iter()
                .map(|stage| {
                    let (layout, k) = param_layout(s, i, shape.len(), stage);
                    ParamLayout::new(stage, layout.bind(shape).unwrap(), k).unwrap()
                })
                .collect();
            ResolvedParam {
                name: format!("p{i}.w"),
                shape: shape.clone(),
                dtype: Some(dtypes[i]),
                placements,
            }
        })
        .collect();
    ResolvedStrategy::new(params).unwrap()
}

fn write_source(dir: &Path, strategy: &ResolvedStrategy, values: &[Tensor]) {
    for rank in strategy.ranks() {
        let mut tensors = Vec::new();
        for (p, full) in strategy.params().iter().zip(values) {
            if let Some((pl, slot)) = p.placement_of_rank(rank) {
                tensors.push((
                    p.name.clone(),
                    full.extract_box(&pl.held.slot_box(slot)).unwrap(),
                ));
            }
        }
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        ckpt::save_rank_checkpoint(dir, rank, &refs, false).unwrap();
    }
}

#[derive(Debug, Clone)]
struct Case {
    ndims: Vec<usize>,
    a: Side,
    b: Side,
    scale: Vec<Vec<usize>>,
    dtypes: Vec<DType>,
    flavours: (usize, usize),
    mid_format: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    prop::collection::vec(1usize..=3, 1..=3).prop_flat_map(|ndims| {
        let n = ndims.len();
        (
            Just(ndims.clone()),
            side(n, ndims.clone()),
            side(n, ndims.clone()),
            ndims
                .iter()
                .map(|&nd| prop::collection::vec(1usize..=2, nd))
                .collect::<Vec<_>>(),
            prop::collection::vec(
                prop::sample::select(vec![
                    DType::F32,
                    DType::F16,
                    DType::BF16,
                    DType::I32,
                    DType::U8,
                    DType::F64,
                ]),
                n,
            ),
            (0usize..3, 0usize..3),
            any::<bool>(),
            any::<u64>(),
        )
            .prop_map(
                |(ndims, a, b, scale, dtypes, flavours, mid_format, seed)| Case {
                    ndims,
                    a,
                    b,
                    scale,
                    dtypes,
                    flavours,
                    mid_format,
                    seed,
                },
            )
    })
}

fn flavour(i: usize) -> (StrategyFlavour, &'static str) {
    match i {
        0 => (StrategyFlavour::Tessera, "tessera.json"),
        1 => (StrategyFlavour::MsProtobuf, "ms.ckpt"),
        _ => (StrategyFlavour::MsJson, "ms.json"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn a_to_b_to_a_is_identity(c in case()) {
        // Global shapes divisible by every split of both sides.
        let shapes: Vec<Vec<usize>> = (0..c.ndims.len())
            .map(|i| {
                let mut shape = vec![1usize; c.ndims[i]];
                for side in [&c.a, &c.b] {
                    for stage in 0..side.n_stages {
                        let (l, k) = param_layout(side, i, c.ndims[i], stage);
                        for (d, f) in held_factors(&l, k).into_iter().enumerate() {
                            shape[d] = lcm(shape[d], f);
                        }
                    }
                }
                shape.iter().zip(&c.scale[i]).map(|(s, m)| s * m).collect()
            })
            .collect();
        let a = build(&c.a, &shapes, &c.dtypes);
        let b = build(&c.b, &shapes, &c.dtypes);
        let mut rng = c.seed;
        let values: Vec<Tensor> = shapes
            .iter()
            .zip(&c.dtypes)
            .map(|(shape, &dtype)| {
                let n: usize = shape.iter().product::<usize>() * dtype.size_in_bytes();
                let bytes: Vec<u8> = (0..n)
                    .map(|_| {
                        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        (rng >> 56) as u8
                    })
                    .collect();
                Tensor::from_bytes(dtype, shape, &bytes).unwrap()
            })
            .collect();
        let dir = tmp();
        let src = dir.path().join("a");
        write_source(&src, &a, &values);
        let (fa, na) = flavour(c.flavours.0);
        let (fb, nb) = flavour(c.flavours.1);
        let sa = dir.path().join(na);
        let sb = dir.path().join(format!("b_{nb}"));
        ckpt::save_param_strategy_file(&sa, &a, &[], fa, false).unwrap();
        ckpt::save_param_strategy_file(&sb, &b, &[], fb, false).unwrap();
        let mid = dir.path().join("b");
        let opts = ConvertOptions {
            format: Some(if c.mid_format { Format::Ckpt } else { Format::Safetensors }),
            chunk_bytes: 64,
            ..Default::default()
        };
        ckpt::convert_checkpoints(&src, &sa, &mid, Some(&sb), &opts).unwrap();
        let back = dir.path().join("a2");
        let opts = ConvertOptions { format: Some(Format::Safetensors), chunk_bytes: 1 << 20, ..Default::default() };
        ckpt::convert_checkpoints(&mid, &sb, &back, Some(&sa), &opts).unwrap();
        for rank in a.ranks() {
            let f = format!("rank_{rank}/checkpoint_{rank}.safetensors");
            let mut x = read_all(&src.join(&f));
            let mut y = read_all(&back.join(&f));
            x.sort_by(|p, q| p.0.cmp(&q.0));
            y.sort_by(|p, q| p.0.cmp(&q.0));
            prop_assert_eq!(x, y, "rank {}", rank);
        }
        // The intermediate checkpoint is sound under B.
        let report = ckpt::verify_checkpoints(&mid, &sb, true).unwrap();
        prop_assert!(report.is_ok(), "{:?}", report.faults);
    }
}

/// Pieces of a megabyte or more are copied from mapped source ranges; short runs inside them
/// (1 KiB rows here) exercise the copy out of the mapping.
#[test]
fn large_pieces_through_mapped_reads() {
    let dir = tmp();
    let (rows, cols) = (1024usize, 512usize);
    let mesh = Mesh::new(&[2], &["mp"], None).unwrap();
    let split = Layout::from_mesh(mesh.clone(), vec![vec![], vec![0]])
        .unwrap()
        .bind(&[rows, cols])
        .unwrap();
    let a = ResolvedStrategy::new(vec![ResolvedParam {
        name: "w".into(),
        shape: vec![rows, cols],
        dtype: Some(DType::F32),
        placements: vec![ParamLayout::new(0, split, 1).unwrap()],
    }])
    .unwrap();
    let full =
        Tensor::from_vec(&[rows, cols], (0..rows * cols).map(|x| x as f32).collect()).unwrap();
    write_source(&dir.path().join("src"), &a, std::slice::from_ref(&full));
    let sa = dir.path().join("a.json");
    ckpt::save_param_strategy_file(&sa, &a, &[], StrategyFlavour::Tessera, false).unwrap();
    let out = dir.path().join("out");
    ckpt::convert_checkpoints(
        &dir.path().join("src"),
        &sa,
        &out,
        None,
        &ConvertOptions::default(),
    )
    .unwrap();
    let got = read_all(&out.join("rank_0/checkpoint_0.safetensors"));
    assert_eq!(got[0].1.bytes, full.as_bytes());
}
