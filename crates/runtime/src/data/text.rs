//! Token streams for language modelling: a UTF-8 text file (plain or gzip) tokenised by byte or
//! by character, or a flat binary file of `u16`/`u32` token ids (nanoGPT's `.bin` files).
//!
//! - [`TokenCorpus::open_text`] reads the whole text (bounded by [`MAX_TEXT_BYTES`]), tokenises
//!   it and splits it: the last `val_fraction` of the tokens is held out for validation.
//! - [`TokenCorpus::open_tokens`] indexes a token file without reading it; windows are read with
//!   positioned reads, so each rank reads only its own rows.
//! - [`TokenSplit::window_starts`]: the start of every row of a global batch, a pure function of
//!   the seed, the epoch and the step (the same on every rank and for every device count), and
//!   [`TokenSplit::read_rows`] the `seq_len + 1` tokens of some of those rows: inputs are the
//!   first `seq_len`, targets the last `seq_len`.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::RuntimeError;

/// The largest text (after decompression) read into memory: 2 GiB.
pub const MAX_TEXT_BYTES: u64 = 2 << 30;

/// How text becomes tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tokenizer {
    /// Every byte is a token (vocabulary 256).
    Byte,
    /// Every distinct character of the file is a token, in code-point order.
    Char {
        /// The characters, token id = index.
        alphabet: Vec<char>,
    },
}

impl Tokenizer {
    /// The vocabulary size.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Byte => 256,
            Tokenizer::Char { alphabet } => alphabet.len(),
        }
    }

    /// Token ids of `text` (characters outside a char alphabet are an error naming them).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Tokenizer::Byte => Ok(text.bytes().map(u32::from).collect()),
            Tokenizer::Char { alphabet } => text
                .chars()
                .map(|c| {
                    alphabet
                        .binary_search(&c)
                        .map(|i| i as u32)
                        .map_err(|_| format!("the character {c:?} is not in the vocabulary"))
                })
                .collect(),
        }
    }

    /// The text of `tokens` (bytes that are not UTF-8 are shown as U+FFFD).
    pub fn decode(&self, tokens: &[u32]) -> String {
        match self {
            Tokenizer::Byte => {
                let bytes: Vec<u8> = tokens.iter().map(|&t| t.min(255) as u8).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Tokenizer::Char { alphabet } => tokens
                .iter()
                .map(|&t| alphabet.get(t as usize).copied().unwrap_or('\u{FFFD}'))
                .collect(),
        }
    }
}

/// The element type of a token file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenDtype {
    /// Little-endian `u16`.
    U16,
    /// Little-endian `u32`.
    U32,
}

impl TokenDtype {
    /// Bytes per token.
    pub fn size(self) -> usize {
        match self {
            TokenDtype::U16 => 2,
            TokenDtype::U32 => 4,
        }
    }

    /// The id stored little-endian in `bytes` (`size()` of them).
    pub fn decode(self, bytes: &[u8]) -> u32 {
        match self {
            TokenDtype::U16 => u32::from(u16::from_le_bytes([bytes[0], bytes[1]])),
            TokenDtype::U32 => u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        }
    }

    /// `u16` or `u32`.
    pub fn parse(text: &str) -> Option<TokenDtype> {
        match text {
            "u16" => Some(TokenDtype::U16),
            "u32" => Some(TokenDtype::U32),
            _ => None,
        }
    }
}

/// Where a split's tokens live.
#[derive(Debug, Clone)]
enum Store {
    /// In memory.
    Memory(Arc<[u32]>),
    /// In a token file: `len` tokens from token `first`.
    File {
        path: PathBuf,
        file: Arc<File>,
        dtype: TokenDtype,
        first: u64,
    },
}

/// One split (training or validation) of a token stream.
#[derive(Debug, Clone)]
pub struct TokenSplit {
    /// The file the tokens come from (for messages).
    path: PathBuf,
    store: Store,
    len: u64,
    vocab_size: usize,
}

/// A token stream split into training and validation parts.
#[derive(Debug, Clone)]
pub struct TokenCorpus {
    /// The first `1 - val_fraction` of the tokens.
    pub train: TokenSplit,
    /// The rest.
    pub val: TokenSplit,
    /// How the text was tokenised (for token files: bytes, for decoding samples).
    pub tokenizer: Tokenizer,
}

fn data_error(path: &Path, reason: String) -> RuntimeError {
    RuntimeError::Data {
        path: path.to_path_buf(),
        reason,
    }
}

fn check_fraction(path: &Path, val_fraction: f64) -> Result<(), RuntimeError> {
    if !(0.0..1.0).contains(&val_fraction) {
        return Err(data_error(
            path,
            format!("data.val_fraction = {val_fraction} must be at least 0 and below 1"),
        ));
    }
    Ok(())
}

