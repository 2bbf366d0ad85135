//! The streaming writer against the tree it replaced: the bytes must be the same for every
//! strategy, and a strategy file is read in one pass.

use std::path::Path;

use super::*;
use crate::model::ResolvedParam;

/// The old writer, kept as the oracle: a tree of the whole strategy, printed by [`Json`].
fn to_json(strategy: &ResolvedStrategy, ops: &[OpStrategyRecord]) -> Json {
    let tensors = strategy.params().iter().map(tensor_json).collect();
    Json::obj([
        ("format", Json::Str(FORMAT_NAME.to_string())),
        ("version", Json::UInt(VERSION)),
        ("tensors", Json::Arr(tensors)),
        ("ops", Json::Arr(ops.iter().map(op_json).collect())),
    ])
}

fn tensor_json(p: &ResolvedParam) -> Json {
    let placements = p
        .placements
        .iter()
        .map(|pl| {
            let layout = pl.mp.layout();
            let mesh = layout.mesh();
            let axes = mesh
                .axes()
                .iter()
                .map(|a| Json::Arr(vec![Json::Str(a.name.clone()), Json::UInt(a.size as u64)]))
                .collect();
            let dims = pl
                .mp
                .dims()
                .iter()
                .map(|axes| {
                    Json::Arr(
                        axes.iter()
                            .map(|&a| Json::Str(mesh.axis_name(a).to_string()))
                            .collect(),
                    )
                })
                .collect();
            let ranks = mesh.rank_list();
            let ranks = match rank_range(ranks) {
                Some((start, count)) => ("rank_range", Json::uints([start as u64, count as u64])),
                None => ("rank_list", Json::uints(ranks.iter().map(|&r| r as u64))),
            };
            Json::obj([
                ("stage", Json::UInt(pl.stage as u64)),
                ("mesh", Json::obj([("axes", Json::Arr(axes)), ranks])),
                ("dims", Json::Arr(dims)),
                ("optimizer_shard", Json::UInt(pl.opt_shard as u64)),
                (
                    "rows",
                    pl.mp.row_split().map_or(Json::Null, |rows| {
                        Json::uints(rows.iter().map(|&r| r as u64))
                    }),
                ),
            ])
        })
        .collect();
    Json::obj([
        ("name", Json::Str(p.name.clone())),
        ("shape", Json::uints(p.shape.iter().map(|&d| d as u64))),
        (
            "dtype",
            p.dtype
                .map_or(Json::Null, |d| Json::Str(d.name().to_string())),
        ),
        ("placements", Json::Arr(placements)),
    ])
}

fn op_json(op: &OpStrategyRecord) -> Json {
    let tuples = |ts: &[Vec<usize>]| {
        Json::Arr(
            ts.iter()
                .map(|t| Json::uints(t.iter().map(|&f| f as u64)))
                .collect(),
        )
    };
    Json::obj([
        ("name", Json::Str(op.name.clone())),
        ("stage", Json::UInt(op.stage as u64)),
        ("in_strategy", tuples(&op.inputs)),
        (
            "out_strategy",
            op.outputs.as_deref().map_or(Json::Null, tuples),
        ),
    ])
}

/// What the old writer wrote.
fn oracle(strategy: &ResolvedStrategy, ops: &[OpStrategyRecord]) -> Vec<u8> {
    let mut text = to_json(strategy, ops).to_pretty(2);
    text.push('\n');
    text.into_bytes()
}

/// What [`write`] writes.
fn written(dir: &Path, strategy: &ResolvedStrategy, ops: &[OpStrategyRecord]) -> Vec<u8> {
    let path = dir.join("strategy.json");
    write(&path, strategy, ops, true).unwrap();
    std::fs::read(&path).unwrap()
}

