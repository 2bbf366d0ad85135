//! MindSpore's encrypted `.ckpt` files: `save_checkpoint(enc_key=…, enc_mode=…)` writes them,
//! `load_checkpoint(dec_key=…, dec_mode=…)` (and every function built on it:
//! `load_distributed_checkpoint`, `load_segmented_checkpoints`) reads them.
//!
//! # Format
//! As MindSpore 2.x writes it (`mindspore/core/utils/crypto.cc`: `Encrypt`, `BlockEncrypt`;
//! `train/serialization.py`: `_exec_save`). The plain `.ckpt` byte stream (the protobuf
//! values) is cut into blocks of at most 64 MiB, each encrypted on its own with a fresh random
//! 16-byte IV; the file is the concatenation of the blocks:
//! ```text
//! u32 LE  magic        0x7F3A5ED8 AES-GCM, 0x7F3A5ED9 AES-CBC, 0x7F3A5EDA SM4-CBC
//! 16 B    tag          AES-GCM only: the GCM authentication tag
//! i32 LE  block_len    bytes that follow in this block = 4 + 16 + 4 + cipher_len
//! i32 LE  iv_len       always 16
//! 16 B    iv           AES-GCM: only its first 12 bytes are the nonce (below)
//! i32 LE  cipher_len
//! cipher_len B         AES-GCM: the ciphertext (no associated data);
//!                      AES-CBC / SM4-CBC: the PKCS#7-padded ciphertext
//! ```
//! Keys are 16, 24 or 32 bytes for AES (AES-128/192/256) and 16 bytes for SM4.
//!
//! AES-GCM nonce: MindSpore's source asks OpenSSL for a 16-byte GCM IV, but the files the
//! MindSpore 2.10 wheel writes (and the only ones it reads) use the first 12 bytes of the
//! stored IV as the nonce (checked against the real wheel: `scripts/mindspore-diff.py`, and
//! the unit test `files_from_mindspore_2_10`). Tessera writes that; when reading, a block
//! whose tag fails with the 12-byte nonce is tried once more with all 16 bytes, the nonce
//! earlier Tessera versions wrote.
//!
//! MindSpore writes its `crc_num` trailer (when `crc_check=True`) after the encrypted blocks,
//! in clear, with a CRC of 0 (nothing is added to the CRC on the encrypted path); its own
//! reader then fails on that trailer. Tessera's reader accepts and ignores such a trailer.
//!
//! # Reading
//! [`decrypt_file`] decrypts a whole file block by block into an anonymous in-memory file
//! (`memfd`), which [`crate::CheckpointFile`] then indexes and reads like any `.ckpt`
//! (MindSpore likewise holds the decrypted stream in memory). A wrong key, a wrong mode or
//! tampered data is an error naming the file and the block.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::path::Path;

use aes::{Aes128, Aes192, Aes256};
use aes_gcm::aead::consts::{U12, U16};
use aes_gcm::aead::generic_array::GenericArray;
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::AesGcm;
use cbc::cipher::block_padding::Pkcs7;
use cbc::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use sm4::Sm4;

use crate::error::{io_err, CkptError, Result};
use crate::io::atomic_write::write_file;

/// Largest plaintext block MindSpore encrypts at once (`ENCRYPT_BLOCK_SIZE`, 64 MiB).
pub const MAX_BLOCK_BYTES: usize = 64 << 20;
/// Bytes of the IV of every block.
const IV_BYTES: usize = 16;
/// Bytes of the GCM tag.
const TAG_BYTES: usize = 16;

/// A cipher MindSpore encrypts checkpoints with (`enc_mode` / `dec_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CipherMode {
    /// `"AES-GCM"` (MindSpore's default).
    AesGcm,
    /// `"AES-CBC"`.
    AesCbc,
    /// `"SM4-CBC"`.
    Sm4Cbc,
}

