//! Seeded property test of conversion between random parallel layouts, against an independent
//! slicer written here (MindSpore's rules: row-major rank coordinates, multi-axis dims with the
//! first axis major, the optimizer shard cutting dim 0 of the model-parallel slice by the rank's
//! place in its replica group). Each parameter gets its own device matrix (a random
//! factorization of the stage's device count, with axes of size 1), random (multi-axis) tensor
//! maps, optimizer sharding, pipeline stages and a dtype; shapes have odd and prime factors.
//! For every case:
//!
//! - A → B writes, on every rank of B, exactly the slices the slicer cuts from the full tensors
//!   (so A → B equals merging A and splitting by B), in `.ckpt` or safetensors;
//! - B → A gives back A's files' tensors bit for bit;
//! - merging A (`unified_safetensors`) and converting A to no strategy give the full tensors;
//! - a destination strategy that does not divide a shape, or that lists a tensor the source
//!   lacks, is refused naming the tensor and the rule, and nothing is written.
//!
//! Deterministic: the cases come from fixed seeds.

use std::collections::BTreeMap;
use std::path::Path;

use ckpt::{
    ConvertOptions, Format, MergeOptions, ParamLayout, ResolvedParam, ResolvedStrategy,
    StrategyFlavour,
};
use layout::{Layout, Mesh};
use tensor::{DType, Tensor};

use crate::util::{lcm, read_all, tmp, Rng, Stored};

/// One parameter's layout in one stage: device matrix, mesh axes per tensor dim (outer
/// first), optimizer-shard size.
#[derive(Debug, Clone)]
struct Place {
    dev: Vec<usize>,
    dims: Vec<Vec<usize>>,
    k: usize,
}

/// A strategy: stages of `p` devices each; per parameter, its stages and per-stage layouts.
#[derive(Debug, Clone)]
struct Side {
    n_stages: usize,
    p: usize,
    params: Vec<(Vec<usize>, Vec<Place>)>,
}

fn coords(mut local: usize, dev: &[usize]) -> Vec<usize> {
    let mut c = vec![0; dev.len()];
    for a in (0..dev.len()).rev() {
        c[a] = local % dev[a];
        local /= dev[a];
    }
    c
}

fn unused_axes(pl: &Place) -> Vec<usize> {
    (0..pl.dev.len())
        .filter(|a| !pl.dims.iter().any(|d| d.contains(a)))
        .collect()
}

/// The local ranks holding the same model-parallel slice as `local`, ascending.
fn replica_group(local: usize, pl: &Place) -> Vec<usize> {
    let c = coords(local, &pl.dev);
    let unused = unused_axes(pl);
    let n: usize = pl.dev.iter().product();
    (0..n)
        .filter(|&m| {
            let cm = coords(m, &pl.dev);
            (0..pl.dev.len()).all(|a| unused.contains(&a) || cm[a] == c[a])
        })
        .collect()
}

/// Whether the replica axes, taken from the right, cut into chunks of `k` consecutive ranks.
fn opt_shard_fits(pl: &Place, k: usize) -> bool {
    let mut need = k;
    for a in unused_axes(pl).into_iter().rev() {
        if need == 1 {
            break;
        }
        let s = pl.dev[a];
        if need.is_multiple_of(s) {
            need /= s;
        } else if s.is_multiple_of(need) {
            need = 1;
        } else {
            return false;
        }
    }
    need == 1
}

/// The split factor of each dim, with the optimizer shard on dim 0.
fn held_factors(pl: &Place, ndim: usize) -> Vec<usize> {
    let mut f: Vec<usize> = (0..ndim)
        .map(|d| pl.dims[d].iter().map(|&a| pl.dev[a]).product())
        .collect();
    if ndim > 0 {
        f[0] *= pl.k;
    }
    f
}

/// The independent slicer: `[start, end)` per dim of what local rank `local` holds.
fn held_box(local: usize, pl: &Place, shape: &[usize]) -> Vec<(usize, usize)> {
    let c = coords(local, &pl.dev);
    let mut b: Vec<(usize, usize)> = shape
        .iter()
        .enumerate()
        .map(|(d, &n)| {
            let f: usize = pl.dims[d].iter().map(|&a| pl.dev[a]).product();
            let idx = pl.dims[d].iter().fold(0, |i, &a| i * pl.dev[a] + c[a]);
            let len = n / f;
            (idx * len, (idx + 1) * len)
        })
        .collect();
    if pl.k > 1 {
        let g = replica_group(local, pl);
        let pos = g.iter().position(|&m| m == local).unwrap() % pl.k;
        let (s, e) = b[0];
        let len = (e - s) / pl.k;
        b[0] = (s + pos * len, s + (pos + 1) * len);
    }
    b
}

