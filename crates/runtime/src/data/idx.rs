//! MNIST's IDX format: an image file and a label file per split.
//!
//! # Format
//! Every IDX file starts with a big-endian `u32` magic number `0x0000TTNN` (`TT` the element
//! type, `0x08` for unsigned bytes; `NN` the number of dims), then one big-endian `u32` per dim,
//! then the elements, row-major. Tessera reads the two kinds MNIST uses:
//!
//! | file | magic | dims | data |
//! |---|---|---|---|
//! | `<split>-images-idx3-ubyte` | `0x00000803` | `n, rows, cols` | `n·rows·cols` pixel bytes |
//! | `<split>-labels-idx1-ubyte` | `0x00000801` | `n` | `n` label bytes |
//!
//! with `<split>` `train` or `t10k` (the test split). Opening checks the magic numbers, that
//! every dim is positive, that the file is exactly as long as its header says (no truncation, no
//! trailing bytes) and that both files hold the same number of samples; errors name the file and
//! the rule broken. Header values are untrusted: sizes are computed with checked arithmetic and
//! nothing is allocated from them before the file length has confirmed them.
//!
//! # Reading
//! Labels are tiny and read whole at open. Images are read on demand, each rank only the
//! samples it needs, with positioned reads (`read_exact_at`): one read per run of consecutive
//! indices. Pixels become f32 divided by `pixel_max`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tensor::Tensor;

use crate::error::RuntimeError;

/// Magic number of an IDX file of unsigned bytes with 3 dims (images).
const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic number of an IDX file of unsigned bytes with 1 dim (labels).
const LABELS_MAGIC: u32 = 0x0000_0801;
/// Bytes read at a time while scanning for the largest pixel.
const SCAN_CHUNK: usize = 64 * 1024;

/// A split of an IDX data set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// The training split (`train-…` files).
    Train,
    /// The test split (`t10k-…` files), used for evaluation.
    Test,
}

impl Split {
    /// The file name prefix: `train` or `t10k`.
    pub fn file_prefix(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "t10k",
        }
    }

    /// The image file's name (`train-images-idx3-ubyte`).
    pub fn images_file_name(self) -> String {
        format!("{}-images-idx3-ubyte", self.file_prefix())
    }

    /// The label file's name (`train-labels-idx1-ubyte`).
    pub fn labels_file_name(self) -> String {
        format!("{}-labels-idx1-ubyte", self.file_prefix())
    }
}

fn data_error(path: &Path, reason: String) -> RuntimeError {
    RuntimeError::Data {
        path: path.to_path_buf(),
        reason,
    }
}

fn io_error(path: &Path, source: std::io::Error) -> RuntimeError {
    RuntimeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The validated header of an IDX file.
#[derive(Debug)]
struct IdxHeader {
    dims: Vec<usize>,
    /// Where the elements start.
    data_offset: u64,
}

/// Reads and checks the header of the IDX file `path` (open as `file`): magic `magic` with
/// `n_dims` dims, every dim positive, file length exactly header plus data.
fn read_header(
    file: &File,
    path: &Path,
    magic: u32,
    what: &str,
) -> Result<IdxHeader, RuntimeError> {
    let n_dims = (magic & 0xFF) as usize;
    let file_len = file.metadata().map_err(|e| io_error(path, e))?.len();
    let header_len = 4 + 4 * n_dims as u64;
    if file_len < 4 {
        return Err(data_error(
            path,
            format!(
                "truncated: {file_len} bytes, shorter than the 4-byte magic number of an IDX file"
            ),
        ));
    }
    let mut first_word = [0u8; 4];
    file.read_exact_at(&mut first_word, 0)
        .map_err(|e| io_error(path, e))?;
    let found = u32::from_be_bytes(first_word);
    if found != magic {
        return Err(data_error(
            path,
            format!(
                "bad magic number 0x{found:08X}: an IDX {what} file starts with 0x{magic:08X} \
                 (unsigned bytes, {n_dims} dim{})",
                if n_dims == 1 { "" } else { "s" }
            ),
        ));
    }
    if file_len < header_len {
        return Err(data_error(
            path,
            format!("truncated: {file_len} bytes, shorter than the {header_len}-byte header of an IDX {what} file"),
        ));
    }
    let mut header = vec![0u8; header_len as usize - 4];
    file.read_exact_at(&mut header, 4)
        .map_err(|e| io_error(path, e))?;
    let dims: Vec<usize> = header
        .chunks_exact(4)
        .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]) as usize)
        .collect();
    if let Some(position) = dims.iter().position(|&d| d == 0) {
        return Err(data_error(
            path,
            format!(
                "dim {position} of the header is 0; every dim must be positive (dims {dims:?})"
            ),
        ));
    }
    let data_len = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .and_then(|n| n.checked_add(header_len));
    match data_len {
        Some(expected) if expected == file_len => Ok(IdxHeader {
            dims,
            data_offset: header_len,
        }),
        Some(expected) if expected > file_len => Err(data_error(
            path,
            format!("truncated: the header (dims {dims:?}) promises {expected} bytes, the file has {file_len}"),
        )),
        Some(expected) => Err(data_error(
            path,
            format!(
                "{} trailing bytes: the header (dims {dims:?}) describes {expected} bytes, the file has {file_len}",
                file_len - expected
            ),
        )),
        None => Err(data_error(path, format!("the header's dims {dims:?} overflow a 64-bit size"))),
    }
}

