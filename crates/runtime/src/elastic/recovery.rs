//! The pure decisions of elastic training: whose shard each rank keeps a copy of, and, at a
//! restart, which snapshot the job continues from and which files must move for every node to
//! hold all of it.
//!
//! Nodes are told apart by their store ([`super::store::NodeStore::id`]) and ordered by their
//! lowest rank. Rank r at index i among its node's ranks copies its shard to the rank at index
//! i of the next node (around the ring), so losing one node loses no shard. On one node there is
//! no copy to make: every shard is in that node's memory, which a lost rank does not take.

use super::store::Held;

/// What one rank reports at a restart: its node, and the complete snapshots its store holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RankView {
    /// Its node's store id.
    pub node: String,
    /// Its store's complete snapshots.
    pub held: Vec<Held>,
}

/// One file to move before the resume: `file`'s checkpoint, from rank `from` (whose store has
/// it) to rank `to` (the first rank of a node whose store lacks it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// The rank (of the snapshot's job) whose checkpoint file moves.
    pub file: usize,
    /// The sender.
    pub from: usize,
    /// The receiver.
    pub to: usize,
}

/// The snapshot a restarted job continues from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Its global step.
    pub step: u64,
    /// The ranks of the job that took it.
    pub world: usize,
    /// The files to move first, in the order every rank walks them.
    pub transfers: Vec<Transfer>,
}

/// Every node's ranks, ascending, nodes ordered by their lowest rank.
pub fn nodes(node_of_rank: &[String]) -> Vec<Vec<usize>> {
    let mut nodes: Vec<(String, Vec<usize>)> = Vec::new();
    for (rank, node) in node_of_rank.iter().enumerate() {
        match nodes.iter_mut().find(|(id, _)| id == node) {
            Some((_, ranks)) => ranks.push(rank),
            None => nodes.push((node.clone(), vec![rank])),
        }
    }
    nodes.into_iter().map(|(_, ranks)| ranks).collect()
}

/// For every rank, the rank that keeps a copy of its shard (`None` on a job of one node).
pub fn buddies(node_of_rank: &[String]) -> Vec<Option<usize>> {
    let nodes = nodes(node_of_rank);
    let mut buddy = vec![None; node_of_rank.len()];
    if nodes.len() < 2 {
        return buddy;
    }
    for (k, ranks) in nodes.iter().enumerate() {
        let next = &nodes[(k + 1) % nodes.len()];
        for (i, &rank) in ranks.iter().enumerate() {
            buddy[rank] = Some(next[i % next.len()]);
        }
    }
    buddy
}

/// The newest snapshot whose files the nodes hold between them (every rank of the job that
/// took it), and the moves that give every node all of them; `None` when no snapshot
/// survives whole.
pub fn plan(views: &[RankView]) -> Option<Recovery> {
    let node_ids: Vec<String> = views.iter().map(|v| v.node.clone()).collect();
    let nodes = nodes(&node_ids);
    // One view per node (its ranks see the same store): its first rank's.
    let stores: Vec<(usize, &[Held])> = nodes
        .iter()
        .map(|ranks| (ranks[0], views[ranks[0]].held.as_slice()))
        .collect();
    let mut steps: Vec<u64> = stores
        .iter()
        .flat_map(|(_, held)| held.iter().map(|h| h.step))
        .collect();
    steps.sort_unstable_by_key(|&s| std::cmp::Reverse(s));
    steps.dedup();
    for step in steps {
        let at: Vec<(usize, Option<&Held>)> = stores
            .iter()
            .map(|(leader, held)| (*leader, held.iter().find(|h| h.step == step)))
            .collect();
        let worlds: Vec<usize> = at.iter().filter_map(|(_, h)| h.map(|h| h.world)).collect();
        let world = worlds[0];
        if worlds.iter().any(|&w| w != world) {
            continue;
        }
        let holder = |file: usize| {
            at.iter()
                .find(|(_, h)| h.is_some_and(|h| h.ranks.contains(&file)))
                .map(|(leader, _)| *leader)
        };
        if (0..world).any(|file| holder(file).is_none()) {
            continue;
        }
        let mut transfers = Vec::new();
        for (leader, held) in &at {
            for file in 0..world {
                if !held.is_some_and(|h| h.ranks.contains(&file)) {
                    let from = holder(file).expect("checked above");
                    transfers.push(Transfer {
                        file,
                        from,
                        to: *leader,
                    });
                }
            }
        }
        return Some(Recovery {
            step,
            world,
            transfers,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(step: u64, world: usize, ranks: &[usize]) -> Held {
        Held {
            step,
            world,
            ranks: ranks.to_vec(),
        }
    }

    fn view(node: &str, held: Vec<Held>) -> RankView {
        RankView {
            node: node.into(),
            held,
        }
    }

    #[test]
    fn copies_go_to_the_same_index_on_the_next_node() {
        let ids: Vec<String> = ["a", "a", "b", "b", "c", "c"].map(String::from).to_vec();
        assert_eq!(
            buddies(&ids),
            [Some(2), Some(3), Some(4), Some(5), Some(0), Some(1)]
        );
        let one: Vec<String> = vec!["a".into(); 3];
        assert_eq!(buddies(&one), [None, None, None]);
        // Every shard's copy is on another node: losing one node loses no shard.
        for (rank, buddy) in buddies(&ids).iter().enumerate() {
            assert_ne!(ids[rank], ids[buddy.unwrap()]);
        }
    }

    #[test]
    fn the_newest_whole_snapshot_is_chosen_and_missing_files_move() {
        // Two nodes of two ranks; node b was replaced (its store is empty); node a holds its
        // own shards and copies of b's at steps 20 and 10.
        let a = vec![held(20, 4, &[0, 1, 2, 3]), held(10, 4, &[0, 1, 2, 3])];
        let views = vec![
            view("a", a.clone()),
            view("a", a),
            view("b", vec![]),
            view("b", vec![]),
        ];
        let plan = plan(&views).unwrap();
        assert_eq!((plan.step, plan.world), (20, 4));
        let moved: Vec<(usize, usize, usize)> = plan
            .transfers
            .iter()
            .map(|t| (t.file, t.from, t.to))
            .collect();
        assert_eq!(moved, [(0, 0, 2), (1, 0, 2), (2, 0, 2), (3, 0, 2)]);
    }

    #[test]
    fn a_snapshot_missing_a_shard_everywhere_is_passed_over() {
        // Step 20 lost rank 1's file and its copy; step 10 survives whole across the nodes.
        let views = vec![
            view("a", vec![held(20, 2, &[0]), held(10, 2, &[0])]),
            view("b", vec![held(10, 2, &[1])]),
        ];
        let plan = plan(&views).unwrap();
        assert_eq!(plan.step, 10);
        assert_eq!(plan.transfers.len(), 2);
        // Nothing survives whole: the caller falls back to disk.
        let lost = vec![view("a", vec![held(20, 2, &[0])]), view("b", vec![])];
        assert_eq!(super::plan(&lost), None);
        assert_eq!(super::plan(&[view("a", vec![])]), None);
    }
}
