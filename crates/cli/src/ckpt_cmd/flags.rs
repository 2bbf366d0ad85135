//! The flags several `tessera ckpt` subcommands share: writing files and decrypting sources.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use runtime::PathKind;

/// Flags shared by commands that write files.
#[derive(Debug, Args)]
pub(super) struct WriteFlags {
    /// Replace destination files that exist.
    #[arg(long)]
    pub(super) force: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub(super) quiet: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(super) json: bool,
    /// Do not fsync: leave the written files, the set marker and the directory entries to the
    /// OS page cache, as `cp` does. The output still appears atomically (a failed or killed run
    /// leaves the old checkpoint or the new one, never a mix), but what is given up is
    /// durability: a power loss or OS crash shortly after the command returns may lose the new
    /// checkpoint, or leave its files empty.
    #[arg(long)]
    pub(super) no_fsync: bool,
}

impl WriteFlags {
    /// The durability `--no-fsync` asks for.
    pub(super) fn durability(&self) -> ckpt::Durability {
        ckpt::Durability::from_fsync(!self.no_fsync)
    }
}

/// How to read encrypted `.ckpt` sources (MindSpore's `dec_key` / `dec_mode`).
#[derive(Debug, Args)]
pub(super) struct DecryptFlags {
    /// Decrypt the `.ckpt` sources with this key, given in hex (16, 24 or 32 bytes for AES,
    /// 16 for SM4). Prefer --dec-key-file: a command line is visible to other users.
    #[arg(long, value_name = "HEX", conflicts_with = "dec_key_file")]
    pub(super) dec_key: Option<String>,
    /// Decrypt the `.ckpt` sources with the key held in this file (its raw bytes).
    #[arg(long, value_name = "PATH")]
    pub(super) dec_key_file: Option<PathBuf>,
    /// The cipher the sources were encrypted with: AES-GCM (the default), AES-CBC or SM4-CBC.
    #[arg(long, value_name = "MODE")]
    pub(super) dec_mode: Option<String>,
}

/// The largest key file read (a key is 16 or 32 bytes; the bound keeps a wrong path, such as a
/// device, from being read without end).
const MAX_KEY_FILE_BYTES: u64 = 64 << 10;

impl DecryptFlags {
    /// The decryption asked for, if any; the key is checked against the mode.
    pub(super) fn decryption(&self) -> anyhow::Result<Option<ckpt::Decryption>> {
        let key = match (&self.dec_key, &self.dec_key_file) {
            (Some(hex), _) => parse_hex_key(hex)?,
            (None, Some(path)) => {
                check_input_file("--dec-key-file", path, KEY_FILE)?;
                layout::limits::read_bounded(path, MAX_KEY_FILE_BYTES).with_context(|| {
                    format!("--dec-key-file {}: cannot read the key", path.display())
                })?
            }
            (None, None) if self.dec_mode.is_some() => {
                bail!("--dec-mode needs a key: give --dec-key or --dec-key-file")
            }
            (None, None) => return Ok(None),
        };
        let mode: ckpt::CipherMode = self
            .dec_mode
            .as_deref()
            .unwrap_or("AES-GCM")
            .parse()
            .context("--dec-mode")?;
        Ok(Some(
            ckpt::Decryption::new(&key, mode).context("the decryption key")?,
        ))
    }
}

/// The bytes of a hex key (`--dec-key`): an even number of hex digits.
fn parse_hex_key(hex: &str) -> anyhow::Result<Vec<u8>> {
    let hex = hex.trim();
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("--dec-key must be the key in hex (an even number of the digits 0-9a-f)");
    }
    Ok((0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("two hex digits"))
        .collect())
}

/// What `--dec-key-file` must name.
const KEY_FILE: &str = "a file (the decryption key's raw bytes)";
/// What a strategy-file flag must name.
pub(super) const STRATEGY_FILE: &str =
    "a file (a strategy file: MindSpore protobuf or JSON, or Tessera JSON)";
/// What a source checkpoint directory flag must name.
pub(super) const CHECKPOINT_DIR: &str = "a directory (a checkpoint holding rank_<N>/ folders)";
/// What a destination directory flag must name.
pub(super) const DEST_DIR: &str =
    "a directory to write the output into (created, with its missing parents, if absent)";

/// Refuses, before any work, a `flag` path read as a file that is not one: empty, missing, a
/// directory. The error names the flag, the path, what is wrong and `expected`.
pub(super) fn check_input_file(flag: &str, path: &Path, expected: &str) -> anyhow::Result<()> {
    runtime::check_input_path(flag, path, PathKind::File, expected)?;
    Ok(())
}

/// [`check_input_file`] for an optional flag.
pub(super) fn check_optional_file(
    flag: &str,
    path: Option<&Path>,
    expected: &str,
) -> anyhow::Result<()> {
    path.map_or(Ok(()), |p| check_input_file(flag, p, expected))
}

/// Refuses, before any work, a `flag` path read as a directory that is not one.
pub(super) fn check_input_dir(flag: &str, path: &Path, expected: &str) -> anyhow::Result<()> {
    runtime::check_input_path(flag, path, PathKind::Directory, expected)?;
    Ok(())
}

/// Refuses, before any work, a destination directory `flag` that cannot be written: empty, a
/// file, under a file, or in a directory where nothing can be made.
pub(super) fn check_dest_dir(flag: &str, path: &Path) -> anyhow::Result<()> {
    runtime::check_output_path(flag, path, PathKind::Directory, DEST_DIR)?;
    Ok(())
}
