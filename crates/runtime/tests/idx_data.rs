//! Reading IDX files: the bundled digits against their raw bytes, and hostile files.

use std::path::{Path, PathBuf};

use runtime::{BatchPlan, IdxDataset, Normalize, RuntimeError, Split};
use tensor::Tensor;

fn digits_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/digits")
}

/// The pixel bytes of sample `index` of a raw IDX image file with 8×8 images.
fn raw_sample(raw: &[u8], index: usize) -> &[u8] {
    &raw[16 + index * 64..16 + (index + 1) * 64]
}

#[test]
fn digits_samples_match_their_raw_bytes() {
    let dir = digits_dir();
    for (split, n) in [(Split::Train, 1500), (Split::Test, 297)] {
        let raw_images = std::fs::read(dir.join(split.images_file_name())).unwrap();
        let raw_labels = std::fs::read(dir.join(split.labels_file_name())).unwrap();
        let data = IdxDataset::open(&dir, split, None).unwrap();
        assert_eq!(data.len(), n);
        assert_eq!(data.image_shape(), [8, 8]);
        // The default divisor is the largest pixel of the file (16 for this data set).
        let max = *raw_images[16..].iter().max().unwrap();
        assert_eq!(max, 16);
        assert_eq!(data.pixel_max(), f32::from(max));
        assert_eq!(data.labels(), &raw_labels[8..]);

        // Unsorted, repeated, with a run of consecutive indices and both ends.
        let indices = [5, 3, 4, 5, 6, n - 1, 0];
        let images = data.read_images(&indices).unwrap();
        assert_eq!(images.shape(), &[indices.len(), 8, 8]);
        let pixels = images.as_f32().unwrap();
        for (row, &index) in indices.iter().enumerate() {
            let want: Vec<f32> = raw_sample(&raw_images, index)
                .iter()
                .map(|&b| f32::from(b) / 16.0)
                .collect();
            assert_eq!(
                &pixels[row * 64..(row + 1) * 64],
                want.as_slice(),
                "sample {index}"
            );
        }
        let labels = data.read_labels(&indices).unwrap();
        let want: Vec<i32> = indices
            .iter()
            .map(|&i| i32::from(raw_labels[8 + i]))
            .collect();
        assert_eq!(labels, Tensor::from_vec(&[indices.len()], want).unwrap());
        data.validate_labels(10).unwrap();
    }
}

#[test]
fn an_explicit_pixel_max_is_used_as_given() {
    let data = IdxDataset::open(&digits_dir(), Split::Test, Some(255.0)).unwrap();
    let raw = std::fs::read(digits_dir().join("t10k-images-idx3-ubyte")).unwrap();
    let image = data.read_images(&[7]).unwrap();
    let want: Vec<f32> = raw_sample(&raw, 7)
        .iter()
        .map(|&b| f32::from(b) / 255.0)
        .collect();
    assert_eq!(image.as_f32().unwrap(), want.as_slice());
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        match IdxDataset::open(&digits_dir(), Split::Test, Some(bad)).unwrap_err() {
            RuntimeError::Config { key, .. } => assert_eq!(key, "data.pixel_max"),
            other => panic!("expected a Config error, got {other}"),
        }
    }
}

/// Every rank reading its rows of a batch reads exactly the rows of the whole batch, for any
/// device count.
#[test]
fn rank_shares_of_a_batch_assemble_to_the_batch() {
    let data = IdxDataset::open(&digits_dir(), Split::Train, None).unwrap();
    let plan = BatchPlan::train(data.len(), 32, true, 5, 1).unwrap();
    let batch = plan.batch(3).unwrap();
    let whole = data.read_images(batch.indices).unwrap();
    for devices in [1, 2, 4, 8] {
        let rows = 32 / devices;
        let parts: Vec<Tensor> = (0..devices)
            .map(|rank| {
                data.read_images(batch.rows(rank * rows, rows).unwrap())
                    .unwrap()
            })
            .collect();
        assert_eq!(
            Tensor::concat(&parts, 0).unwrap(),
            whole,
            "{devices} devices"
        );
    }
}