/// The number of training tokens of a stream of `n` with `val_fraction` held out.
fn train_len(n: u64, val_fraction: f64) -> u64 {
    n - ((n as f64 * val_fraction).round() as u64).min(n)
}

impl TokenCorpus {
    /// Reads the UTF-8 text file `path` (gzip when it ends in `.gz`), tokenised byte by byte
    /// (`char_tokens` false) or by distinct character.
    pub fn open_text(
        path: &Path,
        char_tokens: bool,
        val_fraction: f64,
    ) -> Result<TokenCorpus, RuntimeError> {
        check_fraction(path, val_fraction)?;
        let text = read_text(path)?;
        let tokenizer = if char_tokens {
            let mut alphabet: Vec<char> = text.chars().collect();
            alphabet.sort_unstable();
            alphabet.dedup();
            Tokenizer::Char { alphabet }
        } else {
            Tokenizer::Byte
        };
        let tokens = tokenizer
            .encode(&text)
            .map_err(|reason| data_error(path, reason))?;
        drop(text);
        let n = tokens.len() as u64;
        let cut = train_len(n, val_fraction) as usize;
        let vocab_size = tokenizer.vocab_size();
        let split = |part: &[u32]| TokenSplit {
            path: path.to_path_buf(),
            store: Store::Memory(part.into()),
            len: part.len() as u64,
            vocab_size,
        };
        Ok(TokenCorpus {
            train: split(&tokens[..cut]),
            val: split(&tokens[cut..]),
            tokenizer,
        })
    }

