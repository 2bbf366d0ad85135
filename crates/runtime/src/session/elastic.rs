//! Elastic training in a session (`train.elastic`, see [`crate::elastic`]): the snapshot every
//! `train.elastic_interval` steps (each rank's file into its node's store, a copy into the next
//! node's, all ranks agreeing before the snapshot counts), and the recovery at a job's start
//! (the stores' inventories gathered, the newest whole snapshot chosen, missing files moved).

use std::path::PathBuf;

use comm::{Communicator, Tag};

use super::checkpoint::any_rank;
use super::run::RankRun;
use super::TrainSession;
use crate::config::ResumeFrom;
use crate::elastic::fault::{self, FaultPoint};
use crate::elastic::recovery::{self, RankView};
use crate::elastic::store::{Held, NodeStore};
use crate::error::RuntimeError;

/// Longest inventory one rank reports at a recovery.
const MAX_VIEW_BYTES: u64 = 1 << 20;

/// Largest rank file a snapshot exchanges (checked before the receive buffer is made).
const MAX_SNAPSHOT_BYTES: u64 = 1 << 40;

/// Longest side file (strategy, training state, model description) moved at a recovery.
const MAX_SIDE_FILE_BYTES: u64 = 1 << 30;

/// The tag of the files moved at a recovery (and the next one, of their side files); within
/// the 32,767 every MPI library accepts.
const RECOVERY_TAG: Tag = 30_500;

/// One rank's part of an elastic run.
#[derive(Debug)]
pub(super) struct ElasticRun {
    /// This node's store.
    store: NodeStore,
    /// Steps between snapshots.
    interval: u64,
    /// The rank keeping a copy of this rank's file (none on one node).
    buddy: Option<usize>,
    /// For every rank, the rank keeping its copy.
    buddies: Vec<Option<usize>>,
    /// This rank writes its node's side files and marks its snapshots complete.
    leader: bool,
}

impl ElasticRun {
    /// Whether a snapshot is due after `global_step`.
    pub(super) fn due(&self, global_step: u64) -> bool {
        global_step.is_multiple_of(self.interval)
    }
}

/// Every rank's byte count `mine`, gathered; a count above `max` is an error.
fn gather_lengths(
    world: &dyn Communicator,
    mine: usize,
    max: u64,
) -> Result<Vec<usize>, RuntimeError> {
    let mut lengths = vec![0u8; 8 * world.size()];
    world.all_gather_bytes(&(mine as u64).to_le_bytes(), &mut lengths)?;
    lengths
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .map(|len| {
            (len <= max)
                .then_some(len as usize)
                .ok_or_else(|| RuntimeError::CheckpointSet {
                    rank: world.rank(),
                    reason: format!(
                        "a rank reported {len} bytes of elastic state, more than {max}"
                    ),
                })
        })
        .collect()
}

/// Every rank's bytes, gathered (each at most `max` bytes).
fn gather_bytes(
    world: &dyn Communicator,
    mine: &[u8],
    max: u64,
) -> Result<Vec<Vec<u8>>, RuntimeError> {
    let counts = gather_lengths(world, mine.len(), max)?;
    let mut all = vec![0u8; counts.iter().sum()];
    world.all_gather_v_bytes(mine, &mut all, &counts)?;
    let mut out = Vec::with_capacity(counts.len());
    let mut at = 0;
    for c in counts {
        out.push(all[at..at + c].to_vec());
        at += c;
    }
    Ok(out)
}

/// The side files of a snapshot (everything but the rank directories and the marker), as
/// `(name, bytes)`.
fn side_files(store: &NodeStore, step: u64) -> Result<Vec<(String, Vec<u8>)>, RuntimeError> {
    let dir = store.step_dir(step);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let plain = entry.file_type().is_ok_and(|t| t.is_file());
        if !plain || name == crate::elastic::store::COMPLETE_FILE || name.starts_with('.') {
            continue;
        }
        let bytes = std::fs::read(entry.path()).map_err(|e| RuntimeError::CheckpointSet {
            rank: 0,
            reason: format!("cannot read {}: {e}", entry.path().display()),
        })?;
        files.push((name, bytes));
    }
    files.sort();
    Ok(files)
}