/// One split of an IDX data set: its images (read on demand) and its labels (read at open).
///
/// The type is `Sync`: rank threads can share one instance, since positioned reads never move a
/// shared cursor.
#[derive(Debug)]
pub struct IdxDataset {
    split: Split,
    images_path: PathBuf,
    labels_path: PathBuf,
    images: File,
    data_offset: u64,
    n_samples: usize,
    rows: usize,
    cols: usize,
    labels: Vec<u8>,
    pixel_max: f32,
    /// Subtracted after dividing by `pixel_max` (0 unless standardised).
    mean: f32,
    /// Divides after subtracting `mean` (1 unless standardised).
    std: f32,
}

/// How pixels become network inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Normalize {
    /// `p / pixel_max`, in `[0, 1]`.
    Scale,
    /// `(p / pixel_max - mean) / std`, with the mean and standard deviation of the training
    /// split's scaled pixels (as MindSpore's MNIST pipelines do with `Rescale` then
    /// `Normalize(0.1307, 0.3081)`): zero-mean, unit-variance inputs.
    #[default]
    Standardize,
}

impl Normalize {
    /// Parses `scale` or `standardize`.
    pub fn parse(text: &str) -> Option<Normalize> {
        match text {
            "scale" => Some(Normalize::Scale),
            "standardize" => Some(Normalize::Standardize),
            _ => None,
        }
    }

    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            Normalize::Scale => "scale",
            Normalize::Standardize => "standardize",
        }
    }
}