    /// Indexes the token file `path` of `dtype` ids below `vocab_size` (ids are checked as they
    /// are read). Without a `vocab_size`, the file is scanned once and the vocabulary is one
    /// more than its largest id.
    pub fn open_tokens(
        path: &Path,
        dtype: TokenDtype,
        vocab_size: Option<usize>,
        val_fraction: f64,
    ) -> Result<TokenCorpus, RuntimeError> {
        check_fraction(path, val_fraction)?;
        let file = layout::limits::refuse_pipe(path)
            .and_then(|()| File::open(path))
            .map_err(|e| RuntimeError::Io {
                path: path.to_path_buf(),
                source: e,
            })?;
        let metadata = file.metadata().map_err(|e| RuntimeError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        if !metadata.is_file() {
            return Err(data_error(
                path,
                "is not a regular file (a device, pipe or directory): a token file is read in \
                 place, window by window, so its length must be known"
                    .to_string(),
            ));
        }
        let bytes = metadata.len();
        if bytes % dtype.size() as u64 != 0 {
            return Err(data_error(
                path,
                format!(
                    "{bytes} bytes is not a whole number of {}-byte tokens (data.dtype)",
                    dtype.size()
                ),
            ));
        }
        let vocab_size = match vocab_size {
            Some(v) => v,
            None => largest_id(&file, path, dtype, bytes)? as usize + 1,
        };
        if vocab_size == 0 || (dtype == TokenDtype::U16 && vocab_size > 1 << 16) {
            return Err(data_error(
                path,
                format!("a vocabulary of {vocab_size} does not fit {dtype:?} token ids"),
            ));
        }
        let n = bytes / dtype.size() as u64;
        let cut = train_len(n, val_fraction);
        let file = Arc::new(file);
        let split = |first: u64, len: u64| TokenSplit {
            path: path.to_path_buf(),
            store: Store::File {
                path: path.to_path_buf(),
                file: file.clone(),
                dtype,
                first,
            },
            len,
            vocab_size,
        };
        Ok(TokenCorpus {
            train: split(0, cut),
            val: split(cut, n - cut),
            tokenizer: Tokenizer::Byte,
        })
    }
}

/// The largest id of the first `bytes` of the token file `file` (0 when empty), read in 1 MiB
/// chunks.
fn largest_id(
    file: &File,
    path: &Path,
    dtype: TokenDtype,
    bytes: u64,
) -> Result<u32, RuntimeError> {
    let size = dtype.size();
    let mut chunk = vec![0u8; (1 << 20) / size * size];
    let mut offset = 0u64;
    let mut largest = 0u32;
    loop {
        let want = (bytes - offset).min(chunk.len() as u64) as usize;
        let n = file
            .read_at(&mut chunk[..want], offset)
            .map_err(|e| RuntimeError::Io {
                path: path.to_path_buf(),
                source: e,
            })?;
        if n == 0 {
            return Ok(largest);
        }
        // A short read may end inside a token: keep only whole ones and re-read the rest.
        let whole = n / size * size;
        if whole == 0 {
            return Err(data_error(path, "the file ends inside a token".to_string()));
        }
        for b in chunk[..whole].chunks_exact(size) {
            largest = largest.max(dtype.decode(b));
        }
        offset += whole as u64;
    }
}

/// Reads a whole text file, decompressing `.gz`, refusing more than [`MAX_TEXT_BYTES`] and
/// anything that is not UTF-8.
fn read_text(path: &Path) -> Result<String, RuntimeError> {
    let io = |e| RuntimeError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let file = layout::limits::refuse_pipe(path)
        .and_then(|()| File::open(path))
        .map_err(io)?;
    let gz = path.extension().is_some_and(|e| e == "gz");
    let reader: Box<dyn Read> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut bytes = Vec::new();
    reader
        .take(MAX_TEXT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| {
            if gz {
                data_error(path, format!("not a valid gzip stream ({e})"))
            } else {
                io(e)
            }
        })?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        return Err(data_error(
            path,
            format!("the text is larger than the {MAX_TEXT_BYTES}-byte limit"),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        data_error(
            path,
            format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

impl TokenSplit {
    /// Number of tokens.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the split holds no token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The first token of every row of global batch `step` of `epoch`: `batch` windows of
    /// `seq_len + 1` tokens at uniformly random starts, a pure function of `seed`, `epoch` and
    /// `step`. Fails when the split is shorter than one window.
    pub fn window_starts(
        &self,
        seed: u64,
        epoch: u64,
        step: u64,
        batch: usize,
        seq_len: usize,
    ) -> Result<Vec<u64>, String> {
        self.window_starts_of_rows(seed, epoch, step, 0..batch as u64, seq_len)
    }

    /// Rows `rows` of [`TokenSplit::window_starts`]: row `r`'s start depends on `seed`,
    /// `epoch`, `step` and `r` only, never on the batch size, so rows `j·b .. (j+1)·b` of a
    /// batch of `K·b` are micro-batch `j` of a gradient-accumulation step.
    pub fn window_starts_of_rows(
        &self,
        seed: u64,
        epoch: u64,
        step: u64,
        rows: std::ops::Range<u64>,
        seq_len: usize,
    ) -> Result<Vec<u64>, String> {
        let window = seq_len as u64 + 1;
        if self.len < window {
            return Err(format!(
                "the split holds {} tokens, fewer than one window of seq_len + 1 = {window}",
                self.len
            ));
        }
        let choices = self.len - window + 1;
        let key = graph::rng::stream_key(seed, &format!("text-windows/{epoch}/{step}"));
        Ok(rows
            .map(|row| {
                // Multiply-shift maps 64 random bits onto [0, choices) without a modulo bias
                // worth the name (choices is far below 2^64).
                let bits = graph::rng::bits_at(key, row);
                ((u128::from(bits) * u128::from(choices)) >> 64) as u64
            })
            .collect())
    }

    /// Reads the windows starting at `starts` (each `seq_len + 1` tokens): the inputs (the
    /// first `seq_len` tokens of each) and the targets (the last `seq_len`), row-major.
    pub fn read_rows(
        &self,
        starts: &[u64],
        seq_len: usize,
    ) -> Result<(Vec<u32>, Vec<u32>), RuntimeError> {
        let window = seq_len + 1;
        let mut inputs = Vec::with_capacity(starts.len() * seq_len);
        let mut targets = Vec::with_capacity(starts.len() * seq_len);
        let mut buf = vec![0u32; window];
        for &start in starts {
            self.read_window(start, &mut buf)?;
            inputs.extend_from_slice(&buf[..seq_len]);
            targets.extend_from_slice(&buf[1..]);
        }
        Ok((inputs, targets))
    }

    fn read_window(&self, start: u64, out: &mut [u32]) -> Result<(), RuntimeError> {
        let end = start
            .checked_add(out.len() as u64)
            .filter(|&e| e <= self.len);
        match (&self.store, end) {
            (_, None) => Err(data_error(
                &self.path,
                format!(
                    "a window of {} tokens at {start} runs past the split's {} tokens",
                    out.len(),
                    self.len
                ),
            )),
            (Store::Memory(tokens), Some(end)) => {
                out.copy_from_slice(&tokens[start as usize..end as usize]);
                Ok(())
            }
            (
                Store::File {
                    path,
                    file,
                    dtype,
                    first,
                },
                Some(_),
            ) => {
                let size = dtype.size();
                let mut bytes = vec![0u8; out.len() * size];
                file.read_exact_at(&mut bytes, (first + start) * size as u64)
                    .map_err(|e| RuntimeError::Io {
                        path: path.clone(),
                        source: e,
                    })?;
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(size)) {
                    *o = dtype.decode(b);
                    if *o as usize >= self.vocab_size {
                        return Err(data_error(
                            path,
                            format!(
                                "token id {} is outside the vocabulary of {}",
                                *o, self.vocab_size
                            ),
                        ));
                    }
                }
                Ok(())
            }
        }
    }
}