/// `(name, bytes)` pairs as one message: for each, the name's length (u32), the name, the
/// bytes' length (u64) and the bytes.
fn encode_files(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, bytes) in files {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

fn decode_files(mut bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    while !bytes.is_empty() {
        let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        let name = std::str::from_utf8(bytes.get(4..4 + len)?)
            .ok()?
            .to_string();
        // A plain file name: nothing that leaves the snapshot's directory.
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return None;
        }
        bytes = &bytes[4 + len..];
        let size = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        if size > MAX_SIDE_FILE_BYTES {
            return None;
        }
        let body = bytes.get(8..8 + size as usize)?.to_vec();
        bytes = &bytes[8 + size as usize..];
        files.push((name, body));
    }
    Some(files)
}

impl TrainSession {
    /// This rank's part of an elastic run, and the snapshot to resume from when the stores hold
    /// one that survived whole (its missing files moved here first). A restarted job with no
    /// such snapshot resumes from the newest periodic set on disk, or starts again, saying
    /// which.
    pub(super) fn elastic_start(
        &self,
        world: &dyn Communicator,
        interval: u64,
    ) -> Result<(ElasticRun, Option<PathBuf>), RuntimeError> {
        let store = crate::elastic::node_store()?;
        let rank = world.rank();
        // A snapshot is resumed only by a job of its own size; others are said, not used.
        let (held, other_sizes) = store.inventory_by_size(world.size());
        let view = RankView {
            node: store.id(),
            held,
        };
        let mine = serde_json::to_vec(&view).unwrap_or_default();
        let views: Vec<RankView> = gather_bytes(world, &mine, MAX_VIEW_BYTES)?
            .iter()
            .map(|b| serde_json::from_slice(b))
            .collect::<Result<_, _>>()
            .map_err(|e| RuntimeError::CheckpointSet {
                rank,
                reason: format!("a rank's elastic inventory is not readable: {e}"),
            })?;
        let node_ids: Vec<String> = views.iter().map(|v| v.node.clone()).collect();
        let leader = recovery::nodes(&node_ids)
            .iter()
            .any(|ranks| ranks[0] == rank);
        let buddies = recovery::buddies(&node_ids);
        if leader {
            if let Some(message) = other_sizes_message(store.dir(), &other_sizes, world.size()) {
                eprintln!("{message}");
            }
        }
        let elastic = ElasticRun {
            buddy: buddies[rank],
            buddies,
            store,
            interval,
            leader,
        };
        let from = match recovery::plan(&views) {
            Some(plan) => Some(self.elastic_recover(world, &elastic, &plan)?),
            None => self.elastic_fallback(rank, &views),
        };
        Ok((elastic, from))
    }

    /// Moves the plan's files, drops snapshots newer than its step, and returns its directory.
    fn elastic_recover(
        &self,
        world: &dyn Communicator,
        elastic: &ElasticRun,
        plan: &recovery::Recovery,
    ) -> Result<PathBuf, RuntimeError> {
        let rank = world.rank();
        let store = &elastic.store;
        let step = plan.step;
        let mut receivers: Vec<usize> = Vec::new();
        for t in &plan.transfers {
            if t.from == rank {
                let path = store.rank_file(step, t.file);
                let bytes = std::fs::read(&path).map_err(|e| RuntimeError::CheckpointSet {
                    rank,
                    reason: format!("cannot read {}: {e}", path.display()),
                })?;
                world.send_bytes(t.to, RECOVERY_TAG, &bytes)?;
                if !receivers.contains(&t.to) {
                    receivers.push(t.to);
                    let side = encode_files(&side_files(store, step)?);
                    world.send_bytes(t.to, RECOVERY_TAG + 1, &side)?;
                }
            } else if t.to == rank {
                let bytes = world.recv_bytes(t.from, RECOVERY_TAG)?;
                store.write_rank_file(step, t.file, &bytes)?;
                if !receivers.contains(&t.to) {
                    receivers.push(t.to);
                    let side = world.recv_bytes(t.from, RECOVERY_TAG + 1)?;
                    let files = decode_files(&side).ok_or_else(|| RuntimeError::CheckpointSet {
                        rank,
                        reason: "the snapshot's side files arrived malformed".to_string(),
                    })?;
                    for (name, bytes) in files {
                        ckpt::save_side_file(&store.step_dir(step).join(name), &bytes, true)?;
                    }
                }
            } else if !receivers.contains(&t.to) {
                receivers.push(t.to);
            }
        }
        if elastic.leader {
            store.mark_complete(step, plan.world)?;
            store.drop_newer_than(step)?;
        }
        world.barrier()?;
        if rank == 0 {
            eprintln!(
                "elastic: resuming from the in-memory snapshot of step {step} ({} file(s) moved between nodes)",
                plan.transfers.len()
            );
        }
        Ok(store.step_dir(step))
    }