/// Writes an IDX file: magic, big-endian dims, then `data`.
fn write_idx(path: &Path, magic: u32, dims: &[u32], data: &[u8]) {
    let mut bytes = magic.to_be_bytes().to_vec();
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

/// A valid split of `n` 2×3 images (pixels 0..=9) and labels in `dir`.
fn write_split(dir: &Path, n: u32) {
    let pixels: Vec<u8> = (0..n * 6).map(|i| (i % 10) as u8).collect();
    let labels: Vec<u8> = (0..n).map(|i| (i % 3) as u8).collect();
    write_idx(
        &dir.join("train-images-idx3-ubyte"),
        0x803,
        &[n, 2, 3],
        &pixels,
    );
    write_idx(&dir.join("train-labels-idx1-ubyte"), 0x801, &[n], &labels);
}

/// Opens the train split of `dir` expecting a `Data` error on file `file`; returns the reason.
fn data_error(dir: &Path, file: &str) -> String {
    match IdxDataset::open(dir, Split::Train, None).unwrap_err() {
        RuntimeError::Data { path, reason } => {
            assert_eq!(path, dir.join(file), "{reason}");
            reason
        }
        other => panic!("expected a Data error on {file}, got {other}"),
    }
}

#[test]
fn a_small_valid_split_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    write_split(dir.path(), 4);
    let data = IdxDataset::open(dir.path(), Split::Train, None).unwrap();
    assert_eq!(
        (data.len(), data.image_shape(), data.pixel_max()),
        (4, [2, 3], 9.0)
    );
    let image = data.read_images(&[2]).unwrap();
    // Sample 2 holds pixels 12..18 → 2, 3, 4, 5, 6, 7.
    let want: Vec<f32> = [2u8, 3, 4, 5, 6, 7]
        .iter()
        .map(|&b| f32::from(b) / 9.0)
        .collect();
    assert_eq!(image.as_f32().unwrap(), want.as_slice());
}

#[test]
fn bad_magic_numbers_are_rejected_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    write_split(dir.path(), 4);
    // A label file where an image file belongs.
    write_idx(
        &dir.path().join("train-images-idx3-ubyte"),
        0x801,
        &[4],
        &[0; 4],
    );
    let reason = data_error(dir.path(), "train-images-idx3-ubyte");
    assert!(
        reason.contains("bad magic number 0x00000801") && reason.contains("0x00000803"),
        "{reason}"
    );

    write_split(dir.path(), 4);
    // Little-endian magic, as a careless writer produces.
    let mut bytes = std::fs::read(dir.path().join("train-labels-idx1-ubyte")).unwrap();
    bytes[..4].copy_from_slice(&0x801u32.to_le_bytes());
    std::fs::write(dir.path().join("train-labels-idx1-ubyte"), bytes).unwrap();
    let reason = data_error(dir.path(), "train-labels-idx1-ubyte");
    assert!(reason.contains("bad magic number 0x01080000"), "{reason}");

    // Float elements (type 0x0D) are not MNIST's bytes.
    write_split(dir.path(), 4);
    write_idx(
        &dir.path().join("train-images-idx3-ubyte"),
        0xD03,
        &[4, 2, 3],
        &[0; 96],
    );
    assert!(
        data_error(dir.path(), "train-images-idx3-ubyte").contains("bad magic number 0x00000D03")
    );
}

#[test]
fn truncated_and_overlong_files_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("train-images-idx3-ubyte");
    write_split(dir.path(), 4);
    // Data cut short.
    write_idx(&images, 0x803, &[4, 2, 3], &[1; 23]);
    let reason = data_error(dir.path(), "train-images-idx3-ubyte");
    assert!(
        reason.contains("truncated")
            && reason.contains("promises 40 bytes")
            && reason.contains("has 39"),
        "{reason}"
    );
    // Header cut short, within the magic number and after it.
    std::fs::write(&images, [0u8, 0, 8]).unwrap();
    let reason = data_error(dir.path(), "train-images-idx3-ubyte");
    assert!(
        reason.contains("truncated") && reason.contains("4-byte magic"),
        "{reason}"
    );
    write_idx(&images, 0x803, &[4, 2], &[]);
    let reason = data_error(dir.path(), "train-images-idx3-ubyte");
    assert!(
        reason.contains("truncated") && reason.contains("16-byte header"),
        "{reason}"
    );
    // Trailing bytes.
    write_idx(&images, 0x803, &[4, 2, 3], &[1; 25]);
    assert!(data_error(dir.path(), "train-images-idx3-ubyte").contains("1 trailing bytes"));
    // A header whose size overflows, with a short file: no huge allocation, an error.
    write_idx(&images, 0x803, &[u32::MAX, u32::MAX, u32::MAX], &[]);
    assert!(data_error(dir.path(), "train-images-idx3-ubyte").contains("overflow"));
    // A zero dim.
    write_idx(&images, 0x803, &[4, 0, 3], &[]);
    assert!(data_error(dir.path(), "train-images-idx3-ubyte").contains("dim 1 of the header is 0"));
    // Labels cut short.
    write_split(dir.path(), 4);
    write_idx(
        &dir.path().join("train-labels-idx1-ubyte"),
        0x801,
        &[4],
        &[0; 3],
    );
    assert!(data_error(dir.path(), "train-labels-idx1-ubyte").contains("truncated"));
}

