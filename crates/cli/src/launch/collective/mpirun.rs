//! The `mpirun` command line of one collective job (pure), and finding `mpirun` itself.
//!
//! Every rank is `tessera rank-env -- COMMAND` (the contract from OpenMPI's rank variables, the
//! MPI backend), started with `--tag-output` so the launcher can split the output by rank, with
//! `--oversubscribe --bind-to none` so a job of more ranks than cores runs (as threads do), and
//! across nodes with the host file and remote-shell agent the launcher provides.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where the ranks run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hosts {
    /// On this host.
    Local,
    /// On the hosts of the user's host file (`--hostfile`; `mpirun` reaches them by ssh).
    File(PathBuf),
    /// On the nodes that joined this launcher (msrun's model): the host file the launcher
    /// wrote, its agent, and how many nodes.
    Joined {
        /// The host file naming `localhost` and `tessera-node-<k>`.
        hostfile: PathBuf,
        /// Nodes in the job.
        nodes: usize,
        /// Every node is on this machine (the master address is a loopback one): MPI's traffic
        /// then goes over TCP on the loopback interface, which OpenMPI leaves out by default.
        loopback: bool,
    },
}

/// One collective job.
#[derive(Debug, Clone)]
pub struct MpirunJob<'a> {
    /// The `mpirun` to run.
    pub mpirun: &'a Path,
    /// This `tessera` (for `rank-env` and `launch-agent`).
    pub tessera: &'a Path,
    /// Ranks in the job.
    pub ranks: usize,
    /// Where they run.
    pub hosts: &'a Hosts,
    /// The launcher runs as root (OpenMPI refuses that without `--allow-run-as-root`).
    pub as_root: bool,
    /// Every rank's command.
    pub command: &'a [OsString],
    /// The launcher's private directory for OpenMPI's session directory and shared-memory
    /// segments (OpenMPI 4's `orte_tmpdir_base` and `btl_vader_backing_directory`), so that
    /// what a killed `mpirun` leaves there goes with the launcher; `None` leaves them where
    /// OpenMPI or the node's launcher puts them (ranks on other hosts, joined nodes).
    pub scratch: Option<&'a Path>,
}

impl MpirunJob<'_> {
    /// The whole command line, `mpirun` first.
    pub fn argv(&self) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec![self.mpirun.into()];
        let mut push = |words: &[&str]| argv.extend(words.iter().map(OsString::from));
        push(&["-np", &self.ranks.to_string()]);
        push(&["--oversubscribe", "--bind-to", "none", "--tag-output"]);
        if self.as_root {
            push(&["--allow-run-as-root"]);
        }
        // The restart count and the failure token reach ranks on other hosts too.
        push(&["-x", runtime::launch_env::RESTART_COUNT]);
        push(&["-x", runtime::launch_env::FAILURE_TOKEN]);
        if let Some(dir) = self.scratch {
            for key in ["orte_tmpdir_base", "btl_vader_backing_directory"] {
                argv.extend(["--mca", key].map(OsString::from));
                argv.push(dir.into());
            }
        }
        match self.hosts {
            Hosts::Local => {}
            Hosts::File(path) => {
                argv.push("--hostfile".into());
                argv.push(path.into());
            }
            Hosts::Joined {
                hostfile,
                nodes,
                loopback,
            } => {
                argv.push("--hostfile".into());
                argv.push(hostfile.into());
                // Fill each node's slots in host-file order: node k's ranks follow node k-1's.
                argv.extend(["--map-by", "slot"].map(OsString::from));
                let mut agent = OsString::from(self.tessera);
                agent.push(" launch-agent");
                argv.extend(["--mca", "plm_rsh_agent"].map(OsString::from));
                argv.push(agent);
                // Every daemon a child of mpirun's, so only node 0 runs the agent.
                argv.extend(["--mca", "routed_radix"].map(OsString::from));
                argv.push((nodes + 1).to_string().into());
                if *loopback {
                    for key in ["btl_tcp_if_include", "oob_tcp_if_include"] {
                        argv.extend(["--mca", key, "lo"].map(OsString::from));
                    }
                    // Nodes sharing one machine would name their shared-memory segments
                    // alike (host name and local rank): ranks talk over TCP instead.
                    argv.extend(["--mca", "btl", "self,tcp"].map(OsString::from));
                }
            }
        }
        argv.push(self.tessera.into());
        argv.extend(["rank-env", "--"].map(OsString::from));
        argv.extend(self.command.iter().cloned());
        argv
    }
}

