//! The detection step on MindSpore's own files: each reference file is named as the format it
//! is, whatever its extension says, and `inspect` reads it with that format's reader.

use ckpt::{inspect, FileFormat, InspectedFile};

use crate::util::{case, tmp};

#[test]
fn reference_files_are_detected_as_what_they_are() {
    let (Some(c1), Some(c5)) = (case("case1_dp2mp4_to_2x2"), case("case5_group_info")) else {
        return;
    };
    for (file, format) in [
        ("src_ckpt/rank_0/checkpoint_0.ckpt", FileFormat::MsCkpt),
        (
            "src_safetensors/rank_0/checkpoint_0.safetensors",
            FileFormat::Safetensors,
        ),
        ("strategy/A.ckpt", FileFormat::MsStrategy),
        ("strategy/A.json", FileFormat::MsStrategyJson),
    ] {
        let d = ckpt::detect(&c1.join(file)).unwrap();
        assert_eq!(d.format, format, "{file}: {}", d.evidence);
    }
    let d = ckpt::detect(&c5.join("group_info.pb")).unwrap();
    assert_eq!(d.format, FileFormat::GroupInfo, "{}", d.evidence);
    // Content decides, not the name: safetensors bytes named `.ckpt` are inspected as
    // safetensors, and a strategy named `.ckpt` as a strategy.
    let dir = tmp();
    let renamed = dir.path().join("really_safetensors.ckpt");
    std::fs::copy(
        c1.join("src_safetensors/rank_0/checkpoint_0.safetensors"),
        &renamed,
    )
    .unwrap();
    match inspect(&renamed).unwrap() {
        InspectedFile::Checkpoint(f) => assert_eq!(f.format(), ckpt::Format::Safetensors),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        inspect(&c1.join("strategy/A.ckpt")).unwrap(),
        InspectedFile::Strategy(_)
    ));
    assert!(matches!(
        inspect(&c5.join("group_info.pb")).unwrap(),
        InspectedFile::GroupInfo(_)
    ));
}

#[test]
fn a_file_of_no_format_names_every_format_ruled_out() {
    let dir = tmp();
    let path = dir.path().join("garbage.ckpt");
    std::fs::write(&path, b"\xff\xff\xff garbage").unwrap();
    let err = inspect(&path).unwrap_err();
    assert!(
        matches!(err, ckpt::CkptError::UnknownFormat { .. }),
        "{err}"
    );
    let text = err.to_string();
    for family in ["safetensors", "JSON", "group-info", "strategy", ".ckpt"] {
        assert!(text.contains(family), "{family}: {text}");
    }
}
