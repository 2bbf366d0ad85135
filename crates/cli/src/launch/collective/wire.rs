//! The messages between the launchers of a job spanning nodes (msrun's model) and between node
//! 0's launcher and the `tessera launch-agent` processes `mpirun` starts: one JSON object per
//! line, each line at most [`MAX_MESSAGE_BYTES`].
//!
//! The launchers only form the job and start OpenMPI's daemon (`orted`) on each node; the ranks
//! talk to each other through MPI, never through this channel.

use std::io::{self, BufRead, Write};

use serde::{Deserialize, Serialize};

/// The protocol's version, checked when a node says hello.
pub const PROTOCOL: u32 = 1;

/// Longest message line accepted (an `orted` command line is about 1 KiB).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// One message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Message {
    /// Node → master: join the job.
    Hello {
        /// [`PROTOCOL`] of the node's launcher.
        protocol: u32,
        /// `--node_rank`, or `None` to be given one.
        node_rank: Option<usize>,
        /// `--local_worker_num` of the node.
        local_worker_num: usize,
        /// `--worker_num` as the node was told.
        worker_num: usize,
    },
    /// Master → node: joined as this node rank of `nodes`.
    Welcome {
        /// The node's rank.
        node_rank: usize,
        /// Nodes in the job.
        nodes: usize,
    },
    /// Master → node: not joined, and why.
    Refused {
        /// What rule the hello broke.
        reason: String,
    },
    /// Agent → master: run `command` (OpenMPI's daemon) on the node named `host`.
    Launch {
        /// The host name `mpirun` gave (`tessera-node-<rank>`).
        host: String,
        /// The shell command `mpirun` asked for.
        command: String,
    },
    /// Master → node: run OpenMPI's daemon command line `command`, known as launch `id`.
    Run {
        /// The launch's id (unique within the master), which its exit report carries.
        id: u64,
        /// The shell command.
        command: String,
    },
    /// Node → master, and master → agent: the daemon of launch `id` ended with this exit code.
    Exited {
        /// The launch's id (0 in the master's answer to an agent).
        id: u64,
        /// Its exit code (128 + the signal when killed).
        code: i32,
    },
    /// Master → node: stop the node's daemon (its `mpirun` gave up on it, or the job is
    /// starting again).
    Kill,
    /// Master → node: the job is over.
    Done {
        /// Whether every rank finished.
        ok: bool,
        /// What the master reports.
        message: String,
    },
}

/// Writes `message` as one line and flushes it.
pub fn send(to: &mut impl Write, message: &Message) -> io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(io::Error::other)?;
    line.push(b'\n');
    to.write_all(&line)?;
    to.flush()
}

/// Reads the next message; `None` when the peer closed the connection. A line longer than
/// [`MAX_MESSAGE_BYTES`] or not a message is an `InvalidData` error naming what was wrong.
pub fn receive<R: BufRead>(from: &mut R) -> io::Result<Option<Message>> {
    let mut line = Vec::new();
    let read = <&mut R as io::Read>::take(from, MAX_MESSAGE_BYTES as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if read == 0 {
        return Ok(None);
    }
    if line.len() > MAX_MESSAGE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message longer than {MAX_MESSAGE_BYTES} bytes"),
        ));
    }
    if line.last() != Some(&b'\n') {
        return Ok(None);
    }
    serde_json::from_slice(&line).map(Some).map_err(|err| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a Tessera launcher message ({err})"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_one_per_line() {
        let messages = [
            Message::Hello {
                protocol: PROTOCOL,
                node_rank: None,
                local_worker_num: 2,
                worker_num: 4,
            },
            Message::Run {
                id: 7,
                command: "orted -mca ess \"env\"".into(),
            },
            Message::Exited { id: 7, code: 137 },
            Message::Kill,
            Message::Done {
                ok: false,
                message: "rank 3 failed".into(),
            },
        ];
        let mut bytes = Vec::new();
        for m in &messages {
            send(&mut bytes, m).unwrap();
        }
        assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 5);
        let mut reader = io::BufReader::new(&bytes[..]);
        for m in &messages {
            assert_eq!(receive(&mut reader).unwrap().as_ref(), Some(m));
        }
        assert_eq!(receive(&mut reader).unwrap(), None);
    }

    #[test]
    fn foreign_and_oversized_lines_are_refused() {
        let mut http = io::BufReader::new(&b"HTTP/1.1 400 Bad Request\r\n"[..]);
        let err = receive(&mut http).unwrap_err();
        assert!(err.to_string().contains("not a Tessera launcher message"));
        let long = vec![b'x'; MAX_MESSAGE_BYTES + 10];
        let err = receive(&mut io::BufReader::new(&long[..])).unwrap_err();
        assert!(err.to_string().contains("longer than"), "{err}");
        // A line cut by a closed connection is the end, not a message.
        assert_eq!(
            receive(&mut io::BufReader::new(&b"{\"kill\""[..])).unwrap(),
            None
        );
    }
}