impl IdxDataset {
    /// Opens `split` of the IDX data set in `dir` and validates both files (see the module docs).
    ///
    /// Pixels are divided by `pixel_max` when given (it must be finite and > 0). When it is
    /// `None`, the largest pixel value in the image file is used: finding it reads the whole
    /// image file once, here, in 64 KiB chunks (an image file of zeros only is rejected). To
    /// normalise a test split like its training split, pass the training split's divisor, or
    /// use [`IdxDataset::open_train_and_test`].
    pub fn open(
        dir: &Path,
        split: Split,
        pixel_max: Option<f32>,
    ) -> Result<IdxDataset, RuntimeError> {
        let images_path = dir.join(split.images_file_name());
        let labels_path = dir.join(split.labels_file_name());
        let open = |path: &Path| {
            layout::limits::refuse_pipe(path)
                .and_then(|()| File::open(path))
                .map_err(|e| io_error(path, e))
        };
        let images = open(&images_path)?;
        let image_header = read_header(&images, &images_path, IMAGES_MAGIC, "images")?;
        let labels_file = open(&labels_path)?;
        let label_header = read_header(&labels_file, &labels_path, LABELS_MAGIC, "labels")?;
        let (n_samples, rows, cols) = (
            image_header.dims[0],
            image_header.dims[1],
            image_header.dims[2],
        );
        if label_header.dims[0] != n_samples {
            return Err(data_error(
                &labels_path,
                format!(
                    "holds {} labels but {} holds {n_samples} images; the counts must match",
                    label_header.dims[0],
                    images_path.display()
                ),
            ));
        }
        // The file length has confirmed the count, so this allocation is as large as the file.
        let mut labels = vec![0u8; n_samples];
        labels_file
            .read_exact_at(&mut labels, label_header.data_offset)
            .map_err(|e| io_error(&labels_path, e))?;
        let mut dataset = IdxDataset {
            split,
            images_path,
            labels_path,
            images,
            data_offset: image_header.data_offset,
            n_samples,
            rows,
            cols,
            labels,
            pixel_max: 1.0,
            mean: 0.0,
            std: 1.0,
        };
        dataset.pixel_max = match pixel_max {
            Some(value) if value.is_finite() && value > 0.0 => value,
            Some(value) => {
                return Err(RuntimeError::Config {
                    key: "data.pixel_max".to_string(),
                    reason: format!("{value} is out of range: it must be finite and > 0"),
                })
            }
            None => f32::from(dataset.scan_max_pixel()?),
        };
        Ok(dataset)
    }

    /// Opens the training and test splits of `dir` normalised alike: divided by `pixel_max`, or
    /// by default the largest pixel of the **training** image file, and, when `normalize` is
    /// [`Normalize::Standardize`], standardised with the training split's mean and standard
    /// deviation (one more read of the training image file).
    pub fn open_train_and_test(
        dir: &Path,
        pixel_max: Option<f32>,
        normalize: Normalize,
    ) -> Result<(IdxDataset, IdxDataset), RuntimeError> {
        let mut train = IdxDataset::open(dir, Split::Train, pixel_max)?;
        let mut test = IdxDataset::open(dir, Split::Test, Some(train.pixel_max))?;
        if test.image_shape() != train.image_shape() {
            let [rows, cols] = train.image_shape();
            return Err(data_error(
                &test.images_path,
                format!(
                    "holds {}×{} images, but the training split {} holds {rows}×{cols}: the \
                     model is built for the training images, so every split must have their shape",
                    test.rows,
                    test.cols,
                    train.images_path.display()
                ),
            ));
        }
        if normalize == Normalize::Standardize {
            let (mean, std) = train.scaled_moments()?;
            for split in [&mut train, &mut test] {
                split.mean = mean;
                split.std = std;
            }
        }
        Ok((train, test))
    }

    /// Mean and standard deviation of the scaled pixels `p / pixel_max` of the whole image file
    /// (reads it once, in chunks).
    fn scaled_moments(&self) -> Result<(f32, f32), RuntimeError> {
        let total = (self.n_samples * self.rows * self.cols) as u64;
        let mut buffer = vec![0u8; SCAN_CHUNK];
        let (mut sum, mut sum_sq) = (0f64, 0f64);
        let mut done = 0u64;
        while done < total {
            let len = (total - done).min(SCAN_CHUNK as u64) as usize;
            let chunk = &mut buffer[..len];
            self.images
                .read_exact_at(chunk, self.data_offset + done)
                .map_err(|e| io_error(&self.images_path, e))?;
            for &b in chunk.iter() {
                let x = f64::from(b) / f64::from(self.pixel_max);
                sum += x;
                sum_sq += x * x;
            }
            done += len as u64;
        }
        let n = total.max(1) as f64;
        let mean = sum / n;
        let std = (sum_sq / n - mean * mean).max(0.0).sqrt();
        if std == 0.0 {
            return Err(data_error(
                &self.images_path,
                "every pixel has the same value, so the pixels cannot be standardised; set data.normalize = \"scale\"".to_string(),
            ));
        }
        Ok((mean as f32, std as f32))
    }