/// The strategy of a Tessera JSON text (tensors without a shape get the smallest one their
/// placements divide).
fn resolved(text: &str) -> ResolvedStrategy {
    crate::Strategy::from_bytes(Path::new("test.json"), text.as_bytes())
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .resolve_scale_free()
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn file(tensors: &[String]) -> String {
    format!(
        r#"{{"format": "tessera-strategy", "version": 2, "tensors": [{}]}}"#,
        tensors.join(", ")
    )
}

fn op(
    name: &str,
    stage: usize,
    inputs: &[&[usize]],
    outputs: Option<&[&[usize]]>,
) -> OpStrategyRecord {
    let tuples = |ts: &[&[usize]]| ts.iter().map(|t| t.to_vec()).collect::<Vec<_>>();
    OpStrategyRecord {
        name: name.to_string(),
        stage,
        inputs: tuples(inputs),
        outputs: outputs.map(tuples),
        in_layouts: None,
        out_layouts: None,
    }
}

/// A small deterministic generator (a 64-bit LCG).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// A random valid tensor `i`: one to three pipeline stages over meshes of up to three axes
/// (consecutive or shuffled ranks), dims split over zero, one or two axes, optimizer shards
/// dividing the replicas, any dtype or none.
fn random_tensor(rng: &mut Lcg, i: usize) -> String {
    const NAMES: [&str; 3] = ["dp", "a\\\"x\\u0007", "mp"];
    let stages = 1 + rng.below(3) as usize;
    let n_axes = 1 + rng.below(3) as usize;
    let sizes: Vec<usize> = (0..n_axes).map(|_| 1 << rng.below(3)).collect();
    let n_dims = rng.below(4) as usize;
    // Each axis goes to one dim or none.
    let mut dims: Vec<Vec<usize>> = vec![Vec::new(); n_dims];
    let mut replicas = 1;
    for (a, &size) in sizes.iter().enumerate() {
        match (n_dims, rng.below(n_dims as u64 + 1) as usize) {
            (0, _) => replicas *= size,
            (_, d) if d == n_dims => replicas *= size,
            (_, d) => dims[d].push(a),
        }
    }
    let devices: usize = sizes.iter().product();
    // A scalar has no dim 0 for an optimizer shard to split.
    let replicas = if n_dims == 0 { 1 } else { replicas };
    let shards: Vec<usize> = (1..=replicas).filter(|k| replicas % k == 0).collect();
    let placements: Vec<String> = (0..stages)
        .map(|stage| {
            let start = stage * devices + rng.below(3) as usize;
            let mut ranks: Vec<usize> = (start..start + devices).collect();
            let ranks = if rng.below(2) == 0 || devices == 1 {
                format!(r#""rank_range": [{start}, {devices}]"#)
            } else {
                ranks.swap(0, devices - 1);
                format!(r#""rank_list": {ranks:?}"#)
            };
            let axes: Vec<String> = sizes
                .iter()
                .enumerate()
                .map(|(a, s)| format!(r#"["{}", {s}]"#, NAMES[a]))
                .collect();
            let dims: Vec<String> = dims
                .iter()
                .map(|axes| {
                    let names: Vec<String> =
                        axes.iter().map(|&a| format!(r#""{}""#, NAMES[a])).collect();
                    format!("[{}]", names.join(", "))
                })
                .collect();
            let shard = shards[rng.below(shards.len() as u64) as usize];
            format!(
                r#"{{"stage": {stage}, "mesh": {{"axes": [{}], {ranks}}}, "dims": [{}], "optimizer_shard": {shard}}}"#,
                axes.join(", "),
                dims.join(", ")
            )
        })
        .collect();
    let shape: Vec<u64> = dims
        .iter()
        .map(|axes| {
            let split: usize = axes.iter().map(|&a| sizes[a]).product();
            // A multiple of any optimizer shard (at most 64 replicas).
            split as u64 * 64 * (1 + rng.below(16))
        })
        .collect();
    let dtype = ["null", "\"f32\"", "\"bf16\"", "\"i64\""][rng.below(4) as usize];
    format!(
        r#"{{"name": "layer.{i}.w\u00e9\ud83d\ude00", "shape": {shape:?}, "dtype": {dtype}, "placements": [{}]}}"#,
        placements.join(", ")
    )
}

#[test]
fn the_streaming_writer_writes_the_bytes_the_tree_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let check = |what: &str, strategy: &ResolvedStrategy, ops: &[OpStrategyRecord]| {
        let want = oracle(strategy, ops);
        let got = written(dir.path(), strategy, ops);
        assert!(
            got == want,
            "{what}: the writer's bytes differ from the tree's\n--- tree:\n{}\n--- writer:\n{}",
            String::from_utf8_lossy(&want),
            String::from_utf8_lossy(&got)
        );
    };
    let mesh8 = r#"{"axes": [["dp", 2], ["mp", 4]], "rank_range": [0, 8]}"#;
    let cases: Vec<(&str, String, Vec<OpStrategyRecord>)> = vec![
        ("no tensors, no ops", file(&[]), vec![]),
        (
            "pipeline stages, optimizer shards, multi-axis dims",
            file(&[
                format!(
                    r#"{{"name": "w", "shape": [8, 4], "dtype": "f32", "placements": [
                    {{"stage": 1, "mesh": {{"axes": [["dp", 2], ["mp", 4]], "rank_range": [8, 8]}}, "dims": [["mp"], []], "optimizer_shard": 2}},
                    {{"stage": 0, "mesh": {mesh8}, "dims": [["dp", "mp"], []]}}]}}"#
                ),
                r#"{"name": "scalar", "shape": [], "dtype": null, "placements": [
                    {"mesh": {"axes": [["dp", 2]], "rank_list": [3, 1]}, "dims": []}]}"#
                    .to_string(),
            ]),
            vec![
                op("matmul", 0, &[&[2, 4], &[4, 1]], Some(&[&[2, 1]])),
                op("relu", 1, &[&[8]], None),
                op("const", 2, &[], Some(&[])),
            ],
        ),
        (
            "interleaved ranks, reversed axes and uneven rows",
            file(&[
                // A resolved strategy holds no interleaved_parallel mesh (it is refused): dims
                // split over several axes in either order, and a shuffled interleaving of ranks.
                r#"{"name": "v", "shape": [8, 2], "dtype": "bf16", "placements": [
                    {"mesh": {"axes": [["dp", 2], ["mp", 2]], "rank_list": [0, 2, 1, 3]},
                     "dims": [["mp", "dp"], []]}]}"#
                    .to_string(),
                r#"{"name": "e", "shape": [10, 4], "dtype": "f32", "placements": [
                    {"mesh": {"axes": [["mp", 2]], "rank_range": [0, 2]}, "dims": [["mp"], []], "rows": [3, 7]}]}"#
                    .to_string(),
            ]),
            vec![],
        ),
        (
            "names needing escapes, huge sizes",
            file(&[format!(
                r#"{{"name": "a\"b\\c\n\t\u0001\u001f/\u00e9\u2028\ud83d\ude00", "shape": [{}], "dtype": "i64", "placements": [
                    {{"mesh": {{"axes": [["x\"\\y\u0007", 2]], "rank_range": [4094, 2]}}, "dims": [["x\"\\y\u0007"]]}}]}}"#,
                1u64 << 40
            )]),
            vec![op("op \"q\"\\\n\u{7f}", 3, &[&[1, 2, 3]], Some(&[&[1], &[2]]))],
        ),
    ];
    for (what, text, ops) in &cases {
        check(what, &resolved(text), ops);
    }
    let mut rng = Lcg(7);
    for round in 0..20 {
        let n = rng.below(30) as usize;
        let tensors: Vec<String> = (0..n).map(|i| random_tensor(&mut rng, i)).collect();
        let ops: Vec<OpStrategyRecord> = (0..rng.below(4) as usize)
            .map(|i| op(&format!("op{i}"), i, &[&[1, 2]], None))
            .collect();
        check(
            &format!("random round {round}"),
            &resolved(&file(&tensors)),
            &ops,
        );
    }
}

