//! Sub-communicators: `MPI_Comm_create_group` over the parent's communicator.

use std::sync::{Arc, Mutex};

use super::world::EndpointState;
use super::MpiComm;
use crate::error::CommError;

impl MpiComm {
    /// The communicator of `ranks` (group ranks of `self`, in the new group's rank order), of
    /// which this rank must be one; every member must call it.
    pub(super) fn create_group(&self, ranks: &[usize]) -> Result<MpiComm, CommError> {
        let mut call = self.enter("group")?;
        if let Some(&bad) = ranks.iter().find(|&&r| r >= self.size) {
            return Err(call.invalid(format!(
                "rank {bad} in {ranks:?} is outside the group (size {})",
                self.size
            )));
        }
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(call.invalid(format!("ranks {ranks:?} repeat a rank")));
        }
        let Some(new_rank) = ranks.iter().position(|&r| r == self.rank) else {
            return Err(call.invalid(format!("this rank is not in {ranks:?}")));
        };
        let members: Vec<usize> = ranks.iter().map(|&r| self.members[r]).collect();
        let instance = call.state.groups_made.entry(members.clone()).or_insert(0);
        // Distinguishes concurrent creations on one parent by different member lists.
        let tag = crate::communicator::group_creation_tag(*instance as usize, &members) as i32;
        *instance += 1;
        let ranks_i32: Vec<i32> = ranks
            .iter()
            .map(|&r| call.count(r))
            .collect::<Result<_, _>>()?;
        let created = call.raw.create_group(&self.comm, &ranks_i32, tag);
        let comm = call.check(created)?;
        let coll = call.raw.dup(&comm);
        let coll = call.check(coll)?;
        let list: Vec<String> = members.iter().map(|m| m.to_string()).collect();
        Ok(MpiComm {
            runtime: self.runtime.clone(),
            comm,
            coll,
            rank: new_rank,
            size: ranks.len(),
            label: Arc::from(format!("world[{}]", list.join(","))),
            members,
            timeout: self.timeout,
            on_timeout: self.on_timeout,
            state: Mutex::new(EndpointState::default()),
        })
    }
}
