//! A measurement, not a feature: could `prost` replace `ckpt`'s hand-written protobuf codec
//! for MindSpore `.ckpt` files? Decode MindSpore's own files with prost-derived messages,
//! encode them again, and compare bytes (see ARCHITECTURE.md, "ps").

use std::path::PathBuf;

/// MindSpore's `Checkpoint` (proto2).
#[derive(Clone, PartialEq, prost::Message)]
struct Checkpoint {
    #[prost(message, repeated, tag = "1")]
    value: Vec<Value>,
}

/// MindSpore's `Checkpoint.Value`.
#[derive(Clone, PartialEq, prost::Message)]
struct Value {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(message, optional, tag = "2")]
    tensor: Option<TensorProto>,
}

/// MindSpore's `TensorProto`, dims unpacked as proto2 writes them.
#[derive(Clone, PartialEq, prost::Message)]
struct TensorProto {
    #[prost(int64, repeated, packed = "false", tag = "1")]
    dims: Vec<i64>,
    #[prost(string, tag = "2")]
    tensor_type: String,
    #[prost(bytes = "vec", tag = "3")]
    tensor_content: Vec<u8>,
}

/// The same with prost's default for repeated scalars (packed, proto3's rule).
#[derive(Clone, PartialEq, prost::Message)]
struct PackedTensorProto {
    #[prost(int64, repeated, tag = "1")]
    dims: Vec<i64>,
    #[prost(string, tag = "2")]
    tensor_type: String,
    #[prost(bytes = "vec", tag = "3")]
    tensor_content: Vec<u8>,
}

fn mindspore_ckpt_files() -> Vec<PathBuf> {
    let cases =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/mindspore/cases");
    let mut files = Vec::new();
    let mut stack = vec![cases];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "ckpt")
                && p.to_string_lossy().contains("convert_ckpt")
            {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn prost_reencodes_mindspore_checkpoints_byte_for_byte_only_unpacked() {
    use prost::Message;
    let files = mindspore_ckpt_files();
    if files.is_empty() {
        eprintln!("skipped: tests/fixtures/mindspore/cases is not here");
        return;
    }
    let (mut same, mut packed_differs) = (0, 0);
    for path in &files {
        let bytes = std::fs::read(path).unwrap();
        let decoded = Checkpoint::decode(bytes.as_slice())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let again = decoded.encode_to_vec();
        assert_eq!(
            again,
            bytes,
            "{}: prost re-encoding differs",
            path.display()
        );
        same += 1;
        // Packed dims (prost's default for repeated scalars) are not MindSpore's bytes.
        let packed: Vec<u8> = decoded
            .value
            .iter()
            .flat_map(|v| {
                let t = v.tensor.clone().unwrap_or_default();
                PackedTensorProto {
                    dims: t.dims,
                    tensor_type: t.tensor_type,
                    tensor_content: t.tensor_content,
                }
                .encode_to_vec()
            })
            .collect();
        let unpacked: Vec<u8> = decoded
            .value
            .iter()
            .flat_map(|v| v.tensor.clone().unwrap_or_default().encode_to_vec())
            .collect();
        packed_differs += usize::from(packed != unpacked);
    }
    eprintln!(
        "prost: {same} MindSpore .ckpt files re-encoded byte for byte with unpacked dims; packed dims differ in {packed_differs}"
    );
    assert!(packed_differs > 0);
}