    /// A job whose stores hold no whole snapshot: after a restart, the newest periodic set on
    /// disk (or nothing), said on rank 0; at a first start, what `output.resume_from` says.
    fn elastic_fallback(&self, rank: usize, views: &[RankView]) -> Option<PathBuf> {
        let restarted =
            std::env::var(crate::launch_env::RESTART_COUNT).is_ok_and(|n| n.trim() != "0");
        let had_snapshots = views.iter().any(|v| !v.held.is_empty());
        if !restarted && !had_snapshots {
            return None;
        }
        let out = self.config.output();
        let disk = crate::periodic_ckpt::latest_set(&out.dir);
        if rank == 0 {
            eprintln!(
                "{}",
                fallback_message(&out.dir, disk.as_deref(), out.resume_from.as_ref())
            );
        }
        disk
    }

    /// Writes the snapshot of `run`'s step: this rank's file into its node's store, a copy to
    /// its buddy's, and (once every rank succeeded) the node's marker; old snapshots pruned.
    pub(super) fn elastic_snapshot(&self, run: &mut RankRun) -> Result<(), RuntimeError> {
        let step = run.global_step;
        let rank = run.rank;
        run.exec.materialize_parameters()?;
        let Some(elastic) = run.elastic.as_ref() else {
            return Ok(());
        };
        let world = run.world.as_ref();
        let store = &elastic.store;
        let dir = store.step_dir(step);
        let written = if elastic.leader {
            store.clear_step(step)
        } else {
            Ok(())
        };
        // The leader clears a leftover of this step before anyone writes.
        let cleared = any_rank(world, written.is_err())?;
        written?;
        if cleared {
            return Err(RuntimeError::PeerWriteFailed {
                rank,
                reason: "another rank could not prepare the elastic snapshot".to_string(),
            });
        }
        let saved = run.saved_state();
        let own = self
            .save_rank(
                &saved,
                &dir,
                &format!("elastic-{step}"),
                rank,
                elastic.leader,
            )
            .and_then(|()| {
                std::fs::read(store.rank_file(step, rank)).map_err(|e| {
                    RuntimeError::CheckpointSet {
                        rank,
                        reason: format!("cannot read back the snapshot: {e}"),
                    }
                })
            });
        fault::strike(rank, step, FaultPoint::Snapshot)?;
        let bytes = own.as_deref().unwrap_or(&[]);
        let copied = self.exchange_copies(world, elastic, step, bytes);
        let failed = any_rank(world, own.is_err() || copied.is_err())?;
        own?;
        copied?;
        if failed {
            return Err(RuntimeError::PeerWriteFailed {
                rank,
                reason: format!("another rank failed to write its elastic snapshot of step {step}"),
            });
        }
        if elastic.leader {
            store.mark_complete(step, world.size())?;
            store.prune()?;
        }
        Ok(())
    }

    /// Sends this rank's file to its buddy and keeps the copies others send here (one
    /// all-to-all).
    fn exchange_copies(
        &self,
        world: &dyn Communicator,
        elastic: &ElasticRun,
        step: u64,
        mine: &[u8],
    ) -> Result<(), RuntimeError> {
        let Some(buddy) = elastic.buddy else {
            return Ok(());
        };
        let n = world.size();
        let rank = world.rank();
        let sizes = gather_lengths(world, mine.len(), MAX_SNAPSHOT_BYTES)?;
        let size_of = |r: usize| sizes[r];
        let send_counts: Vec<usize> = (0..n)
            .map(|j| if j == buddy { mine.len() } else { 0 })
            .collect();
        let recv_counts: Vec<usize> = (0..n)
            .map(|j| {
                if elastic.buddies[j] == Some(rank) {
                    size_of(j)
                } else {
                    0
                }
            })
            .collect();
        let mut recv = vec![0u8; recv_counts.iter().sum()];
        world.all_to_all_v_bytes(mine, &send_counts, &mut recv, &recv_counts)?;
        let mut at = 0;
        for (j, &count) in recv_counts.iter().enumerate() {
            if count > 0 {
                elastic
                    .store
                    .write_rank_file(step, j, &recv[at..at + count])?;
                at += count;
            }
        }
        Ok(())
    }
}

