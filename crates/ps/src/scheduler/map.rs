//! The scheduler's side of adding a server: the committed partition map and the one migration
//! under way (see [`crate::migrate`]).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::migrate::PartitionMap;

/// A migration to the map of one more server.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    /// The new map.
    pub map: PartitionMap,
    /// The first step routed by the new map: no worker begins it before the commit.
    pub switch_step: u64,
    /// When every live worker was first seen waiting at the switch step.
    pub go_since: Option<Instant>,
    /// The servers that switched to the new map.
    pub ready: BTreeSet<u32>,
}

/// The committed map and the migration under way.
#[derive(Debug, Clone)]
pub(super) struct MapState {
    /// The committed map.
    pub current: PartitionMap,
    /// The migration under way.
    pub pending: Option<Pending>,
}

impl MapState {
    /// The job's first map: epoch 0 over `servers` servers.
    pub fn new(servers: usize) -> MapState {
        MapState {
            current: PartitionMap { epoch: 0, servers },
            pending: None,
        }
    }

    /// Server `id` registers while `next_step` is the first step not yet begun. A known id
    /// (below the map's servers, or the server being added) changes nothing; the next id
    /// opens the migration to one more server, switching at `next_step`. Returns whether it
    /// opened one, or the rule broken.
    pub fn register(&mut self, id: u32, next_step: u64) -> Result<bool, String> {
        let id = id as usize;
        if id < self.current.servers {
            return Ok(false);
        }
        if let Some(p) = &self.pending {
            if id + 1 == p.map.servers {
                return Ok(false);
            }
            return Err(format!(
                "server {id} cannot be added: server {} is being added (epoch {}); add one server at a time",
                p.map.servers - 1,
                p.map.epoch
            ));
        }
        if id != self.current.servers {
            return Err(format!(
                "server {id} cannot be added: the servers are 0..{} and the next one is {}",
                self.current.servers, self.current.servers
            ));
        }
        self.pending = Some(Pending {
            map: PartitionMap {
                epoch: self.current.epoch + 1,
                servers: id + 1,
            },
            switch_step: next_step,
            go_since: None,
            ready: BTreeSet::new(),
        });
        Ok(true)
    }

    /// Whether a worker must wait before beginning `step` (a migration switches there).
    pub fn holds(&self, step: u64) -> bool {
        self.pending.as_ref().is_some_and(|p| step >= p.switch_step)
    }

    /// Whether the old owners may hand over now: some live worker is unfinished and each one
    /// (`steps`: the step each is on, `None` when not known yet) waits at the switch step, so
    /// no gradient of an earlier step is still on its way. Notes when it first became so.
    pub fn go(&mut self, steps: &[Option<u64>], now: Instant) -> bool {
        let Some(p) = self.pending.as_mut() else {
            return false;
        };
        let go = !steps.is_empty() && steps.iter().all(|s| s.is_some_and(|s| s >= p.switch_step));
        if go && p.go_since.is_none() {
            p.go_since = Some(now);
        }
        go || p.go_since.is_some()
    }

    /// Server `id` switched to the map of `epoch`; commits the map once every server of it
    /// has, returning the committed map and its switch step.
    pub fn ready(&mut self, id: u32, epoch: u64) -> Option<(PartitionMap, u64)> {
        let p = self.pending.as_mut()?;
        if epoch != p.map.epoch {
            return None;
        }
        p.ready.insert(id);
        if p.ready.len() < p.map.servers || (0..p.map.servers as u32).any(|s| !p.ready.contains(&s))
        {
            return None;
        }
        let p = self.pending.take()?;
        self.current = p.map;
        Some((p.map, p.switch_step))
    }

    /// Why the migration under way has failed: a server of the new map in `dead`, or the
    /// handover running longer than `limit`.
    pub fn failed(&self, dead: &[u32], now: Instant, limit: Duration) -> Option<String> {
        let p = self.pending.as_ref()?;
        if let Some(d) = dead.iter().find(|&&d| (d as usize) < p.map.servers) {
            return Some(format!(
                "adding server {} failed: server {d} died during the handover to the partition map of epoch {}",
                p.map.servers - 1,
                p.map.epoch
            ));
        }
        let since = p.go_since?;
        (now.duration_since(since) > limit).then(|| {
            let missing: Vec<String> = (0..p.map.servers as u32)
                .filter(|s| !p.ready.contains(s))
                .map(|s| s.to_string())
                .collect();
            format!(
                "adding server {} failed: server(s) {} did not switch to the partition map of epoch {} within {} s",
                p.map.servers - 1,
                missing.join(", "),
                p.map.epoch,
                limit.as_secs()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_id_opens_a_migration_that_commits_when_every_server_switched() {
        let mut m = MapState::new(2);
        assert_eq!(m.register(1, 0), Ok(false));
        assert!(m.register(3, 5).unwrap_err().contains("next one is 2"));
        assert_eq!(m.register(2, 5), Ok(true));
        assert!(m
            .register(3, 5)
            .unwrap_err()
            .contains("one server at a time"));
        assert!(!m.holds(4) && m.holds(5) && m.holds(6));
        let now = Instant::now();
        assert!(!m.go(&[Some(5), Some(4)], now));
        assert!(!m.go(&[Some(5), None], now));
        assert!(!m.go(&[], now));
        assert!(m.go(&[Some(5), Some(5)], now));
        assert_eq!(m.ready(0, 1), None);
        assert_eq!(m.ready(1, 1), None);
        assert_eq!(m.ready(1, 7), None, "another epoch");
        let (map, step) = m.ready(2, 1).expect("committed");
        assert_eq!((map.epoch, map.servers, step), (1, 3, 5));
        assert_eq!(m.current, map);
        assert!(!m.holds(5));
        assert_eq!(m.register(3, 9), Ok(true), "the next id after the commit");
    }

    #[test]
    fn a_dead_server_or_a_stalled_handover_fails_the_migration() {
        let mut m = MapState::new(1);
        m.register(1, 3).unwrap();
        let t0 = Instant::now();
        assert_eq!(m.failed(&[], t0, Duration::from_secs(1)), None);
        assert!(m
            .failed(&[1], t0, Duration::from_secs(1))
            .unwrap()
            .contains("server 1 died"));
        assert!(m.go(&[Some(3)], t0));
        let later = t0 + Duration::from_secs(2);
        let why = m.failed(&[], later, Duration::from_secs(1)).unwrap();
        assert!(why.contains("server(s) 0, 1 did not switch"), "{why}");
    }
}