/// The bytes of `bx` cut out of the row-major `full`.
fn cut(full: &[u8], shape: &[usize], esize: usize, bx: &[(usize, usize)]) -> Vec<u8> {
    let n = shape.len();
    if n == 0 {
        return full.to_vec();
    }
    let mut out = Vec::new();
    if bx.iter().any(|(s, e)| s == e) {
        return out;
    }
    let mut strides = vec![1usize; n];
    for d in (0..n - 1).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let mut idx: Vec<usize> = bx.iter().map(|b| b.0).collect();
    loop {
        let base: usize = idx[..n - 1].iter().zip(&strides).map(|(i, s)| i * s).sum();
        let (s, e) = bx[n - 1];
        out.extend_from_slice(&full[(base + s) * esize..(base + e) * esize]);
        let mut d = n - 1;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < bx[d].1 {
                break;
            }
            idx[d] = bx[d].0;
        }
    }
}

fn factorize(rng: &mut Rng, n: usize) -> Vec<usize> {
    let mut dev = Vec::new();
    let mut m = n;
    while m > 1 {
        let divisors: Vec<usize> = (2..=m).filter(|d| m.is_multiple_of(*d)).collect();
        let d = rng.pick(&divisors);
        dev.push(d);
        m /= d;
    }
    if dev.is_empty() || rng.chance(30) {
        let at = rng.below(dev.len() + 1);
        dev.insert(at, 1);
    }
    // Shuffle.
    for i in (1..dev.len()).rev() {
        let j = rng.below(i + 1);
        dev.swap(i, j);
    }
    dev
}

fn random_place(rng: &mut Rng, p: usize, ndim: usize, multi: bool) -> Place {
    let dev = factorize(rng, p);
    let mut dims = vec![Vec::new(); ndim];
    let mut axes: Vec<usize> = (0..dev.len()).collect();
    for i in (1..axes.len()).rev() {
        let j = rng.below(i + 1);
        axes.swap(i, j);
    }
    for a in axes {
        if ndim > 0 && rng.chance(55) {
            let d = rng.below(ndim);
            if multi || dims[d].is_empty() {
                dims[d].push(a);
            }
        }
    }
    let mut pl = Place { dev, dims, k: 1 };
    if ndim > 0 && rng.chance(45) {
        let reps = replica_group(0, &pl).len();
        let ks: Vec<usize> = (2..=reps)
            .filter(|&k| reps.is_multiple_of(k) && opt_shard_fits(&pl, k))
            .collect();
        if !ks.is_empty() {
            pl.k = rng.pick(&ks);
        }
    }
    pl
}

fn random_side(rng: &mut Rng, ndims: &[usize], multi: bool) -> Side {
    let (n_stages, p) = loop {
        let s = rng.pick(&[1, 1, 2, 3, 4]);
        let p = rng.pick(&[1, 2, 3, 4, 5, 6, 8, 12, 16]);
        if s * p <= 16 {
            break (s, p);
        }
    };
    let mut params: Vec<(Vec<usize>, Vec<Place>)> = ndims
        .iter()
        .map(|&nd| {
            let mut stages: Vec<usize> = (0..n_stages).filter(|_| rng.chance(50)).collect();
            if stages.is_empty() {
                stages.push(rng.below(n_stages));
            }
            let first = random_place(rng, p, nd, multi);
            let places = (0..n_stages)
                .map(|_| {
                    if rng.chance(30) {
                        random_place(rng, p, nd, multi)
                    } else {
                        first.clone()
                    }
                })
                .collect();
            (stages, places)
        })
        .collect();
    // Every stage holds some parameter (MindSpore's stages are 0..n).
    for s in 0..n_stages {
        if !params.iter().any(|(st, _)| st.contains(&s)) {
            let i = rng.below(params.len());
            params[i].0.push(s);
            params[i].0.sort_unstable();
        }
    }
    Side {
        n_stages,
        p,
        params,
    }
}

