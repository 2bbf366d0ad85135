//! Fuzzing the three parsers (safetensors header, `.ckpt`, strategy protobuf) and the
//! group-info parser with proptest-generated garbage and with mutations of valid files: they
//! must return errors, never panic, hang or allocate without bound.

use std::io::Write;

use proptest::prelude::*;

fn valid_safetensors_header() -> Vec<u8> {
    br#"{"__metadata__":{"format":"ms"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}}"#.to_vec()
}

fn valid_ckpt() -> Vec<u8> {
    let dir = crate::util::tmp();
    let t = tensor::Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
    let path = dir.path().join("x.safetensors");
    ckpt::save_safetensors(&path, &[("w", &t)], false).unwrap();
    // A two-value .ckpt built by hand: the same bytes MindSpore writes.
    let mut out = Vec::new();
    for (tag, dims, content) in [
        ("w", vec![2u8, 3], vec![7u8; 24]),
        ("g", vec![1], vec![1, 0, 0, 0]),
    ] {
        let mut tensor = Vec::new();
        for d in dims {
            tensor.extend_from_slice(&[0x08, d]);
        }
        tensor.extend_from_slice(&[0x12, 7]);
        tensor.extend_from_slice(b"Float32");
        tensor.push(0x1a);
        tensor.push(content.len() as u8);
        tensor.extend_from_slice(&content);
        let mut value = vec![0x0a, tag.len() as u8];
        value.extend_from_slice(tag.as_bytes());
        value.push(0x12);
        value.push(tensor.len() as u8);
        value.extend_from_slice(&tensor);
        out.push(0x0a);
        out.push(value.len() as u8);
        out.extend_from_slice(&value);
    }
    out
}

fn valid_strategy() -> Vec<u8> {
    // The first bytes of case1's A.ckpt shown in FORMAT_EXAMPLES.txt, plus one layout item.
    let mut s = vec![0x08, 0x01];
    let layout: Vec<u8> = [
        vec![0x0a, 0x04, 0x08, 0x02, 0x08, 0x04],
        vec![0x12, 0x04, 0x08, 0x01, 0x08, 0x00],
        vec![0x1a, 0x00, 0x22, 0x00, 0x28, 0x00, 0x30, 0x00, 0x38, 0x00],
    ]
    .concat();
    let mut item = vec![0x0a, 0x02, b'w', b'1', 0x12, layout.len() as u8];
    item.extend_from_slice(&layout);
    s.push(0x1a);
    s.push(item.len() as u8);
    s.extend_from_slice(&item);
    s
}

/// Opens `bytes` as a `.ckpt` file; the result does not matter, only that it returns.
fn open_ckpt(bytes: &[u8]) {
    let mut f = tempfile::Builder::new().suffix(".ckpt").tempfile().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    if let Ok(file) = ckpt::CheckpointFile::open(f.path()) {
        for t in file.tensors() {
            let _ = file.read_tensor(&t.name);
        }
    }
}

fn mutate(base: &[u8], edits: &[(usize, u8)], cut: usize) -> Vec<u8> {
    let mut b = base.to_vec();
    for &(at, v) in edits {
        if !b.is_empty() {
            let i = at % b.len();
            b[i] = v;
        }
    }
    b.truncate(b.len().saturating_sub(cut % 4));
    b
}

#[test]
fn valid_inputs_parse() {
    assert_eq!(
        ckpt::parse::safetensors_header(&valid_safetensors_header(), 22).unwrap(),
        2
    );
    let s = ckpt::parse::strategy(&valid_strategy()).unwrap();
    assert_eq!(s.params[0].name, "w1");
    let mut f = tempfile::Builder::new().suffix(".ckpt").tempfile().unwrap();
    f.write_all(&valid_ckpt()).unwrap();
    let file = ckpt::CheckpointFile::open(f.path()).unwrap();
    assert_eq!(file.tensors().len(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn safetensors_header_garbage(bytes in prop::collection::vec(any::<u8>(), 0..300), len in 0u64..64) {
        let _ = ckpt::parse::safetensors_header(&bytes, len);
    }

    #[test]
    fn safetensors_header_mutations(edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6), cut in any::<usize>(), len in 0u64..40) {
        let _ = ckpt::parse::safetensors_header(&mutate(&valid_safetensors_header(), &edits, cut), len);
    }

    #[test]
    fn strategy_garbage(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = ckpt::parse::strategy(&bytes);
        let _ = ckpt::parse::group_info(&bytes);
    }

    #[test]
    fn strategy_mutations(edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6), cut in any::<usize>()) {
        let bytes = mutate(&valid_strategy(), &edits, cut);
        if let Ok(s) = ckpt::parse::strategy(&bytes) {
            let _ = s.resolve_scale_free();
        }
    }

    #[test]
    fn ckpt_garbage(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        open_ckpt(&bytes);
    }

    #[test]
    fn ckpt_mutations(edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6), cut in any::<usize>()) {
        open_ckpt(&mutate(&valid_ckpt(), &edits, cut));
    }
}