#[test]
fn image_and_label_counts_must_match() {
    let dir = tempfile::tempdir().unwrap();
    write_split(dir.path(), 4);
    write_idx(
        &dir.path().join("train-labels-idx1-ubyte"),
        0x801,
        &[5],
        &[0; 5],
    );
    let reason = data_error(dir.path(), "train-labels-idx1-ubyte");
    assert!(
        reason.contains("holds 5 labels") && reason.contains("4 images"),
        "{reason}"
    );
}

#[test]
fn missing_files_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    match IdxDataset::open(dir.path(), Split::Test, None).unwrap_err() {
        RuntimeError::Io { path, source } => {
            assert_eq!(path, dir.path().join("t10k-images-idx3-ubyte"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected an Io error, got {other}"),
    }
}

#[test]
fn all_zero_images_need_an_explicit_pixel_max() {
    let dir = tempfile::tempdir().unwrap();
    write_split(dir.path(), 2);
    write_idx(
        &dir.path().join("train-images-idx3-ubyte"),
        0x803,
        &[2, 2, 3],
        &[0; 12],
    );
    assert!(data_error(dir.path(), "train-images-idx3-ubyte").contains("set data.pixel_max"));
    let data = IdxDataset::open(dir.path(), Split::Train, Some(1.0)).unwrap();
    assert_eq!(data.read_images(&[1]).unwrap().as_f32().unwrap(), &[0.0; 6]);
}

#[test]
fn out_of_range_indices_and_labels_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    write_split(dir.path(), 4);
    let data = IdxDataset::open(dir.path(), Split::Train, None).unwrap();
    for result in [
        data.read_images(&[0, 4]).map(|_| ()),
        data.read_labels(&[9]).map(|_| ()),
    ] {
        match result.unwrap_err() {
            RuntimeError::Data { reason, .. } => {
                assert!(reason.contains("out of range"), "{reason}")
            }
            other => panic!("expected a Data error, got {other}"),
        }
    }
    // Labels are 0..=2: fine for 3 classes, not for 2.
    data.validate_labels(3).unwrap();
    match data.validate_labels(2).unwrap_err() {
        RuntimeError::Data { path, reason } => {
            assert_eq!(path, dir.path().join("train-labels-idx1-ubyte"));
            assert!(reason.contains("sample 2 has label 2"), "{reason}");
        }
        other => panic!("expected a Data error, got {other}"),
    }
}

/// The test split must have the training split's image shape: the model is built for the
/// training images, and a larger test image would be cropped to them, a reshaped one fail at the
/// first evaluation, after training.
#[test]
fn a_test_split_of_another_image_shape_is_refused_naming_both_files() {
    let dir = tempfile::tempdir().unwrap();
    write_split(dir.path(), 4);
    let labels: Vec<u8> = vec![0, 1, 2];
    write_idx(
        &dir.path().join("t10k-labels-idx1-ubyte"),
        0x801,
        &[3],
        &labels,
    );
    let test_images = dir.path().join("t10k-images-idx3-ubyte");
    // The same 6 pixels an image, as 3×2; then larger, 3×3.
    for (dims, what) in [([3u32, 3, 2], "3×2"), ([3, 3, 3], "3×3")] {
        let n = (dims[0] * dims[1] * dims[2]) as usize;
        write_idx(&test_images, 0x803, &dims, &vec![1; n]);
        let err =
            IdxDataset::open_train_and_test(dir.path(), None, Normalize::default()).unwrap_err();
        match err {
            RuntimeError::Data { path, reason } => {
                assert_eq!(path, test_images, "{reason}");
                assert!(
                    reason.contains(&format!("holds {what} images"))
                        && reason.contains("train-images-idx3-ubyte")
                        && reason.contains("2×3"),
                    "{reason}"
                );
            }
            other => panic!("expected a Data error, got {other}"),
        }
    }
    // The training shape itself opens.
    write_idx(&test_images, 0x803, &[3, 2, 3], &[1; 18]);
    IdxDataset::open_train_and_test(dir.path(), None, Normalize::default()).unwrap();
}