/// A strategy of `n` tensors like a large model's: one placement each on a `dp` × `mp` mesh of
/// 8 consecutive ranks, every third one in pipeline stage 1 as well, some optimizer-sharded.
fn large_strategy(n: usize) -> ResolvedStrategy {
    use layout::TensorLayout;
    let stage_mesh = |start| {
        Mesh::from_axes(
            vec![
                MeshAxis {
                    name: "dp".to_string(),
                    size: 2,
                },
                MeshAxis {
                    name: "mp".to_string(),
                    size: 4,
                },
            ],
            Some((start..start + 8).collect()),
        )
        .unwrap()
    };
    let layouts: Vec<TensorLayout> = [0, 8]
        .into_iter()
        .map(|start| {
            let layout = Layout::from_mesh(stage_mesh(start), vec![vec![1], vec![]]).unwrap();
            TensorLayout::new(layout, &[4096, 1024]).unwrap()
        })
        .collect();
    let params = (0..n)
        .map(|i| {
            let stages: &[usize] = if i % 3 == 0 { &[0, 1] } else { &[0] };
            let placements = stages
                .iter()
                .map(|&s| ParamLayout::new(s, layouts[s].clone(), 1 + i % 2).unwrap())
                .collect();
            ResolvedParam {
                name: format!("model.layers.{i}.attention.wq.weight"),
                shape: vec![4096, 1024],
                dtype: Some(DType::F32),
                placements,
            }
        })
        .collect();
    ResolvedStrategy::new(params).unwrap()
}