/// What a node's first rank says when its store holds complete snapshots of a job of another
/// size than this one's `world` (a snapshot is resumed only by a job of its own size): which,
/// and that this job's snapshots replace them.
fn other_sizes_message(store: &std::path::Path, other: &[Held], world: usize) -> Option<String> {
    if other.is_empty() {
        return None;
    }
    let list: Vec<String> = other
        .iter()
        .map(|h| format!("step {} of {} ranks", h.step, h.world))
        .collect();
    Some(format!(
        "elastic: this node's store {} holds snapshots of a job of another size ({}), not of this job's {world} ranks: they are not resumed from, and this job's own snapshots replace them",
        store.display(),
        list.join(", ")
    ))
}

/// What rank 0 says when no in-memory snapshot survived a restart: the periodic set on disk the
/// run resumes from, else what `output.resume_from` names (the run then starts from it), else
/// step 0.
fn fallback_message(
    out_dir: &std::path::Path,
    disk: Option<&std::path::Path>,
    resume_from: Option<&ResumeFrom>,
) -> String {
    if let Some(dir) = disk {
        return format!(
            "elastic: no in-memory snapshot survived whole (a shard and its copy were both lost); resuming from the last periodic checkpoint on disk, {}",
            dir.display()
        );
    }
    let then = match resume_from {
        Some(ResumeFrom::Dir(dir)) => {
            format!("starting again from output.resume_from, {}", dir.display())
        }
        Some(ResumeFrom::Latest) => {
            "and output.resume_from = \"latest\" finds no set there either".to_string()
        }
        None => "starting again from step 0".to_string(),
    };
    format!(
        "elastic: no in-memory snapshot survived whole and {} holds no periodic checkpoint; {then}",
        out_dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn side_files_round_trip_and_hostile_names_are_refused() {
        let files = vec![
            ("strategy.json".to_string(), b"{}".to_vec()),
            ("train_state.json".to_string(), vec![7; 300]),
        ];
        assert_eq!(decode_files(&encode_files(&files)).unwrap(), files);
        let evil = encode_files(&[("../escape".to_string(), b"x".to_vec())]);
        assert_eq!(decode_files(&evil), None);
        let cut = encode_files(&files);
        assert_eq!(decode_files(&cut[..cut.len() - 1]), None);
    }

    #[test]
    fn the_fallback_names_where_the_restarted_run_starts() {
        use std::path::Path;
        let out = Path::new("runs/a");
        let disk = fallback_message(out, Some(Path::new("runs/a/step_40")), None);
        assert!(disk.contains("resuming from the last periodic checkpoint on disk, runs/a/step_40"));
        let named = ResumeFrom::Dir("ckpt/base".into());
        let from = fallback_message(out, None, Some(&named));
        assert!(
            from.contains("starting again from output.resume_from, ckpt/base")
                && !from.contains("step 0"),
            "{from}"
        );
        let latest = fallback_message(out, None, Some(&ResumeFrom::Latest));
        assert!(latest.contains("\"latest\" finds no set"), "{latest}");
        let fresh = fallback_message(out, None, None);
        assert!(fresh.ends_with("starting again from step 0"), "{fresh}");
    }

    #[test]
    fn snapshots_of_another_job_size_are_named_not_passed_over() {
        let store = std::path::Path::new("/dev/shm/tessera-elastic-x");
        assert_eq!(other_sizes_message(store, &[], 2), None);
        let other = [
            Held {
                step: 40,
                world: 4,
                ranks: vec![0, 1],
            },
            Held {
                step: 30,
                world: 4,
                ranks: vec![0, 1],
            },
        ];
        let message = other_sizes_message(store, &other, 2).unwrap();
        assert!(
            message.contains("(step 40 of 4 ranks, step 30 of 4 ranks), not of this job's 2 ranks")
                && message.contains("/dev/shm/tessera-elastic-x"),
            "{message}"
        );
    }
}