    /// The largest pixel value in the image file (reads the whole file once).
    fn scan_max_pixel(&self) -> Result<u8, RuntimeError> {
        let total = (self.n_samples * self.rows * self.cols) as u64;
        let mut buffer = vec![0u8; SCAN_CHUNK];
        let mut max = 0u8;
        let mut done = 0u64;
        while done < total && max < u8::MAX {
            let len = (total - done).min(SCAN_CHUNK as u64) as usize;
            let chunk = &mut buffer[..len];
            self.images
                .read_exact_at(chunk, self.data_offset + done)
                .map_err(|e| io_error(&self.images_path, e))?;
            max = max.max(chunk.iter().copied().max().unwrap_or(0));
            done += len as u64;
        }
        if max == 0 {
            return Err(data_error(
                &self.images_path,
                "every pixel is 0, so the largest pixel cannot normalise the images; set data.pixel_max".to_string(),
            ));
        }
        Ok(max)
    }

    /// The mean and standard deviation inputs are standardised with (0 and 1 when they are only
    /// scaled).
    pub fn standardization(&self) -> (f32, f32) {
        (self.mean, self.std)
    }

    /// The split.
    pub fn split(&self) -> Split {
        self.split
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.n_samples
    }

    /// Whether the split has no sample (never true for an opened data set).
    pub fn is_empty(&self) -> bool {
        self.n_samples == 0
    }

    /// `[rows, cols]` of one image.
    pub fn image_shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// The value pixels are divided by.
    pub fn pixel_max(&self) -> f32 {
        self.pixel_max
    }

    /// The image file.
    pub fn images_path(&self) -> &Path {
        &self.images_path
    }

    /// The label file.
    pub fn labels_path(&self) -> &Path {
        &self.labels_path
    }

    /// Every label, in sample order.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// Checks that every label is below `classes`; the error names the label file, the first
    /// offending sample and its label.
    pub fn validate_labels(&self, classes: usize) -> Result<(), RuntimeError> {
        match self.labels.iter().position(|&l| usize::from(l) >= classes) {
            None => Ok(()),
            Some(sample) => Err(data_error(
                &self.labels_path,
                format!(
                    "sample {sample} has label {}, but the model has {classes} classes (labels must be below model.classes)",
                    self.labels[sample]
                ),
            )),
        }
    }

    fn check_indices(&self, indices: &[usize]) -> Result<(), RuntimeError> {
        match indices.iter().find(|&&i| i >= self.n_samples) {
            None => Ok(()),
            Some(&index) => Err(data_error(
                &self.images_path,
                format!(
                    "sample index {index} is out of range: the split has {} samples",
                    self.n_samples
                ),
            )),
        }
    }

    /// The images of samples `indices`, in that order: an f32 tensor `[k, rows, cols]` of pixels
    /// divided by [`IdxDataset::pixel_max`] (then standardised, see [`Normalize`]). Reads only
    /// those samples, one positioned read per run of consecutive indices.
    pub fn read_images(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        self.check_indices(indices)?;
        let sample_bytes = self.rows * self.cols;
        let mut bytes = vec![0u8; indices.len() * sample_bytes];
        let mut first = 0;
        while first < indices.len() {
            let start = indices[first];
            let run = indices[first..]
                .iter()
                .enumerate()
                .take_while(|&(k, &index)| index == start + k)
                .count();
            let out = &mut bytes[first * sample_bytes..(first + run) * sample_bytes];
            let offset = self.data_offset + (start * sample_bytes) as u64;
            self.images
                .read_exact_at(out, offset)
                .map_err(|e| io_error(&self.images_path, e))?;
            first += run;
        }
        let pixels = bytes
            .iter()
            .map(|&b| (f32::from(b) / self.pixel_max - self.mean) / self.std)
            .collect();
        Ok(Tensor::from_vec(
            &[indices.len(), self.rows, self.cols],
            pixels,
        )?)
    }

    /// The labels of samples `indices`, in that order: an i32 tensor `[k]`.
    pub fn read_labels(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        self.check_indices(indices)?;
        let labels = indices.iter().map(|&i| i32::from(self.labels[i])).collect();
        Ok(Tensor::from_vec(&[indices.len()], labels)?)
    }
}