/// Writes a strategy of `TESSERA_MEASURE_TENSORS` (300 000) tensors to `TESSERA_MEASURE_OUT`
/// with the writer (or, with `TESSERA_MEASURE_WRITER=tree`, through the old tree; `none`: only
/// build the strategy), for `/usr/bin/time`. Run by hand:
/// `cargo test -p tessera-ckpt --lib measure_write -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, run by hand"]
fn measure_write() {
    let n = std::env::var("TESSERA_MEASURE_TENSORS").map_or(300_000, |v| v.parse().unwrap());
    let out = std::env::var("TESSERA_MEASURE_OUT").unwrap_or("/tmp/measure-strategy.json".into());
    let how = std::env::var("TESSERA_MEASURE_WRITER").unwrap_or_default();
    let strategy = large_strategy(n);
    let start = std::time::Instant::now();
    match how.as_str() {
        "none" => return,
        "tree" => {
            crate::io::atomic_write::write_file(Path::new(&out), &oracle(&strategy, &[]), true)
                .unwrap();
        }
        _ => {
            write(Path::new(&out), &strategy, &[], true).unwrap();
        }
    }
    eprintln!("{how}: wrote {n} tensors in {:?}", start.elapsed());
}

/// Loads the strategy file `TESSERA_MEASURE_OUT` (as [`measure_write`] wrote it), for
/// `/usr/bin/time`; with `TESSERA_MEASURE_READER=inspect`, through [`crate::inspect`].
#[test]
#[ignore = "a measurement, run by hand"]
fn measure_read() {
    let path = std::env::var("TESSERA_MEASURE_OUT").unwrap_or("/tmp/measure-strategy.json".into());
    let start = std::time::Instant::now();
    let n = match std::env::var("TESSERA_MEASURE_READER").as_deref() {
        Ok("inspect") => match crate::inspect(Path::new(&path)).unwrap() {
            crate::InspectedFile::Strategy(s) => s.params.len(),
            _ => panic!("not a strategy"),
        },
        _ => crate::Strategy::load(Path::new(&path))
            .unwrap()
            .params
            .len(),
    };
    eprintln!("read {n} tensors in {:?}", start.elapsed());
}

/// How many whole-text detection passes `f` made.
fn detection_passes<T>(f: impl FnOnce() -> T) -> (T, usize) {
    use crate::format::detect::JSON_PASSES;
    let before = JSON_PASSES.with(|n| n.get());
    let out = f();
    (out, JSON_PASSES.with(|n| n.get()) - before)
}

/// How many times `f` opened a file to detect or read a strategy.
fn file_reads<T>(f: impl FnOnce() -> T) -> (T, usize) {
    use crate::format::detect::FILE_READS;
    let before = FILE_READS.with(|n| n.get());
    let out = f();
    (out, FILE_READS.with(|n| n.get()) - before)
}