struct Param {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    full: Vec<u8>,
}

fn strategy(side: &Side, params: &[Param]) -> ResolvedStrategy {
    let list = params
        .iter()
        .zip(&side.params)
        .map(|(p, (stages, places))| ResolvedParam {
            name: p.name.clone(),
            shape: p.shape.clone(),
            dtype: Some(p.dtype),
            placements: stages
                .iter()
                .map(|&s| {
                    let pl = &places[s];
                    let names: Vec<String> = (0..pl.dev.len()).map(|a| format!("x{a}")).collect();
                    let ranks = (s * side.p..(s + 1) * side.p).collect();
                    let mesh = Mesh::new(&pl.dev, &names, Some(ranks)).unwrap();
                    let layout = Layout::from_mesh(mesh, pl.dims.clone())
                        .unwrap()
                        .bind(&p.shape)
                        .unwrap();
                    ParamLayout::new(s, layout, pl.k).unwrap()
                })
                .collect(),
        })
        .collect();
    ResolvedStrategy::new(list).unwrap()
}

/// What the slicer says each rank of `side` holds: name → (type, shape, bytes).
fn expected(side: &Side, params: &[Param]) -> BTreeMap<usize, BTreeMap<String, Stored>> {
    let mut out = BTreeMap::new();
    for rank in 0..side.n_stages * side.p {
        let (s, local) = (rank / side.p, rank % side.p);
        let mut held = BTreeMap::new();
        for (p, (stages, places)) in params.iter().zip(&side.params) {
            if !stages.contains(&s) {
                continue;
            }
            let bx = held_box(local, &places[s], &p.shape);
            held.insert(
                p.name.clone(),
                Stored {
                    ty: p.dtype.mindspore_name().to_string(),
                    shape: bx.iter().map(|(a, b)| b - a).collect(),
                    bytes: cut(&p.full, &p.shape, p.dtype.size_in_bytes(), &bx),
                },
            );
        }
        out.insert(rank, held);
    }
    out
}

/// Every tensor of the one checkpoint file in `dir/rank_<rank>/`.
fn rank_tensors(dir: &Path, rank: usize) -> BTreeMap<String, Stored> {
    let folder = dir.join(format!("rank_{rank}"));
    let files: Vec<_> = std::fs::read_dir(&folder)
        .unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    read_all(&files[0]).into_iter().collect()
}

fn assert_holds(dir: &Path, want: &BTreeMap<usize, BTreeMap<String, Stored>>, what: &str) {
    for (rank, tensors) in want {
        let got = rank_tensors(dir, *rank);
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            tensors.keys().collect::<Vec<_>>(),
            "{what}: rank {rank}'s tensors"
        );
        for (name, w) in tensors {
            assert!(
                got[name] == *w,
                "{what}: rank {rank}, tensor {name} differs"
            );
        }
    }
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

const DTYPES: [DType; 7] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::U8,
    DType::F64,
    DType::I64,
];

fn flavour(rng: &mut Rng, multi: bool) -> (StrategyFlavour, &'static str) {
    // MindSpore's JSON holds flat tensor maps only.
    match rng.below(if multi { 2 } else { 3 }) {
        0 => (StrategyFlavour::MsProtobuf, "ckpt"),
        1 => (StrategyFlavour::Tessera, "json"),
        _ => (StrategyFlavour::MsJson, "json"),
    }
}