impl CipherMode {
    /// MindSpore's name for the mode.
    pub fn name(self) -> &'static str {
        match self {
            CipherMode::AesGcm => "AES-GCM",
            CipherMode::AesCbc => "AES-CBC",
            CipherMode::Sm4Cbc => "SM4-CBC",
        }
    }

    /// The magic number that starts every block of this mode.
    pub fn magic(self) -> u32 {
        match self {
            CipherMode::AesGcm => 0x7F3A_5ED8,
            CipherMode::AesCbc => 0x7F3A_5ED9,
            CipherMode::Sm4Cbc => 0x7F3A_5EDA,
        }
    }

    /// The mode whose blocks start with `magic`.
    pub fn from_magic(magic: u32) -> Option<CipherMode> {
        [CipherMode::AesGcm, CipherMode::AesCbc, CipherMode::Sm4Cbc]
            .into_iter()
            .find(|m| m.magic() == magic)
    }

    /// The key lengths the mode accepts.
    pub fn key_lengths(self) -> &'static [usize] {
        match self {
            CipherMode::AesGcm | CipherMode::AesCbc => &[16, 24, 32],
            CipherMode::Sm4Cbc => &[16],
        }
    }
}

impl std::fmt::Display for CipherMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CipherMode {
    type Err = CkptError;
    fn from_str(s: &str) -> Result<CipherMode> {
        match s {
            "AES-GCM" => Ok(CipherMode::AesGcm),
            "AES-CBC" => Ok(CipherMode::AesCbc),
            "SM4-CBC" => Ok(CipherMode::Sm4Cbc),
            other => Err(CkptError::InvalidOption {
                option: "dec_mode",
                rule: format!("{other:?} is not supported: use 'AES-GCM', 'AES-CBC' or 'SM4-CBC'"),
            }),
        }
    }
}

/// A key and mode to read encrypted `.ckpt` files with.
#[derive(Clone, PartialEq, Eq)]
pub struct Decryption {
    /// The key (`dec_key`).
    pub key: Vec<u8>,
    /// The mode (`dec_mode`).
    pub mode: CipherMode,
}

impl std::fmt::Debug for Decryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("Decryption")
            .field("key", &format_args!("<{} bytes>", self.key.len()))
            .field("mode", &self.mode)
            .finish()
    }
}

impl Decryption {
    /// A key and mode, the key length checked against the mode.
    pub fn new(key: &[u8], mode: CipherMode) -> Result<Decryption> {
        key_problem(key, mode).map_or(Ok(()), |rule| {
            Err(CkptError::InvalidOption {
                option: "dec_key",
                rule,
            })
        })?;
        Ok(Decryption {
            key: key.to_vec(),
            mode,
        })
    }
}

/// Why `key` cannot be a key of `mode`, if it cannot.
fn key_problem(key: &[u8], mode: CipherMode) -> Option<String> {
    if mode.key_lengths().contains(&key.len()) {
        return None;
    }
    let lengths: Vec<String> = mode.key_lengths().iter().map(|n| n.to_string()).collect();
    Some(format!(
        "{mode} keys are {} bytes long, but the key has {} bytes",
        lengths.join(", "),
        key.len()
    ))
}

fn check_key(path: &Path, key: &[u8], mode: CipherMode) -> Result<()> {
    key_problem(key, mode).map_or(Ok(()), |reason| {
        Err(CkptError::Decrypt {
            path: path.to_path_buf(),
            reason,
        })
    })
}

/// Whether a file starting with `head` is an encrypted MindSpore file, and in which mode.
pub fn encrypted_mode(head: &[u8]) -> Option<CipherMode> {
    let magic = u32::from_le_bytes(head.get(..4)?.try_into().ok()?);
    CipherMode::from_magic(magic)
}

/// AES-GCM with a 12-byte nonce: what MindSpore 2.10 writes and reads (the IV's first 12 bytes).
type GcmNonce12<C> = AesGcm<C, U12>;
/// AES-GCM with the whole 16-byte IV as nonce: what Tessera wrote before (read only).
type GcmNonce16<C> = AesGcm<C, U16>;
/// Bytes of the GCM nonce MindSpore 2.10 uses (a prefix of the stored 16-byte IV).
const GCM_NONCE_BYTES: usize = 12;

fn gcm_seal<C>(key: &[u8], iv: &[u8], buf: &mut [u8]) -> [u8; TAG_BYTES]
where
    GcmNonce12<C>: KeyInit + AeadInPlace,
{
    let cipher = GcmNonce12::<C>::new_from_slice(key).expect("key length checked");
    let tag = cipher
        .encrypt_in_place_detached(GenericArray::from_slice(&iv[..GCM_NONCE_BYTES]), b"", buf)
        .expect("a block under 64 GiB");
    let mut out = [0u8; TAG_BYTES];
    out.copy_from_slice(tag.as_slice());
    out
}

