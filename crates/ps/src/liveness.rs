//! Liveness by heartbeat: a process silent for longer than `dead_after` is declared dead.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// When each process of one role was last heard from, and which were declared dead.
#[derive(Debug, Clone)]
pub struct Liveness {
    dead_after: Duration,
    last_seen: BTreeMap<u32, Instant>,
    dead: BTreeMap<u32, Instant>,
}

impl Liveness {
    /// A tracker declaring death after `dead_after` of silence.
    pub fn new(dead_after: Duration) -> Liveness {
        Liveness {
            dead_after,
            last_seen: BTreeMap::new(),
            dead: BTreeMap::new(),
        }
    }

    /// Process `id` registered (again) at `now`: alive.
    pub fn register(&mut self, id: u32, now: Instant) {
        self.dead.remove(&id);
        self.last_seen.insert(id, now);
    }

    /// A heartbeat of `id` at `now`; `false` when `id` is not alive (never registered, or
    /// declared dead: it must register again).
    pub fn beat(&mut self, id: u32, now: Instant) -> bool {
        match self.last_seen.get_mut(&id) {
            Some(seen) => {
                *seen = (*seen).max(now);
                true
            }
            None => false,
        }
    }

    /// `id` left on purpose.
    pub fn remove(&mut self, id: u32) {
        self.last_seen.remove(&id);
    }

    /// Declares dead every process silent for longer than `dead_after` at `now`; returns them
    /// with how long each had been silent.
    pub fn sweep(&mut self, now: Instant) -> Vec<(u32, Duration)> {
        let expired: Vec<(u32, Duration)> = self
            .last_seen
            .iter()
            .map(|(&id, &seen)| (id, now.saturating_duration_since(seen)))
            .filter(|&(_, silent)| silent > self.dead_after)
            .collect();
        for &(id, _) in &expired {
            self.last_seen.remove(&id);
            self.dead.insert(id, now);
        }
        expired
    }

    /// How long alive process `id` has been silent at `now` (`None` when it is not alive).
    pub fn silent_for(&self, id: u32, now: Instant) -> Option<Duration> {
        self.last_seen
            .get(&id)
            .map(|&seen| now.saturating_duration_since(seen))
    }

    /// Whether `id` is alive.
    pub fn is_alive(&self, id: u32) -> bool {
        self.last_seen.contains_key(&id)
    }

    /// The live ids, ascending.
    pub fn alive(&self) -> Vec<u32> {
        self.last_seen.keys().copied().collect()
    }

    /// The ids declared dead (and not registered since), ascending.
    pub fn dead(&self) -> Vec<u32> {
        self.dead.keys().copied().collect()
    }

    /// The ids declared dead (and not registered since) with how long ago each was declared
    /// dead at `now`, ascending by id.
    pub fn dead_for(&self, now: Instant) -> Vec<(u32, Duration)> {
        self.dead
            .iter()
            .map(|(&id, &at)| (id, now.saturating_duration_since(at)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silent_past_the_bound_is_dead_and_must_register_again() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut live = Liveness::new(ms(1000));
        live.register(0, t0);
        live.register(1, t0);
        assert!(live.beat(0, t0 + ms(900)));
        assert!(live.sweep(t0 + ms(1000)).is_empty());
        // Worker 1 last heard at t0: dead after 1 s of silence; worker 0 beat at 0.9 s.
        assert_eq!(live.sweep(t0 + ms(1001)), vec![(1, ms(1001))]);
        assert_eq!(live.alive(), vec![0]);
        assert_eq!(live.dead(), vec![1]);
        assert!(
            !live.beat(1, t0 + ms(1100)),
            "a dead process is not revived by a beat"
        );
        live.register(1, t0 + ms(1200));
        assert_eq!(live.alive(), vec![0, 1]);
        assert!(live.dead().is_empty());
        assert_eq!(live.sweep(t0 + ms(1901)), vec![(0, ms(1001))]);
    }
}