fn run_case(seed: u64) {
    let mut rng = Rng(seed);
    let n_params = 1 + rng.below(3);
    let ndims: Vec<usize> = (0..n_params).map(|_| 1 + rng.below(3)).collect();
    let (multi_a, multi_b) = (rng.chance(50), rng.chance(50));
    let a = random_side(&mut rng, &ndims, multi_a);
    let b = random_side(&mut rng, &ndims, multi_b);
    let mut params = Vec::new();
    for (i, &nd) in ndims.iter().enumerate() {
        let mut shape = vec![1usize; nd];
        for side in [&a, &b] {
            let (stages, places) = &side.params[i];
            for &s in stages {
                for (d, f) in held_factors(&places[s], nd).into_iter().enumerate() {
                    shape[d] = lcm(shape[d], f);
                }
            }
        }
        for d in shape.iter_mut() {
            *d *= rng.pick(&[1, 1, 2, 3, 5, 7]);
        }
        let dtype = rng.pick(&DTYPES);
        let n = shape.iter().product::<usize>() * dtype.size_in_bytes();
        let full = (0..n).map(|_| rng.next() as u8).collect();
        params.push(Param {
            name: format!("layer{i}.w"),
            dtype,
            shape,
            full,
        });
    }
    let context = format!("seed {seed}: A {a:?}\nB {b:?}");
    let dir = tmp();
    let root = dir.path();
    let (sa_res, sb_res) = (strategy(&a, &params), strategy(&b, &params));
    let (fa, ea) = flavour(&mut rng, multi_a);
    let (fb, eb) = flavour(&mut rng, multi_b);
    let sa = root.join(format!("a.{ea}"));
    let sb = root.join(format!("b.{eb}"));
    ckpt::save_param_strategy_file(&sa, &sa_res, &[], fa, false).unwrap();
    ckpt::save_param_strategy_file(&sb, &sb_res, &[], fb, false).unwrap();
    let want_a = expected(&a, &params);
    let want_b = expected(&b, &params);
    let src = root.join("src");
    for (rank, tensors) in &want_a {
        let ts: Vec<(String, Tensor)> = tensors
            .iter()
            .map(|(n, s)| {
                let p = params.iter().find(|p| &p.name == n).unwrap();
                (
                    n.clone(),
                    Tensor::from_bytes(p.dtype, &s.shape, &s.bytes).unwrap(),
                )
            })
            .collect();
        let refs: Vec<(&str, &Tensor)> = ts.iter().map(|(n, t)| (n.as_str(), t)).collect();
        ckpt::save_rank_checkpoint(&src, *rank, &refs, false).unwrap();
    }
    let format = |ckpt: bool| {
        Some(if ckpt {
            Format::Ckpt
        } else {
            Format::Safetensors
        })
    };
    // A → B: the slicer's B slices.
    let mid = root.join("b");
    let opts = ConvertOptions {
        format: format(rng.chance(50)),
        chunk_bytes: 1 + rng.below(200),
        ..Default::default()
    };
    ckpt::convert_checkpoints(&src, &sa, &mid, Some(&sb), &opts)
        .unwrap_or_else(|e| panic!("{context}\nA -> B: {e}"));
    assert_holds(&mid, &want_b, &format!("{context}\nA -> B"));
    // B → A: A's files back.
    let back = root.join("a2");
    let opts = ConvertOptions {
        format: format(rng.chance(50)),
        ..Default::default()
    };
    ckpt::convert_checkpoints(&mid, &sb, &back, Some(&sa), &opts)
        .unwrap_or_else(|e| panic!("{context}\nB -> A: {e}"));
    assert_holds(&back, &want_a, &format!("{context}\nB -> A"));
    // Merging A, and converting it to no strategy, give the full tensors.
    let whole: BTreeMap<String, Stored> = params
        .iter()
        .map(|p| {
            let s = Stored {
                ty: p.dtype.mindspore_name().to_string(),
                shape: p.shape.clone(),
                bytes: p.full.clone(),
            };
            (p.name.clone(), s)
        })
        .collect();
    let merged = root.join("merged");
    let report = ckpt::unified_safetensors(&src, &sa, &merged, &MergeOptions::default())
        .unwrap_or_else(|e| panic!("{context}\nmerge: {e}"));
    let mut got = BTreeMap::new();
    for (part, _) in &report.parts {
        got.extend(read_all(part));
    }
    assert!(
        got == whole,
        "{context}\nmerge differs from the full tensors"
    );
    let full_dir = root.join("full");
    ckpt::convert_checkpoints(&src, &sa, &full_dir, None, &ConvertOptions::default())
        .unwrap_or_else(|e| panic!("{context}\nA -> full: {e}"));
    assert_holds(&full_dir, &BTreeMap::from([(0, whole)]), &context);

    // Refusals. A destination split that does not divide the source's shape (the MindSpore
    // protobuf strategy has no shapes: it is checked against the checkpoint's).
    let before = listing(root);
    let i = rng.below(params.len());
    let nd = ndims[i];
    let d = rng.below(nd);
    let p = rng.pick(&[2usize, 3, 4]);
    let mut dims = vec![Vec::new(); nd];
    dims[d].push(0);
    let bad_shape: Vec<usize> = params[i]
        .shape
        .iter()
        .enumerate()
        .map(|(j, &n)| if j == d { n * p } else { n })
        .collect();
    let undivided = params[i].shape[d] % p != 0;
    let mesh = Mesh::new(&[p], &["mp"], None).unwrap();
    let bad = ResolvedStrategy::new(vec![ResolvedParam {
        name: params[i].name.clone(),
        shape: bad_shape.clone(),
        dtype: Some(params[i].dtype),
        placements: vec![ParamLayout::new(
            0,
            Layout::from_mesh(mesh, dims)
                .unwrap()
                .bind(&bad_shape)
                .unwrap(),
            1,
        )
        .unwrap()],
    }])
    .unwrap();
    let sbad = root.join("bad.ckpt");
    ckpt::save_param_strategy_file(&sbad, &bad, &[], StrategyFlavour::MsProtobuf, false).unwrap();
    let out = root.join("refused");
    let r = ckpt::convert_checkpoints(&src, &sa, &out, Some(&sbad), &ConvertOptions::default());
    if undivided {
        let err = r.expect_err(&format!("{context}\nsplit by {p} of dim {d} accepted"));
        let text = err.to_string();
        assert!(
            text.contains(&params[i].name) && text.contains("not divisible"),
            "{context}\n{text}"
        );
        assert!(
            !out.exists(),
            "{context}\na refused conversion wrote {out:?}"
        );
    } else {
        r.unwrap_or_else(|e| panic!("{context}\nsplit by {p} of dim {d}: {e}"));
        std::fs::remove_dir_all(&out).unwrap();
    }
    // A destination tensor the source lacks.
    let ghost = ResolvedParam {
        name: "ghost.w".into(),
        shape: vec![4],
        dtype: Some(DType::F32),
        placements: vec![ParamLayout::new(
            0,
            Layout::from_mesh(Mesh::new(&[1], &["r"], None).unwrap(), vec![vec![]])
                .unwrap()
                .bind(&[4])
                .unwrap(),
            1,
        )
        .unwrap()],
    };
    let mut with_ghost: Vec<ResolvedParam> = sb_res.params().to_vec();
    with_ghost.push(ghost);
    let sghost = root.join("ghost.json");
    let with_ghost = ResolvedStrategy::new(with_ghost).unwrap();
    ckpt::save_param_strategy_file(&sghost, &with_ghost, &[], StrategyFlavour::Tessera, false)
        .unwrap();
    let err = ckpt::convert_checkpoints(&src, &sa, &out, Some(&sghost), &ConvertOptions::default())
        .expect_err(&format!("{context}\na destination tensor the source lacks"));
    let text = err.to_string();
    assert!(
        text.contains("ghost.w") && text.contains("destination strategy"),
        "{context}\n{text}"
    );
    assert!(
        !out.exists(),
        "{context}\na refused conversion wrote {out:?}"
    );
    std::fs::remove_file(&sbad).unwrap();
    std::fs::remove_file(&sghost).unwrap();
    assert_eq!(listing(root), before, "{context}");
}