#[test]
fn a_strategy_file_is_read_in_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.json");
    let strategy = resolved(&file(&[random_tensor(&mut Lcg(3), 0)]));
    write(&path, &strategy, &[], false).unwrap();
    // What the writer writes: no detection pass before the read, whether through `load` or
    // `inspect` (whose detection step already read the file).
    let (loaded, passes) = detection_passes(|| crate::Strategy::load(&path).unwrap());
    assert_eq!((loaded.params.len(), passes), (1, 0));
    let ((inspected, passes), reads) =
        file_reads(|| detection_passes(|| crate::inspect(&path).unwrap()));
    assert!(matches!(inspected, crate::InspectedFile::Strategy(_)));
    assert_eq!(
        (passes, reads),
        (1, 1),
        "inspect reads the file once and detects it once"
    );
    // A file giving "format" after other keys (or with white space, or escaped) is still
    // detected first, and read.
    let bytes = std::fs::read(&path).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let body = text.trim().trim_start_matches('{').trim_end_matches('}');
    let (format, rest) = body.split_once(',').unwrap();
    for (what, other) in [
        ("format last", format!("{{{rest}, {format}}}")),
        (
            "escaped key",
            text.replacen("\"format\"", "\"form\\u0061t\"", 1),
        ),
    ] {
        let (s, passes) =
            detection_passes(|| crate::Strategy::from_bytes(&path, other.as_bytes()).expect(what));
        assert_eq!((s.params.len(), passes), (1, 1), "{what}");
    }
    let spaced = format!(
        " \n{{ \"format\"\t:\r\n {}",
        text.split_once(':').unwrap().1
    );
    let (s, passes) =
        detection_passes(|| crate::Strategy::from_bytes(&path, spaced.as_bytes()).unwrap());
    assert_eq!((s.params.len(), passes), (1, 0));
}

#[test]
fn a_declared_strategy_that_fails_to_read_gets_the_detection_steps_message() {
    let path = Path::new("s.json");
    let err = |text: &str| {
        crate::Strategy::from_bytes(path, text.as_bytes())
            .unwrap_err()
            .to_string()
    };
    let head = r#"{"format": "tessera-strategy", "version": 2"#;
    // Not JSON after a tensor the checks refuse: the JSON fault is named, as detection names it.
    let e = err(&format!(
        r#"{head}, "tensors": [{{"name": "w"}}], "ops": [1 2]}}"#
    ));
    assert!(e.contains("not valid JSON") && e.contains("s.json"), "{e}");
    // A second "format" makes it another kind of JSON for detection (the last one counts).
    let e = err(&format!(
        r#"{head}, "tensors": [], "format": "other", "weight_map": {{}}}}"#
    ));
    assert!(
        e.contains("neither a Tessera strategy") && e.contains("weight_map"),
        "{e}"
    );
    // A Tessera strategy with a bad tensor: that tensor is named.
    let e = err(&format!(r#"{head}, "tensors": [{{"name": "w"}}]}}"#));
    assert!(e.contains("\"w\"") && e.contains("shape"), "{e}");
    let e = err(&format!("{head}, \"tensors\": []}} trailing"));
    assert!(
        e.contains("not valid JSON") && e.contains("trailing"),
        "{e}"
    );
}

#[test]
fn a_failed_write_names_the_file_and_leaves_nothing() {
    /// Takes `left` bytes, then fails as a full disk does.
    struct Full {
        left: usize,
    }
    impl std::io::Write for Full {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.left == 0 {
                return Err(std::io::Error::from_raw_os_error(28));
            }
            let n = buf.len().min(self.left);
            self.left -= n;
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let strategy = large_strategy(2000);
    let e = write_json(Full { left: 100_000 }, &strategy, &[]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(28), "{e}");
    // An existing destination is kept, and the refusal names it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.json");
    std::fs::write(&path, b"mine").unwrap();
    let e = write(&path, &strategy, &[], false).unwrap_err().to_string();
    assert!(e.contains(&path.display().to_string()), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), b"mine");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}
