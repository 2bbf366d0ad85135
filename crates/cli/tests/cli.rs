//! The `tessera` command line end to end: output, `--json`, exit codes and error messages.

mod ckpt_cli;
mod ckpt_hostile_cli;
mod data_hostile_cli;
mod diff_cli;
mod disk_full_cli;
mod fail_fast_cli;
mod generate_cli;
mod hostile_cli;
mod launch_cli;
mod launch_flags_cli;
mod layout_cli;
#[cfg(feature = "mpi")]
mod mpi_elastic;
#[cfg(feature = "mpi")]
mod mpi_launch;
#[cfg(feature = "mpi")]
mod mpi_sweep;
#[cfg(feature = "mpi")]
mod mpi_train;
mod plan_cli;
mod profile_cli;
mod ps_launch_cli;
mod sets_cli;
mod stage_warnings_cli;
mod stdout_cli;
mod train_cli;
mod util;