/// Opens a GCM block with the 12-byte nonce MindSpore 2.10 uses, else with the whole
/// 16-byte IV (files earlier Tessera versions wrote); the tag decides which is right.
fn gcm_open<C>(key: &[u8], iv: &[u8], buf: &mut [u8], tag: &[u8]) -> bool
where
    GcmNonce12<C>: KeyInit + AeadInPlace,
    GcmNonce16<C>: KeyInit + AeadInPlace,
{
    // A tag that does not match leaves `buf` as it was (the tag is checked before the keystream
    // is applied), so the second nonce is tried on the same bytes.
    let ms = GcmNonce12::<C>::new_from_slice(key).expect("key length checked");
    let nonce = GenericArray::from_slice(&iv[..GCM_NONCE_BYTES]);
    if ms
        .decrypt_in_place_detached(nonce, b"", buf, GenericArray::from_slice(tag))
        .is_ok()
    {
        return true;
    }
    GcmNonce16::<C>::new_from_slice(key)
        .expect("key length checked")
        .decrypt_in_place_detached(
            GenericArray::from_slice(iv),
            b"",
            buf,
            GenericArray::from_slice(tag),
        )
        .is_ok()
}

fn cbc_seal<C>(key: &[u8], iv: &[u8], plain: &[u8]) -> Vec<u8>
where
    cbc::Encryptor<C>: KeyIvInit + BlockEncryptMut,
    C: cbc::cipher::BlockEncryptMut + cbc::cipher::BlockCipher,
{
    cbc::Encryptor::<C>::new_from_slices(key, iv)
        .expect("key and IV lengths checked")
        .encrypt_padded_vec_mut::<Pkcs7>(plain)
}

fn cbc_open<C>(key: &[u8], iv: &[u8], cipher: &[u8]) -> Option<Vec<u8>>
where
    cbc::Decryptor<C>: KeyIvInit + BlockDecryptMut,
    C: cbc::cipher::BlockDecryptMut + cbc::cipher::BlockCipher,
{
    cbc::Decryptor::<C>::new_from_slices(key, iv)
        .expect("key and IV lengths checked")
        .decrypt_padded_vec_mut::<Pkcs7>(cipher)
        .ok()
}

/// Encrypts one block; returns the GCM tag (if any) and the ciphertext.
fn seal_block(
    key: &[u8],
    mode: CipherMode,
    iv: &[u8; IV_BYTES],
    plain: &[u8],
) -> (Option<[u8; TAG_BYTES]>, Vec<u8>) {
    match mode {
        CipherMode::AesGcm => {
            let mut buf = plain.to_vec();
            let tag = match key.len() {
                16 => gcm_seal::<Aes128>(key, iv, &mut buf),
                24 => gcm_seal::<Aes192>(key, iv, &mut buf),
                _ => gcm_seal::<Aes256>(key, iv, &mut buf),
            };
            (Some(tag), buf)
        }
        CipherMode::AesCbc => (
            None,
            match key.len() {
                16 => cbc_seal::<Aes128>(key, iv, plain),
                24 => cbc_seal::<Aes192>(key, iv, plain),
                _ => cbc_seal::<Aes256>(key, iv, plain),
            },
        ),
        CipherMode::Sm4Cbc => (None, cbc_seal::<Sm4>(key, iv, plain)),
    }
}

/// Decrypts one block's ciphertext; `None` when the key, mode or data is wrong.
fn open_block(
    key: &[u8],
    mode: CipherMode,
    iv: &[u8],
    tag: Option<&[u8]>,
    cipher: &[u8],
) -> Option<Vec<u8>> {
    match mode {
        CipherMode::AesGcm => {
            let tag = tag?;
            let mut buf = cipher.to_vec();
            let ok = match key.len() {
                16 => gcm_open::<Aes128>(key, iv, &mut buf, tag),
                24 => gcm_open::<Aes192>(key, iv, &mut buf, tag),
                _ => gcm_open::<Aes256>(key, iv, &mut buf, tag),
            };
            ok.then_some(buf)
        }
        CipherMode::AesCbc => match key.len() {
            16 => cbc_open::<Aes128>(key, iv, cipher),
            24 => cbc_open::<Aes192>(key, iv, cipher),
            _ => cbc_open::<Aes256>(key, iv, cipher),
        },
        CipherMode::Sm4Cbc => cbc_open::<Sm4>(key, iv, cipher),
    }
}