#[test]
fn random_layouts_convert_exactly_and_refuse_what_cannot_be_done() {
    for seed in 0..30u64 {
        run_case(0x7e55_e7a0_0000 + seed);
    }
}

#[test]
fn the_slicer_cuts_mindspore_s_worked_example() {
    // SEMANTICS.md §1.8: dev (2,2,2) (dp, sp, mp), X (8, 16).
    let a = Place {
        dev: vec![2, 2, 2],
        dims: vec![vec![0], vec![2]],
        k: 1,
    };
    assert_eq!(held_box(5, &a, &[8, 16]), vec![(4, 8), (8, 16)]);
    let b = Place {
        dev: vec![2, 2, 2],
        dims: vec![vec![0, 2], vec![]],
        k: 1,
    };
    assert_eq!(held_box(1, &b, &[8, 16]), vec![(2, 4), (0, 16)]);
    assert_eq!(held_box(4, &b, &[8, 16]), vec![(4, 6), (0, 16)]);
    // C: the optimizer shard over the sp pairs {0, 2}.
    let c = Place { k: 2, ..a };
    assert_eq!(held_box(0, &c, &[8, 16]), vec![(0, 2), (0, 8)]);
    assert_eq!(held_box(2, &c, &[8, 16]), vec![(2, 4), (0, 8)]);
}
