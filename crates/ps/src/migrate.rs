//! Adding a server mid-run: the partition map, its epoch, and which parameters move.
//!
//! The **partition map** of a job is the byte-balanced [`crate::partition`] of its parameters
//! over `servers` servers, numbered by an **epoch** (0: the job's first map). When a server is
//! added (`TESSERA_SERVER_JOIN=1`, the next free `TESSERA_SERVER_ID`), the scheduler opens the
//! map of epoch + 1 over one more server and holds every worker at the first step not yet
//! begun (the *switch step*). Once every live worker waits there, each old owner hands the
//! parameters whose owner changed ([`moves`]) to their new owner with their optimizer state and
//! the counters (version, optimizer steps); every server switches to its new partition and
//! snapshots it, and the scheduler commits the map. Workers read the map's epoch in every
//! `BeginStep` reply, fetch the new map at the step boundary and tag every pull and push with
//! the epoch they route by ([`EPOCH_HEADER`]); a server refuses a request routed by another
//! epoch ([`stale_route`]), and the worker fetches the map again and retries.

use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

use crate::compute::ParamInfo;
use crate::partition::{partition, ParamSize};

/// The gRPC metadata key carrying the map epoch a pull or push routes by.
pub const EPOCH_HEADER: &str = "tessera-map-epoch";

/// The words every stale-route refusal contains (how a worker recognises one).
pub const STALE_ROUTE: &str = "stale partition map";

/// A partition map: its epoch and its number of servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionMap {
    /// 0 for the job's first map, one more per added server.
    pub epoch: u64,
    /// The servers the parameters are spread over (ids `0..servers`).
    pub servers: usize,
}

/// One parameter changing owner between two maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The parameter: an index into the job's parameters.
    pub param: usize,
    /// Its owner under the old map.
    pub from: usize,
    /// Its owner under the new map.
    pub to: usize,
}

/// Each parameter's server under a map of `servers` servers (the byte-balanced partition).
pub fn owners(params: &[ParamInfo], servers: usize) -> Vec<usize> {
    let sizes: Vec<ParamSize> = params
        .iter()
        .map(|p| ParamSize {
            name: p.name.clone(),
            bytes: p.bytes(),
        })
        .collect();
    partition(&sizes, servers)
}

/// The parameters whose owner differs between a map of `old` servers and one of `new`, in
/// parameter order.
pub fn moves(params: &[ParamInfo], old: usize, new: usize) -> Vec<Move> {
    owners(params, old)
        .into_iter()
        .zip(owners(params, new))
        .enumerate()
        .filter(|(_, (from, to))| from != to)
        .map(|(param, (from, to))| Move { param, from, to })
        .collect()
}

/// `message` tagged with the map epoch it routes by.
pub fn tagged<T>(message: T, epoch: u64) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert(EPOCH_HEADER, MetadataValue::from(epoch));
    request
}

/// The map epoch a request routes by, when it says (`None`: untagged or unreadable).
pub fn epoch_of<T>(request: &Request<T>) -> Option<u64> {
    request
        .metadata()
        .get(EPOCH_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Whether server `server_id`, serving the map of epoch `serving` (`None`: an added server not
/// yet switched to its first map), takes a `call` routed by `routed` (`None`: untagged, which
/// only the first map, epoch 0, takes). The refusal names both epochs and what to do.
pub fn stale_route(
    call: &str,
    server_id: usize,
    serving: Option<u64>,
    routed: Option<u64>,
) -> Result<(), Status> {
    let Some(serving) = serving else {
        return Err(Status::unavailable(format!(
            "{call}: server {server_id} is being added and serves once its partition is handed over"
        )));
    };
    if routed.unwrap_or(0) == serving {
        return Ok(());
    }
    let routed = routed.map_or("no epoch (epoch 0)".to_string(), |e| format!("epoch {e}"));
    Err(Status::failed_precondition(format!(
        "{call}: {STALE_ROUTE}: the request routes by {routed}, server {server_id} serves epoch {serving}; ask the scheduler for the current map (GetServers) and retry"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(bytes: &[usize]) -> Vec<ParamInfo> {
        bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| ParamInfo {
                name: format!("p{i}"),
                shape: vec![b / 4],
            })
            .collect()
    }

    #[test]
    fn adding_a_server_moves_exactly_the_parameters_whose_owner_changes() {
        // The seed MLP's sizes: fc1 (784×128), its bias, fc2 (128×128), bias, fc3, bias.
        let p = params(&[401_408, 512, 65_536, 512, 5_120, 40]);
        let one_to_two = moves(&p, 1, 2);
        assert!(!one_to_two.is_empty());
        assert!(one_to_two.iter().all(|m| m.from == 0 && m.to == 1));
        let (old, new) = (owners(&p, 1), owners(&p, 2));
        for (i, (a, b)) in old.iter().zip(&new).enumerate() {
            assert_eq!(a != b, one_to_two.iter().any(|m| m.param == i), "p{i}");
        }
        // The largest parameter stays; the new server holds something.
        assert_eq!(new[0], 0);
        assert!(new.contains(&1));
        assert!(moves(&p, 2, 2).is_empty());
    }

    #[test]
    fn a_route_is_taken_only_under_the_epoch_the_server_serves() {
        assert!(stale_route("Pull", 0, Some(0), None).is_ok());
        assert!(stale_route("Pull", 0, Some(2), Some(2)).is_ok());
        let stale = stale_route("Push", 1, Some(1), Some(0)).unwrap_err();
        assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
        assert!(stale.message().contains(STALE_ROUTE), "{}", stale.message());
        assert!(stale.message().contains("epoch 0") && stale.message().contains("epoch 1"));
        let untagged = stale_route("Pull", 1, Some(1), None).unwrap_err();
        assert!(
            untagged.message().contains("no epoch"),
            "{}",
            untagged.message()
        );
        let joining = stale_route("Pull", 2, None, Some(1)).unwrap_err();
        assert_eq!(joining.code(), tonic::Code::Unavailable);
    }

    #[test]
    fn the_epoch_travels_in_the_metadata() {
        let r = tagged((), 7);
        assert_eq!(epoch_of(&r), Some(7));
        assert_eq!(epoch_of(&Request::new(())), None);
    }
}