/// The host file of a joined job: node 0 is this host, node k is `tessera-node-<k>`.
pub fn joined_hostfile(nodes: usize, slots: usize) -> String {
    let mut text = format!("localhost slots={slots}\n");
    for k in 1..nodes {
        text.push_str(&format!("{} slots={slots}\n", super::master::node_host(k)));
    }
    text
}

/// `name` on `PATH`, if there.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The most bytes of a `--hostfile` read.
const MAX_HOSTFILE_BYTES: u64 = 1 << 20;

/// The largest number a `--hostfile` setting may give (OpenMPI reads it as a C `int`).
const MAX_HOSTFILE_NUMBER: u64 = i32::MAX as u64;

/// Checks a `--hostfile` before `mpirun` is started with it (so that a bad one is said once,
/// naming the file and line, rather than by `mpirun` at every restart): readable, at least one
/// host, and every line `HOST [KEY=NUMBER]…` (OpenMPI's `slots=4 max_slots=8`), with `#`
/// starting a comment.
pub fn check_hostfile(path: &Path) -> anyhow::Result<()> {
    let text = layout::limits::read_text_bounded(path, MAX_HOSTFILE_BYTES)
        .map_err(|e| anyhow::anyhow!("--hostfile {}: {e}", path.display()))?;
    let mut hosts = 0;
    // Each host's first line, and whether it gave a slot count (`slots=N`).
    let mut seen: std::collections::HashMap<String, (usize, bool)> = Default::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace();
        let Some(host) = words.next() else {
            continue;
        };
        let at = || format!("--hostfile {} line {}", path.display(), i + 1);
        anyhow::ensure!(
            host.chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-_:@[]".contains(c)),
            "{}: {host:?} is not a host name (letters, digits and . - _ : @ [ ] only)",
            at()
        );
        let mut counted = false;
        for word in words {
            counted |= word.starts_with("slots=") || word.starts_with("slot=");
            let number = word
                .split_once('=')
                .filter(|(key, _)| !key.is_empty())
                .and_then(|(_, value)| value.parse::<u64>().ok());
            let Some(number) = number else {
                anyhow::bail!(
                    "{}: {word:?} after host {host} is not a KEY=NUMBER setting (slots=4)",
                    at()
                );
            };
            // OpenMPI reads the number as a C int: a larger one wraps around to another count.
            anyhow::ensure!(
                number <= MAX_HOSTFILE_NUMBER,
                "{}: {word:?} after host {host} is above {MAX_HOSTFILE_NUMBER}, the largest count OpenMPI reads",
                at()
            );
            // A host of no slots gets no rank, yet `--oversubscribe` would still place ranks there.
            anyhow::ensure!(
                !(number == 0 && (word.starts_with("slots=") || word.starts_with("slot="))),
                "{}: host {host} has {word}, which would give it no rank, yet OpenMPI places ranks on it anyway (the launcher runs mpirun with --oversubscribe): give it slots=1 or more, or leave the host out",
                at()
            );
        }
        // OpenMPI takes a host listed once per slot, or once with its slot count, and stops
        // with an internal error on a mix of the two.
        let (first, first_counted) = *seen.entry(host.to_string()).or_insert((i + 1, counted));
        anyhow::ensure!(
            first == i + 1 || !(counted || first_counted),
            "{}: host {host} is listed again (first on line {first}) and one of its lines gives slots=: OpenMPI takes a host either once per slot or on one line with slots=N, not both; merge them into one line",
            at()
        );
        hosts += 1;
    }
    anyhow::ensure!(
        hosts > 0,
        "--hostfile {} names no host (one per line: HOST [slots=N])",
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(argv: &[OsString]) -> Vec<String> {
        argv.iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_local_job_runs_rank_env_on_every_rank() {
        let command = [OsString::from("tessera"), OsString::from("train")];
        let job = MpirunJob {
            mpirun: Path::new("/usr/bin/mpirun"),
            tessera: Path::new("/opt/tessera"),
            ranks: 4,
            hosts: &Hosts::Local,
            as_root: false,
            command: &command,
            scratch: Some(Path::new("/dev/shm/tessera-mpi-x")),
        };
        let argv = words(&job.argv());
        assert_eq!(argv[..3], ["/usr/bin/mpirun", "-np", "4"]);
        assert!(argv.contains(&"--tag-output".to_string()));
        assert!(!argv.contains(&"--allow-run-as-root".to_string()));
        let line = argv.join(" ");
        assert!(
            line.contains("--mca orte_tmpdir_base /dev/shm/tessera-mpi-x")
                && line.contains("--mca btl_vader_backing_directory /dev/shm/tessera-mpi-x"),
            "{line}"
        );
        assert_eq!(
            argv[argv.len() - 5..],
            ["/opt/tessera", "rank-env", "--", "tessera", "train"]
        );
    }

    #[test]
    fn a_joined_job_uses_the_launchers_hostfile_and_agent() {
        let hosts = Hosts::Joined {
            hostfile: PathBuf::from("/tmp/x/hosts"),
            nodes: 2,
            loopback: true,
        };
        let command = [OsString::from("true")];
        let job = MpirunJob {
            mpirun: Path::new("mpirun"),
            tessera: Path::new("/bin/tessera"),
            ranks: 4,
            hosts: &hosts,
            as_root: true,
            command: &command,
            scratch: None,
        };
        let argv = words(&job.argv()).join(" ");
        assert!(argv.contains("--allow-run-as-root"));
        assert!(argv.contains("--hostfile /tmp/x/hosts --map-by slot"));
        assert!(argv.contains("--mca plm_rsh_agent /bin/tessera launch-agent"));
        assert!(argv.contains("--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"));
        assert!(!argv.contains("tmpdir_base"), "{argv}");
        assert_eq!(
            joined_hostfile(3, 2),
            "localhost slots=2\ntessera-node-1 slots=2\ntessera-node-2 slots=2\n"
        );
    }

    #[test]
    fn a_hostfile_is_checked_line_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = |text: &str| {
            let path = dir.path().join("hosts");
            std::fs::write(&path, text).unwrap();
            check_hostfile(&path).map_err(|e| e.to_string())
        };
        file("# the cluster\nnode-1 slots=4 max_slots=8\n\n10.0.0.2 slots=2 # second\n").unwrap();
        let err = file("node-1 slots=4\nnode 2 slots=4\n").unwrap_err();
        assert!(err.contains("line 2") && err.contains("\"2\""), "{err}");
        let err = file("node-1 slots=four\n").unwrap_err();
        assert!(
            err.contains("line 1") && err.contains("slots=four"),
            "{err}"
        );
        // No slots, or more than OpenMPI's int holds: refused, naming the host and the line.
        let err = file("node-1 slots=2\nnode-2 slots=0\n").unwrap_err();
        assert!(
            err.contains("line 2: host node-2 has slots=0") && err.contains("slots=1 or more"),
            "{err}"
        );
        let err = file("node-1 slots=4294967297\n").unwrap_err();
        assert!(
            err.contains("line 1") && err.contains("above 2147483647"),
            "{err}"
        );
        file("node-1 slots=2147483647 max_slots=0\n").unwrap();
        let err = file("n$1\n").unwrap_err();
        assert!(err.contains("not a host name"), "{err}");
        // A host once per slot is OpenMPI's other form; mixed with slots= it is refused.
        file("node-1\nnode-1\n").unwrap();
        let err = file("node-1 slots=1\nnode-2\nnode-1 slots=1\n").unwrap_err();
        assert!(
            err.contains("line 3: host node-1 is listed again (first on line 1)"),
            "{err}"
        );
        let err = file("# nothing\n\n").unwrap_err();
        assert!(err.contains("names no host"), "{err}");
        let err = check_hostfile(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--hostfile") && err.contains("missing"),
            "{err}"
        );
    }
}
