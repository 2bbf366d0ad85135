//! `tessera ckpt …`: distributed checkpoints (convert, ranks, merge, load, dedup, verify,
//! inspect, diff). Each subcommand validates its flags, makes one `ckpt` call and prints the result
//! as text or, with `--json`, as one JSON object.
//!
//! One module per subcommand family: [`convert`] (convert, ranks, load), [`merge`] (merge,
//! load-segmented), [`redundancy`] (dedup, redundancy), [`verify`], [`diff`], [`inspect`];
//! [`flags`] holds the flags several share and [`output`] the progress bar and the printing.

mod convert;
mod diff;
mod flags;
mod inspect;
mod merge;
mod output;
mod redundancy;
mod verify;

use clap::{Args, Subcommand};

use self::convert::{ConvertArgs, LoadArgs, RanksArgs};
use self::diff::DiffArgs;
use self::inspect::InspectArgs;
use self::merge::{LoadSegmentedArgs, MergeArgs};
use self::redundancy::{DedupArgs, RedundancyArgs};
use self::verify::VerifyArgs;

/// Arguments of `tessera ckpt`.
#[derive(Debug, Args)]
pub struct CkptArgs {
    #[command(subcommand)]
    command: CkptCommand,
}

#[derive(Debug, Subcommand)]
enum CkptCommand {
    /// Convert a checkpoint from one strategy to another (all destination ranks, or one).
    Convert(ConvertArgs),
    /// The minimal list of source ranks a destination rank needs.
    Ranks(RanksArgs),
    /// Merge all ranks into full tensors (unified safetensors: part files + index).
    Merge(MergeArgs),
    /// Slice a unified checkpoint for a target strategy (`load_distributed_checkpoint`).
    Load(LoadArgs),
    /// Merge every checkpoint file of one directory (`load_segmented_checkpoints`).
    LoadSegmented(LoadSegmentedArgs),
    /// Save a checkpoint without redundancy: each replica group's copy kept by one owner.
    Dedup(DedupArgs),
    /// Print a strategy's redundancy map (replica groups) and the owner of each copy.
    Redundancy(RedundancyArgs),
    /// Check a checkpoint against its strategy; exits non-zero on any fault.
    Verify(VerifyArgs),
    /// Show the tensors of a checkpoint file (or the layouts of a strategy file).
    Inspect(InspectArgs),
    /// Compare two checkpoints of any strategies tensor by tensor; exits 0 only when every
    /// tensor is bitwise equal (or within --tolerance).
    Diff(DiffArgs),
}

/// Runs `tessera ckpt …`.
pub fn run(args: &CkptArgs) -> anyhow::Result<()> {
    match &args.command {
        CkptCommand::Convert(a) => convert::convert(a),
        CkptCommand::Ranks(a) => convert::ranks(a),
        CkptCommand::Merge(a) => merge::merge(a),
        CkptCommand::Load(a) => convert::load(a),
        CkptCommand::LoadSegmented(a) => merge::load_segmented(a),
        CkptCommand::Dedup(a) => redundancy::dedup(a),
        CkptCommand::Redundancy(a) => redundancy::redundancy(a),
        CkptCommand::Verify(a) => verify::verify(a),
        CkptCommand::Inspect(a) => inspect::inspect(a),
        CkptCommand::Diff(a) => diff::diff(a),
    }
}
