//! Token streams for language modelling: a UTF-8 text file (plain or gzip) tokenised by byte or
//! by character, or a flat binary file of `u16`/`u32` token ids (nanoGPT's `.bin` files).
//!
//! - [`TokenCorpus::open_text`] reads the whole text (bounded by [`MAX_TEXT_BYTES`], and by the
//!   memory available: a text and its tokens take 5 bytes per byte of text, checked before a
//!   plain file is read and while a gzip file is decompressed, so a gzip bomb stops with an
//!   error), tokenises it and splits it: the last `val_fraction` of the tokens is held out for
//!   validation.
//! - [`TokenCorpus::open_tokens`] scans a token file once (every id must be below the
//!   vocabulary) without keeping it; windows are read with positioned reads, so each rank reads
//!   only its own rows.
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
use crate::host_memory::{host_memory, HostMemory};

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
    /// In memory: `len` tokens of the whole stream from token `first` (both splits share one
    /// buffer, so the tokens are held once).
    Memory { tokens: Arc<Vec<u32>>, first: usize },
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
    ///
    /// The text and its tokens must fit the memory available ([`crate::host_memory`]): 5 bytes
    /// per byte of text (the text, then a 4-byte token per byte at most). A plain file is
    /// checked before it is read; a gzip file while it is decompressed, so a gzip bomb stops
    /// with an error naming the file and both figures. A device (`/dev/zero`) is refused.
    pub fn open_text(
        path: &Path,
        char_tokens: bool,
        val_fraction: f64,
    ) -> Result<TokenCorpus, RuntimeError> {
        check_fraction(path, val_fraction)?;
        let memory = host_memory();
        let text = read_text(path, memory)?;
        let tokenizer = if char_tokens {
            Tokenizer::Char {
                alphabet: distinct_chars(&text),
            }
        } else {
            Tokenizer::Byte
        };
        let tokens = encode_text(&tokenizer, &text, path)?;
        drop(text);
        let n = tokens.len() as u64;
        let cut = train_len(n, val_fraction);
        let vocab_size = tokenizer.vocab_size();
        let tokens = Arc::new(tokens);
        let split = |first: u64, len: u64| TokenSplit {
            path: path.to_path_buf(),
            store: Store::Memory {
                tokens: tokens.clone(),
                first: first as usize,
            },
            len,
            vocab_size,
        };
        Ok(TokenCorpus {
            train: split(0, cut),
            val: split(cut, n - cut),
            tokenizer,
        })
    }

    /// Indexes the token file `path` of `dtype` ids below `vocab_size`. The file is scanned once
    /// here: with a `vocab_size`, an id at or above it is an error naming the file, the token
    /// and its byte offset (found before training, not when a window happens to hold it);
    /// without one, the vocabulary is one more than the largest id. A file of 32-bit ids read
    /// as `U16` (every other id small, the high halves) is an error naming `data.dtype`; so is a
    /// text or gzip file (its first bytes show it) given as tokens.
    /// Windows are checked again as they are read.
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
        if let Some(what) = not_a_token_file(&file, path)? {
            return Err(data_error(
                path,
                format!(
                    "{what}: data.format = \"tokens\" reads a flat file of little-endian token ids \
                     (nanoGPT's .bin); for a text, plain or gzip, set data.format = \"text\""
                ),
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
        let fits = |v: usize| v != 0 && !(dtype == TokenDtype::U16 && v > 1 << 16);
        if let Some(v) = vocab_size.filter(|&v| !fits(v)) {
            return Err(data_error(
                path,
                format!("a vocabulary of {v} does not fit {dtype:?} token ids"),
            ));
        }
        let largest_by_parity = scan_ids(&file, path, dtype, bytes, vocab_size)?;
        let n = bytes / dtype.size() as u64;
        if dtype == TokenDtype::U16 && looks_like_u32_ids(largest_by_parity, n) {
            return Err(data_error(
                path,
                format!(
                    "every token at an odd position is below {WIDE_HIGH_HALF} while the ids at even \
                     positions reach {}: these look like 32-bit ids (whose high halves are small) \
                     read as 16-bit ones; set data.dtype = \"u32\" for a file of 32-bit ids",
                    largest_by_parity[0]
                ),
            ));
        }
        let largest = largest_by_parity[0].max(largest_by_parity[1]);
        let vocab_size = vocab_size.unwrap_or(largest as usize + 1);
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

/// Bytes at the start of a token file looked at by [`not_a_token_file`].
const SNIFFED_BYTES: usize = 64 << 10;

/// What the token file `file` is instead, when its start shows it is no token file: a gzip
/// stream (its magic and deflate method, `1f 8b 08`), or text (64 bytes or more, all printable
/// ASCII or whitespace: as 16-bit ids every one would be at least 0x2020 and no id would hold
/// a byte below 0x20, which no token stream of that length does; 32-bit ids hold zero bytes).
fn not_a_token_file(file: &File, path: &Path) -> Result<Option<String>, RuntimeError> {
    let mut head = vec![0u8; SNIFFED_BYTES];
    let mut n = 0;
    while n < head.len() {
        match file.read_at(&mut head[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(RuntimeError::Io {
                    path: path.to_path_buf(),
                    source: e,
                })
            }
        }
    }
    let head = &head[..n];
    if head.starts_with(&[0x1f, 0x8b, 0x08]) {
        return Ok(Some(
            "is a gzip file (it starts with gzip's magic bytes)".to_string(),
        ));
    }
    let texty = |b: &u8| matches!(b, 0x20..=0x7e | b'\t' | b'\n' | b'\r');
    if head.len() >= 64 && head.iter().all(texty) {
        return Ok(Some(format!(
            "looks like text (its first {} bytes are all printable ASCII)",
            head.len()
        )));
    }
    Ok(None)
}

/// Below this, every odd-position id of a 16-bit reading is taken for the high half of a
/// 32-bit id ([`looks_like_u32_ids`]).
const WIDE_HIGH_HALF: u32 = 16;

/// Whether a file read as `n` 16-bit ids whose largest ids at even and odd positions are
/// `largest_by_parity` is more likely a file of 32-bit ids: their high halves (the odd
/// positions) are all small (below [`WIDE_HIGH_HALF`]: vocabularies up to 2^20) while the low
/// halves spread wide. Real 16-bit token streams of 64 tokens or more never keep every other
/// token among 16 ids while the rest reach 256 or more.
fn looks_like_u32_ids(largest_by_parity: [u32; 2], n: u64) -> bool {
    n >= 64 && largest_by_parity[1] < WIDE_HIGH_HALF && largest_by_parity[0] >= 256
}

/// The largest id at even and at odd token positions of the first `bytes` of the token file
/// `file` (0 when empty), read in 1 MiB chunks; with a `vocab_size`, the first id at or above
/// it is an error naming the token.
fn scan_ids(
    file: &File,
    path: &Path,
    dtype: TokenDtype,
    bytes: u64,
    vocab_size: Option<usize>,
) -> Result<[u32; 2], RuntimeError> {
    let size = dtype.size();
    let mut chunk = vec![0u8; (1 << 20) / size * size];
    let mut offset = 0u64;
    let mut largest = [0u32; 2];
    loop {
        let want = (bytes - offset).min(chunk.len() as u64) as usize;
        let n = file
            .read_at(&mut chunk[..want], offset)
            .map_err(|e| RuntimeError::Io {
                path: path.to_path_buf(),
                source: e,
            })?;
        if n == 0 {
            if offset < bytes {
                return Err(data_error(
                    path,
                    format!("the file ended at byte {offset}, but it was {bytes} bytes long when opened (changed while read?)"),
                ));
            }
            return Ok(largest);
        }
        // A short read may end inside a token: keep only whole ones and re-read the rest.
        let whole = n / size * size;
        if whole == 0 {
            return Err(data_error(path, "the file ends inside a token".to_string()));
        }
        for (k, b) in chunk[..whole].chunks_exact(size).enumerate() {
            let id = dtype.decode(b);
            if vocab_size.is_some_and(|v| id as usize >= v) {
                let at = offset + (k * size) as u64;
                return Err(data_error(
                    path,
                    format!(
                        "token {} (byte offset {at}) has id {id}, outside the vocabulary of {} (data.vocab_size): every id must be below it",
                        at / size as u64,
                        vocab_size.unwrap_or(0)
                    ),
                ));
            }
            let parity = (offset / size as u64 + k as u64) % 2;
            largest[parity as usize] = largest[parity as usize].max(id);
        }
        offset += whole as u64;
    }
}

/// Bytes of memory a text of `text_bytes` bytes takes at its peak while it is tokenised: the
/// text, and a 4-byte token per byte at most.
fn text_peak(text_bytes: u64) -> u64 {
    text_bytes.saturating_mul(5)
}

/// The error for a text of at least `text_bytes` bytes (`what` says how many) whose tokens
/// would not fit `memory`.
fn too_big_for_memory(
    path: &Path,
    what: String,
    text_bytes: u64,
    memory: HostMemory,
) -> RuntimeError {
    data_error(
        path,
        format!(
            "{what}: the text and its tokens would take {} bytes or more (5 per byte of text), more than the {} bytes available ({})",
            text_peak(text_bytes),
            memory.available,
            memory.source
        ),
    )
}

/// Reads a whole text file, decompressing `.gz`, refusing devices, more than
/// [`MAX_TEXT_BYTES`], more than `memory` can tokenise (see [`TokenCorpus::open_text`]) and
/// anything that is not UTF-8.
fn read_text(path: &Path, memory: Option<HostMemory>) -> Result<String, RuntimeError> {
    let io = |e| RuntimeError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    layout::limits::refuse_pipe(path).map_err(io)?;
    let file = File::open(path).map_err(io)?;
    let metadata = file.metadata().map_err(io)?;
    let held = ["/dev/fd/", "/proc/self/fd/", "/dev/stdin"]
        .iter()
        .any(|prefix| path.starts_with(prefix));
    {
        use std::os::unix::fs::FileTypeExt;
        let kind = metadata.file_type();
        if !held && (kind.is_char_device() || kind.is_block_device()) {
            return Err(data_error(
                path,
                "is a device, not a text file: a text is read whole, and a device may never end"
                    .to_string(),
            ));
        }
    }
    let gz = path.extension().is_some_and(|e| e == "gz");
    let mut bytes: Vec<u8> = Vec::new();
    if !gz && metadata.is_file() {
        let len = metadata.len();
        if len > MAX_TEXT_BYTES {
            return Err(data_error(
                path,
                format!("{len} bytes: the text is larger than the {MAX_TEXT_BYTES}-byte limit"),
            ));
        }
        if let Some(memory) = memory.filter(|m| text_peak(len) > m.available) {
            return Err(too_big_for_memory(
                path,
                format!("{len} bytes"),
                len,
                memory,
            ));
        }
        bytes.try_reserve_exact(len as usize + 1).map_err(|_| {
            data_error(
                path,
                format!("cannot allocate {len} bytes to hold the text"),
            )
        })?;
    }
    let mut reader: Box<dyn Read> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if gz => {
                return Err(data_error(
                    path,
                    format!(
                        "not a valid gzip stream ({e}) after {} bytes of text",
                        bytes.len()
                    ),
                ))
            }
            Err(e) => return Err(io(e)),
        };
        let total = bytes.len() as u64 + n as u64;
        if total > MAX_TEXT_BYTES {
            return Err(data_error(
                path,
                format!(
                    "the text is larger than the {MAX_TEXT_BYTES}-byte limit{}",
                    if gz { " (decompressed)" } else { "" }
                ),
            ));
        }
        if bytes.capacity() < total as usize {
            if let Some(memory) = memory.filter(|m| text_peak(total) > m.available) {
                let what = if gz {
                    format!("decompressed, the text passes {total} bytes")
                } else {
                    format!("the text passes {total} bytes")
                };
                return Err(too_big_for_memory(path, what, total, memory));
            }
            // Grow by doubling, never past a fifth of the memory (the text beside its tokens):
            // capacity and tokens together then stay within what is available.
            let mut want = (bytes.capacity() as u64)
                .max(1 << 20)
                .saturating_mul(2)
                .min(MAX_TEXT_BYTES + 1);
            if let Some(memory) = memory {
                want = want.min(memory.available / 5);
            }
            let extra = (want.max(total) as usize).saturating_sub(bytes.len());
            bytes.try_reserve_exact(extra).map_err(|_| {
                data_error(
                    path,
                    format!("cannot allocate memory for more than {total} bytes of text"),
                )
            })?;
        }
        bytes.extend_from_slice(&chunk[..n]);
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

/// The distinct characters of `text`, in code-point order (a bit per code point: 136 KiB
/// whatever the text's length, where collecting the characters took 4 bytes per character).
fn distinct_chars(text: &str) -> Vec<char> {
    let mut seen = vec![0u64; (char::MAX as usize + 1).div_ceil(64)];
    for c in text.chars() {
        seen[c as usize / 64] |= 1 << (c as usize % 64);
    }
    (0..=char::MAX as u32)
        .filter(|&c| seen[c as usize / 64] & (1 << (c % 64)) != 0)
        .filter_map(char::from_u32)
        .collect()
}

/// The tokens of `text` (the text of `path`), allocated with a fallible reservation: a text
/// whose tokens cannot be allocated is an error, not an abort.
fn encode_text(tokenizer: &Tokenizer, text: &str, path: &Path) -> Result<Vec<u32>, RuntimeError> {
    let count = match tokenizer {
        Tokenizer::Byte => text.len(),
        Tokenizer::Char { .. } => text.chars().count(),
    };
    let mut tokens: Vec<u32> = Vec::new();
    tokens.try_reserve_exact(count).map_err(|_| {
        data_error(
            path,
            format!(
                "cannot allocate the {count} tokens of the text ({} bytes)",
                count as u64 * 4
            ),
        )
    })?;
    match tokenizer {
        Tokenizer::Byte => tokens.extend(text.bytes().map(u32::from)),
        Tokenizer::Char { alphabet } => {
            for c in text.chars() {
                let id = alphabet.binary_search(&c).map_err(|_| {
                    data_error(
                        path,
                        format!("the character {c:?} is not in the vocabulary"),
                    )
                })?;
                tokens.push(id as u32);
            }
        }
    }
    Ok(tokens)
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
            (Store::Memory { tokens, first }, Some(end)) => {
                out.copy_from_slice(&tokens[first + start as usize..first + end as usize]);
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn memory(available: u64) -> Option<HostMemory> {
        Some(HostMemory {
            available,
            source: "MemAvailable",
        })
    }

    /// A gzip bomb (64 MiB of text from 64 KiB) stops once the decompressed text passes what
    /// its tokens could take from the memory, naming the file and the figures; the whole text
    /// used to be decompressed (up to 2 GiB) and then tokenised (4 bytes per byte) regardless.
    #[test]
    fn a_gzip_bomb_stops_at_the_memory_its_tokens_would_need() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bomb.txt.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        for _ in 0..64 {
            enc.write_all(&[b'a'; 1 << 20]).unwrap();
        }
        std::fs::write(&path, enc.finish().unwrap()).unwrap();
        let err = read_text(&path, memory(40 << 20)).unwrap_err().to_string();
        assert!(
            err.contains("bomb.txt.gz")
                && err.contains("decompressed, the text passes")
                && err.contains(&format!("{} bytes available (MemAvailable)", 40u64 << 20)),
            "{err}"
        );
        assert_eq!(read_text(&path, memory(1 << 30)).unwrap().len(), 64 << 20);
    }

    /// A plain file whose text and tokens would not fit is refused before it is read.
    #[test]
    fn a_plain_text_too_large_for_the_memory_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.txt");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(100 << 20)
            .unwrap();
        let err = read_text(&path, memory(400 << 20)).unwrap_err().to_string();
        assert!(
            err.contains("big.txt")
                && err.contains(&format!(
                    "{} bytes: the text and its tokens would take {}",
                    100u64 << 20,
                    500u64 << 20
                )),
            "{err}"
        );
    }

    #[test]
    fn distinct_chars_are_sorted_and_unique() {
        assert_eq!(
            distinct_chars("hé\u{10FFFF}lloh\0"),
            vec!['\0', 'h', 'l', 'o', 'é', '\u{10FFFF}']
        );
    }
}