/// A fresh random IV from the operating system.
fn random_iv() -> Result<[u8; IV_BYTES]> {
    let mut iv = [0u8; IV_BYTES];
    let mut filled = 0;
    while filled < IV_BYTES {
        // SAFETY: the pointer and length describe the unfilled tail of `iv`.
        let n = unsafe { libc::getrandom(iv[filled..].as_mut_ptr().cast(), IV_BYTES - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(CkptError::Io {
                path: "getrandom".into(),
                op: "draw a random IV",
                source: e,
            });
        }
        filled += n as usize;
    }
    Ok(iv)
}

/// Encrypts a plain `.ckpt` byte stream as MindSpore's `save_checkpoint(enc_key, enc_mode)`
/// does: blocks of at most `block_bytes` (MindSpore: [`MAX_BLOCK_BYTES`]), each with a fresh
/// random IV.
pub fn encrypt(plain: &[u8], key: &[u8], mode: CipherMode, block_bytes: usize) -> Result<Vec<u8>> {
    encrypt_with_ivs(plain, key, mode, block_bytes, random_iv)
}

/// [`encrypt`] with the IVs drawn from `next_iv` (fixed IVs make test vectors reproducible;
/// never reuse an IV with a real key).
pub fn encrypt_with_ivs(
    plain: &[u8],
    key: &[u8],
    mode: CipherMode,
    block_bytes: usize,
    mut next_iv: impl FnMut() -> Result<[u8; IV_BYTES]>,
) -> Result<Vec<u8>> {
    if let Some(rule) = key_problem(key, mode) {
        return Err(CkptError::InvalidOption {
            option: "enc_key",
            rule,
        });
    }
    let block_bytes = block_bytes.clamp(1, MAX_BLOCK_BYTES);
    let mut out = Vec::with_capacity(plain.len() + plain.len() / block_bytes * 64 + 64);
    for block in plain.chunks(block_bytes) {
        let iv = next_iv()?;
        let (tag, cipher) = seal_block(key, mode, &iv, block);
        out.extend_from_slice(&mode.magic().to_le_bytes());
        if let Some(tag) = tag {
            out.extend_from_slice(&tag);
        }
        let block_len = 4 + IV_BYTES + 4 + cipher.len();
        out.extend_from_slice(&(block_len as i32).to_le_bytes());
        out.extend_from_slice(&(IV_BYTES as i32).to_le_bytes());
        out.extend_from_slice(&iv);
        out.extend_from_slice(&(cipher.len() as i32).to_le_bytes());
        out.extend_from_slice(&cipher);
    }
    Ok(out)
}

/// Decrypts the bytes of an encrypted `.ckpt` file (`path` names it in errors), handing each
/// block's plaintext to `sink` in order.
pub fn decrypt_blocks(
    path: &Path,
    data: &[u8],
    key: &[u8],
    mode: CipherMode,
    mut sink: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    check_key(path, key, mode)?;
    let fail = |at: usize, block: usize, reason: String| CkptError::Decrypt {
        path: path.to_path_buf(),
        reason: format!("block {block} at byte {at}: {reason}"),
    };
    let int = |at: usize| -> Option<i32> {
        Some(i32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
    };
    let mut at = 0usize;
    let mut block = 0usize;
    while at < data.len() {
        let rest = &data[at..];
        if block > 0 && rest.len() == 17 && rest.starts_with(b"crc_num") {
            // MindSpore's clear-text trailer after encrypted blocks (see the module doc).
            break;
        }
        let Some(magic) = int(at).map(|m| m as u32) else {
            return Err(fail(
                at,
                block,
                "the file ends inside a block header".into(),
            ));
        };
        if magic != mode.magic() {
            let reason = match CipherMode::from_magic(magic) {
                Some(other) => format!("the file is encrypted with {other}, not {mode} (pass dec_mode='{other}')"),
                None if block == 0 => format!("the file is not an encrypted MindSpore checkpoint (it does not start with the {mode} magic number 0x{:08X}); read it without a key", mode.magic()),
                None => format!("expected the {mode} magic number 0x{:08X}, found 0x{magic:08X}", mode.magic()),
            };
            return Err(fail(at, block, reason));
        }
        let mut p = at + 4;
        let tag = if mode == CipherMode::AesGcm {
            let t = data
                .get(p..p + TAG_BYTES)
                .ok_or_else(|| fail(at, block, "the file ends inside the GCM tag".into()))?;
            p += TAG_BYTES;
            Some(t)
        } else {
            None
        };
        let block_len = int(p)
            .ok_or_else(|| fail(at, block, "the file ends before the block length".into()))?;
        p += 4;
        let body = usize::try_from(block_len)
            .ok()
            .and_then(|n| data.get(p..p.checked_add(n)?))
            .ok_or_else(|| {
                fail(
                    at,
                    block,
                    format!(
                        "block length {block_len} runs past the end of the file ({} bytes)",
                        data.len()
                    ),
                )
            })?;
        let iv_len = int(p).unwrap_or(-1);
        if iv_len != IV_BYTES as i32 {
            return Err(fail(
                at,
                block,
                format!("IV length {iv_len}, expected {IV_BYTES}"),
            ));
        }
        let cipher_len = body
            .get(4 + IV_BYTES..8 + IV_BYTES)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
            .unwrap_or(-1);
        if cipher_len <= 0 || 8 + IV_BYTES + cipher_len as usize != body.len() {
            return Err(fail(
                at,
                block,
                format!("cipher length {cipher_len} does not fill the block of {block_len} bytes"),
            ));
        }
        let iv = &body[4..4 + IV_BYTES];
        let cipher = &body[8 + IV_BYTES..];
        let plain = open_block(key, mode, iv, tag, cipher).ok_or_else(|| {
            fail(
                at,
                block,
                format!("{mode} decryption failed: wrong dec_key or dec_mode, or the file was tampered with"),
            )
        })?;
        sink(&plain)?;
        at = p + body.len();
        block += 1;
    }
    if block == 0 {
        return Err(fail(0, 0, "the file is empty".into()));
    }
    Ok(())
}

/// Decrypts the encrypted `.ckpt` file at `path` into an anonymous in-memory file holding the
/// plain stream; returns it and its length.
pub fn decrypt_file(path: &Path, dec: &Decryption) -> Result<(File, u64)> {
    let data = std::fs::read(path).map_err(io_err(path, "read"))?;
    let mut plain = memfd(path)?;
    let mut len = 0u64;
    decrypt_blocks(path, &data, &dec.key, dec.mode, |block| {
        len += block.len() as u64;
        plain
            .write_all(block)
            .map_err(io_err(path, "hold the decrypted data in memory"))
    })?;
    Ok((plain, len))
}

/// Writes `dst`, the plain `.ckpt` file `src` encrypted as MindSpore's
/// `save_checkpoint(enc_key=key, enc_mode=mode)` writes it (64 MiB blocks, random IVs),
/// atomically; an existing `dst` is replaced only with `force`.
pub fn encrypt_file(
    src: &Path,
    dst: &Path,
    key: &[u8],
    mode: CipherMode,
    force: bool,
) -> Result<std::path::PathBuf> {
    // A regular file only: reading a FIFO would wait for a writer without end, and a device
    // such as /dev/zero would be read without end.
    let (mut file, _) = super::detect::open_regular(src)?;
    let mut plain = Vec::new();
    file.read_to_end(&mut plain).map_err(io_err(src, "read"))?;
    if encrypted_mode(&plain).is_some() {
        return Err(CkptError::AlreadyEncrypted {
            path: src.to_path_buf(),
        });
    }
    let data = encrypt(&plain, key, mode, MAX_BLOCK_BYTES)?;
    write_file(dst, &data, force)
}

/// An anonymous in-memory file (Linux `memfd_create`).
fn memfd(path: &Path) -> Result<File> {
    // SAFETY: a constant NUL-terminated name and valid flags; the fd is owned by the File.
    let fd = unsafe { libc::memfd_create(c"tessera-decrypted-ckpt".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(CkptError::Io {
            path: path.to_path_buf(),
            op: "create an in-memory file for the decrypted data",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter_ivs() -> impl FnMut() -> Result<[u8; IV_BYTES]> {
        let mut n = 0u8;
        move || {
            n += 1;
            Ok([n; IV_BYTES])
        }
    }

    fn decrypt_all(data: &[u8], key: &[u8], mode: CipherMode) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        decrypt_blocks(Path::new("f.ckpt"), data, key, mode, |b| {
            out.extend_from_slice(b);
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn round_trip_every_mode_and_key_length() {
        let plain: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        for (mode, keys) in [
            (CipherMode::AesGcm, &[16usize, 24, 32][..]),
            (CipherMode::AesCbc, &[16, 24, 32][..]),
            (CipherMode::Sm4Cbc, &[16][..]),
        ] {
            for &k in keys {
                let key: Vec<u8> = (0..k as u8).collect();
                let enc = encrypt_with_ivs(&plain, &key, mode, 300, counter_ivs()).unwrap();
                assert_eq!(encrypted_mode(&enc), Some(mode));
                assert_ne!(&enc[..], &plain[..]);
                assert_eq!(decrypt_all(&enc, &key, mode).unwrap(), plain, "{mode} {k}");
            }
        }
    }

    #[test]
    fn block_layout_is_mindspores() {
        // One 5-byte block, AES-CBC: magic, block_len, iv_len, iv, cipher_len, 16 cipher bytes.
        let key = [7u8; 16];
        let enc = encrypt_with_ivs(
            b"hello",
            &key,
            CipherMode::AesCbc,
            MAX_BLOCK_BYTES,
            counter_ivs(),
        )
        .unwrap();
        assert_eq!(enc.len(), 4 + 4 + 4 + 16 + 4 + 16);
        assert_eq!(&enc[..4], &0x7F3A_5ED9u32.to_le_bytes());
        assert_eq!(&enc[4..8], &(4 + 16 + 4 + 16i32).to_le_bytes());
        assert_eq!(&enc[8..12], &16i32.to_le_bytes());
        assert_eq!(&enc[12..28], &[1u8; 16]);
        assert_eq!(&enc[28..32], &16i32.to_le_bytes());
        // GCM: the tag sits between the magic and the block length; no padding.
        let enc = encrypt_with_ivs(
            b"hello",
            &key,
            CipherMode::AesGcm,
            MAX_BLOCK_BYTES,
            counter_ivs(),
        )
        .unwrap();
        assert_eq!(enc.len(), 4 + 16 + 4 + 4 + 16 + 4 + 5);
        assert_eq!(&enc[20..24], &(4 + 16 + 4 + 5i32).to_le_bytes());
    }

    #[test]
    fn known_vectors() {
        // AES-128-CBC, FIPS-197 key, IV 0..15, PKCS#7: the first cipher block of NIST SP
        // 800-38A F.2.1 for plaintext 6bc1bee22e409f96e93d7e117393172a.
        let key: Vec<u8> = hex("2b7e151628aed2a6abf7158809cf4f3c");
        let plain = hex("6bc1bee22e409f96e93d7e117393172a");
        let enc = encrypt_with_ivs(&plain, &key, CipherMode::AesCbc, MAX_BLOCK_BYTES, || {
            Ok(hex("000102030405060708090a0b0c0d0e0f").try_into().unwrap())
        })
        .unwrap();
        assert_eq!(&enc[32..48], &hex("7649abac8119b246cee98e9b12e9197d")[..]);
        // SM4-CBC: GB/T 32907 example (key = plaintext = 0123456789abcdeffedcba9876543210)
        // encrypts to 681edf34d206965e86b3e94f536e4246 with a zero IV.
        let k = hex("0123456789abcdeffedcba9876543210");
        let enc = encrypt_with_ivs(
            &k,
            &k,
            CipherMode::Sm4Cbc,
            MAX_BLOCK_BYTES,
            || Ok([0u8; 16]),
        )
        .unwrap();
        assert_eq!(&enc[32..48], &hex("681edf34d206965e86b3e94f536e4246")[..]);
    }

    #[test]
    fn files_from_mindspore_2_10() {
        // `mindspore.save_checkpoint([{"name": "w", "data": Tensor([0., 1., 2., 3.])}], f,
        // enc_key=bytes(range(16)), enc_mode="AES-GCM")` with the MindSpore 2.10.0 CPU wheel:
        // the GCM nonce is the first 12 bytes of the stored IV. Tessera must read it, and write
        // the same bytes given the same IV (what MindSpore then reads back).
        let ms = hex("d85e3a7f07eea9298a1bfa329b7968828638cf813c000000100000004ef64745557774739bad0c1d10e36c0f2400000067a218fb21c1eff53ec822d9684f7d0506ab3bea7deaf1e4d22971c92a05d4c8b2584ab9");
        let key: Vec<u8> = (0..16).collect();
        let got = decrypt_all(&ms, &key, CipherMode::AesGcm).unwrap();
        // The plain .ckpt: Checkpoint{value{tag "w", tensor{dims 4, "Float32", 0,1,2,3 f32}}}.
        let mut want = b"\n\"\n\x01w\x12\x1d\x08\x04\x12\x07Float32\x1a\x10".to_vec();
        for v in [0f32, 1., 2., 3.] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(got, want);
        let iv: [u8; 16] = ms[28..44].try_into().unwrap();
        let ours =
            encrypt_with_ivs(&want, &key, CipherMode::AesGcm, MAX_BLOCK_BYTES, || Ok(iv)).unwrap();
        assert_eq!(ours, ms);
    }

    #[test]
    fn files_from_an_independent_implementation() {
        // Built with OpenSSL (through Python's `cryptography` 48) in MindSpore's block layout:
        // key 00..0f (GCM) / 00..1f (CBC), IV 10..1f, one block.
        let plain = b"tessera mindspore checkpoint vector";
        let gcm = hex("d85e3a7f3ee8c3e55b88eeddb9de00b721d8bfc73b00000010000000101112131415161718191a1b1c1d1e1f23000000b1fb84c518c045a8bb71ade6d25f40a590dd43f70865cc88c6efe9e263351683574b19");
        // This GCM block uses the whole 16-byte IV as nonce (what Tessera wrote before it
        // matched MindSpore 2.10): still read.
        let key: Vec<u8> = (0..16).collect();
        assert_eq!(decrypt_all(&gcm, &key, CipherMode::AesGcm).unwrap(), plain);
        let iv = || Ok::<_, CkptError>(std::array::from_fn(|i| 16 + i as u8));
        let cbc = hex("d95e3a7f4800000010000000101112131415161718191a1b1c1d1e1f300000004da1059b00e2ba77b55b7104f80f3b65e862ce32366cea9f484c4d34271b47645b4ece62220bc7d058804d2ea44ea358");
        let key: Vec<u8> = (0..32).collect();
        assert_eq!(decrypt_all(&cbc, &key, CipherMode::AesCbc).unwrap(), plain);
        let ours = encrypt_with_ivs(plain, &key, CipherMode::AesCbc, MAX_BLOCK_BYTES, iv).unwrap();
        assert_eq!(ours, cbc);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn wrong_key_mode_or_tampering_is_an_error() {
        let key = [1u8; 32];
        let enc = encrypt(b"some checkpoint bytes", &key, CipherMode::AesGcm, 8).unwrap();
        let err = decrypt_all(&enc, &[2u8; 32], CipherMode::AesGcm).unwrap_err();
        assert!(err.to_string().contains("wrong dec_key"), "{err}");
        let err = decrypt_all(&enc, &key, CipherMode::AesCbc).unwrap_err();
        assert!(err.to_string().contains("dec_mode='AES-GCM'"), "{err}");
        let mut bad = enc.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(decrypt_all(&bad, &key, CipherMode::AesGcm).is_err());
        let err = decrypt_all(&enc[..enc.len() - 3], &key, CipherMode::AesGcm).unwrap_err();
        assert!(err.to_string().contains("past the end"), "{err}");
        let err = decrypt_all(b"plain protobuf", &key, CipherMode::AesGcm).unwrap_err();
        assert!(err.to_string().contains("not an encrypted"), "{err}");
        let err = decrypt_all(&enc, &[1u8; 15], CipherMode::AesGcm).unwrap_err();
        assert!(err.to_string().contains("16, 24, 32 bytes long"), "{err}");
        let err = Decryption::new(&[0u8; 8], CipherMode::Sm4Cbc).unwrap_err();
        assert!(
            err.to_string().contains("SM4-CBC keys are 16 bytes long"),
            "{err}"
        );
        assert!("AES-XTS".parse::<CipherMode>().is_err());
    }

    #[test]
    fn clear_crc_trailer_after_blocks_is_ignored() {
        let key = [3u8; 16];
        let mut enc = encrypt(b"abc", &key, CipherMode::AesCbc, MAX_BLOCK_BYTES).unwrap();
        enc.extend_from_slice(b"crc_num");
        enc.extend_from_slice(&[0u8; 10]);
        assert_eq!(decrypt_all(&enc, &key, CipherMode::AesCbc).unwrap(), b"abc");
    }
}
