//! HYBRID_PARALLEL (MindSpore's `parallel_mode="hybrid_parallel"`; JAX's `shard_map`): the
//! user's closure runs on every rank of a mesh with its rank, the mesh and a communicator, and
//! slices parameters and inserts communication by hand. Tessera plans nothing here; it gives
//! the closure its place in the mesh, its slice of any layout and the communicators of mesh
//! axes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use comm::{Communicator, LocalCluster};
use layout::{Layout, Mesh, SliceBox};

use crate::error::RuntimeError;

/// One rank's view inside a hybrid-parallel closure.
pub struct HybridRank {
    rank: usize,
    slot: usize,
    mesh: Mesh,
    world: Arc<dyn Communicator>,
    groups: HashMap<Vec<usize>, Box<dyn Communicator>>,
}

impl std::fmt::Debug for HybridRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridRank")
            .field("rank", &self.rank)
            .field("mesh", &self.mesh)
            .finish_non_exhaustive()
    }
}

impl HybridRank {
    /// This rank of `world`, placed in `mesh` (which must hold it and span `world`'s ranks).
    pub fn new(mesh: Mesh, world: Arc<dyn Communicator>) -> Result<HybridRank, RuntimeError> {
        let rank = world.rank();
        if mesh.n_devices() != world.size() {
            return Err(RuntimeError::Mismatch {
                what: "the hybrid-parallel mesh".to_string(),
                expected: format!("{} devices (the communicator's ranks)", world.size()),
                got: format!("{} devices", mesh.n_devices()),
            });
        }
        let slot = mesh
            .slot_of_rank(rank)
            .ok_or_else(|| RuntimeError::Mismatch {
                what: "the hybrid-parallel mesh".to_string(),
                expected: format!("a mesh holding rank {rank}"),
                got: format!("ranks {:?}", mesh.device_ranks()),
            })?;
        Ok(HybridRank {
            rank,
            slot,
            mesh,
            world,
            groups: HashMap::new(),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The communicator of every rank.
    pub fn world(&self) -> &dyn Communicator {
        self.world.as_ref()
    }

    /// This rank's coordinate along mesh axis `axis`.
    pub fn coordinate(&self, axis: &str) -> Result<usize, RuntimeError> {
        let a = self.mesh.axis_index(axis)?;
        Ok(self.mesh.coord_along(self.slot, a))
    }

    /// The size of mesh axis `axis`.
    pub fn axis_size(&self, axis: &str) -> Result<usize, RuntimeError> {
        Ok(self.mesh.axis_size(self.mesh.axis_index(axis)?))
    }

    /// The communicator of the ranks that differ from this one only along `axes` (group rank
    /// `i` is the `i`-th of them in mesh order), created on first use. Every rank of the
    /// group must ask for it, in the same order as its other groups.
    pub fn axis_group(&mut self, axes: &[&str]) -> Result<&dyn Communicator, RuntimeError> {
        let indices = axes
            .iter()
            .map(|a| self.mesh.axis_index(a))
            .collect::<Result<Vec<_>, _>>()?;
        let ranks: Vec<usize> = self
            .mesh
            .slots_varying(self.slot, &indices)
            .into_iter()
            .map(|s| self.mesh.device_of_slot(s))
            .collect();
        if !self.groups.contains_key(&ranks) {
            let group = self.world.group(&ranks)?;
            self.groups.insert(ranks.clone(), group);
        }
        Ok(self.groups[&ranks].as_ref())
    }

    /// This rank's box of a tensor of `shape` laid out as `layout` (whose mesh must be this
    /// mesh): what to slice out of the full parameter by hand.
    pub fn slice_box(&self, layout: &Layout, shape: &[usize]) -> Result<SliceBox, RuntimeError> {
        let bound = layout.bind(shape)?;
        Ok(bound.rank_box(self.rank)?)
    }
}

/// Runs `f` on every rank of `mesh`, each a thread of this process (the `local` backend, every
/// wait bounded by `timeout`), and returns each rank's result in rank order; the first failing
/// rank's error (a rank's own error before a peer's "peer failed") if any fails.
pub fn run_hybrid<R, F>(mesh: &Mesh, timeout: Duration, f: F) -> Result<Vec<R>, RuntimeError>
where
    R: Send,
    F: Fn(&mut HybridRank) -> Result<R, RuntimeError> + Sync,
{
    let cluster = LocalCluster::new(mesh.n_devices())?.with_timeout(timeout);
    let results = cluster.run(|comm| {
        let mut place = HybridRank::new(mesh.clone(), Arc::new(comm))?;
        f(&mut place)
    });
    crate::launch::root_cause(results)
}
