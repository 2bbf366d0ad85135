//! Helpers shared by the integration tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ckpt::CheckpointFile;

/// The MindSpore reference cases, copied into the repository (`tests/fixtures/mindspore/`).
/// Always `Some`: a clone without them is broken, and the tests say so rather than skip.
pub fn cases() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/mindspore/cases");
    assert!(
        dir.is_dir(),
        "{} is missing: the MindSpore conformance fixtures are part of the repository",
        dir.display()
    );
    Some(dir)
}

/// One case directory, or `None` with the reason printed.
pub fn case(name: &str) -> Option<PathBuf> {
    cases().map(|c| c.join(name))
}

/// A tensor as stored: MindSpore type name, shape and raw bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub ty: String,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// Every tensor of a checkpoint file, in file order.
pub fn read_all(path: &Path) -> Vec<(String, Stored)> {
    let f = CheckpointFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.tensors()
        .iter()
        .map(|t| {
            let mut bytes = vec![0u8; t.n_bytes as usize];
            f.read_bytes(t, 0, &mut bytes).unwrap();
            (
                t.name.clone(),
                Stored {
                    ty: t.ty.mindspore_name().to_string(),
                    shape: t.shape.clone(),
                    bytes,
                },
            )
        })
        .collect()
}

/// Asserts two checkpoint files hold the same tensors (names, types, shapes, values); with
/// `same_order`, in the same order too.
pub fn assert_same_tensors(ours: &Path, expected: &Path, same_order: bool) {
    let a = read_all(ours);
    let b = read_all(expected);
    if same_order {
        let na: Vec<&String> = a.iter().map(|(n, _)| n).collect();
        let nb: Vec<&String> = b.iter().map(|(n, _)| n).collect();
        assert_eq!(
            na,
            nb,
            "tensor order of {} vs {}",
            ours.display(),
            expected.display()
        );
    }
    let ma: BTreeMap<_, _> = a.into_iter().collect();
    let mb: BTreeMap<_, _> = b.into_iter().collect();
    assert_eq!(
        ma.keys().collect::<Vec<_>>(),
        mb.keys().collect::<Vec<_>>(),
        "tensor names of {} vs {}",
        ours.display(),
        expected.display()
    );
    for (name, x) in &ma {
        let y = &mb[name];
        assert_eq!(
            (&x.ty, &x.shape),
            (&y.ty, &y.shape),
            "{name} in {}",
            ours.display()
        );
        assert!(
            x.bytes == y.bytes,
            "values of {name} differ: {} vs {}",
            ours.display(),
            expected.display()
        );
    }
}

/// A fresh temporary directory.
pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// A safetensors file's header (without Tessera's set id, which ties a file to the set it was
/// written in) and its data bytes.
pub fn safetensors_parts(path: &Path) -> (serde_json::Value, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    if let Some(meta) = header
        .get_mut("__metadata__")
        .and_then(|m| m.as_object_mut())
    {
        meta.remove(ckpt::SET_ID_KEY);
    }
    (header, bytes[8 + n..].to_vec())
}

/// Asserts two safetensors files have the same header (but for Tessera's set id) and the same
/// data bytes.
pub fn assert_same_safetensors_bytes(ours: &Path, expected: &Path) {
    let (h1, d1) = safetensors_parts(ours);
    let (h2, d2) = safetensors_parts(expected);
    assert_eq!(h1, h2, "{} vs {}", ours.display(), expected.display());
    assert!(
        d1 == d2,
        "{} vs {}: data differs",
        ours.display(),
        expected.display()
    );
}

/// The least common multiple of `a` and `b` (a dim every split of a random layout divides).
pub fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}

/// A MindSpore layout of one device matrix `dev` and tensor map `map`, nothing else set.
pub fn ms_layout(dev: &[u32], map: &[i32]) -> ckpt::MsLayout {
    ckpt::MsLayout {
        dev_matrix: vec![dev.to_vec()],
        tensor_map: vec![map.to_vec()],
        param_split_shape: vec![vec![]],
        indices_offset: vec![vec![]],
        ..ckpt::MsLayout::default()
    }
}

/// SplitMix64: a small seeded generator for the property tests.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// One of `xs`.
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    /// True `percent` times in 100.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}
