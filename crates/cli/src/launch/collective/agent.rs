//! `tessera launch-agent HOST COMMAND…`: the remote-shell agent `mpirun` runs on node 0 of a
//! job spanning nodes (in place of `ssh HOST COMMAND`). It asks node 0's launcher, over the Unix
//! socket named by [`SOCKET_VAR`], to run COMMAND (OpenMPI's daemon) on node HOST, waits for the
//! daemon to end there, and exits with its exit code, as `ssh` would.

use std::ffi::OsString;
use std::io::BufReader;
use std::os::unix::net::UnixStream;

use anyhow::Context as _;
use clap::Args;

use super::wire::{self, Message};

/// The variable naming node 0's relay socket, set in `mpirun`'s environment by the launcher.
pub const SOCKET_VAR: &str = runtime::launch_env::LAUNCH_AGENT_SOCKET;

/// Arguments of `tessera launch-agent` (given by `mpirun`, not by users).
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The node `mpirun` wants the command run on (`tessera-node-<rank>`).
    host: String,
    /// The command, as `mpirun` gives it to a remote shell.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

/// Relays the command and returns the daemon's exit code.
pub fn run(args: &AgentArgs) -> anyhow::Result<i32> {
    let socket = std::env::var_os(SOCKET_VAR).with_context(|| {
        format!("tessera launch-agent runs only under `tessera launch` across nodes ({SOCKET_VAR} is not set)")
    })?;
    let mut stream = UnixStream::connect(&socket)
        .with_context(|| format!("cannot reach the launcher at {}", socket.to_string_lossy()))?;
    let command = args
        .command
        .iter()
        .map(|w| w.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    wire::send(
        &mut stream,
        &Message::Launch {
            host: args.host.clone(),
            command,
        },
    )?;
    let mut reader = BufReader::new(stream);
    match wire::receive(&mut reader)? {
        Some(Message::Exited { code, .. }) => Ok(code),
        _ => anyhow::bail!(
            "the launcher went away before node {}'s daemon ended",
            args.host
        ),
    }
}
