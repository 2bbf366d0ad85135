//! Which server holds which parameter: whole parameters, balanced by bytes.

/// One parameter as the partitioner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSize {
    /// The name.
    pub name: String,
    /// Its size in bytes.
    pub bytes: usize,
}

/// Assigns every parameter to one of `servers` servers: the largest first, each to the server
/// holding the fewest bytes so far (ties: the lower server id). Every process computes the same
/// assignment from the same list. Returns, per parameter (in the order given), its server.
pub fn partition(params: &[ParamSize], servers: usize) -> Vec<usize> {
    let servers = servers.max(1);
    let mut order: Vec<usize> = (0..params.len()).collect();
    // Stable: equal sizes keep their program order.
    order.sort_by(|&a, &b| params[b].bytes.cmp(&params[a].bytes));
    let mut load = vec![0usize; servers];
    let mut owner = vec![0usize; params.len()];
    for i in order {
        let (server, _) = load
            .iter()
            .enumerate()
            .min_by_key(|&(s, &bytes)| (bytes, s))
            .unwrap_or((0, &0));
        owner[i] = server;
        load[server] += params[i].bytes;
    }
    owner
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(bytes: &[usize]) -> Vec<ParamSize> {
        bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| ParamSize {
                name: format!("p{i}"),
                bytes: b,
            })
            .collect()
    }

    #[test]
    fn largest_first_to_the_lightest_server() {
        // 100 → s0, 60 → s1, 50 → s1 (60 < 100), 10 → s0 (100 < 110).
        assert_eq!(partition(&sizes(&[10, 100, 50, 60]), 2), vec![0, 0, 1, 1]);
    }

    #[test]
    fn one_server_holds_everything_and_more_servers_than_params_leave_some_empty() {
        assert_eq!(partition(&sizes(&[3, 2, 1]), 1), vec![0, 0, 0]);
        assert_eq!(partition(&sizes(&[3, 2]), 4), vec![0, 1]);
    }

    #[test]
    fn loads_differ_by_at_most_the_largest_parameter() {
        let params = sizes(&[401_408, 512, 1_280, 10, 65_536, 640, 7, 9]);
        for servers in 1..=4 {
            let owner = partition(&params, servers);
            let mut load = vec![0; servers];
            for (p, &s) in params.iter().zip(&owner) {
                load[s] += p.bytes;
            }
            let (lo, hi) = (load.iter().min().unwrap(), load.iter().max().unwrap());
            assert!(hi - lo <= 401_408, "{servers} servers: {load:?}");
        }
    }
}
