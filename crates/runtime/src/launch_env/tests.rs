//! Tests of the `TESSERA_*` contract: roles, secrets, process and MPI variables.

use super::*;

fn secret() -> JobSecret {
    JobSecret::new("s".repeat(32)).unwrap()
}

#[test]
fn secrets_are_checked_and_never_shown() {
    let secret = JobSecret::generate().unwrap();
    assert_eq!(secret.expose().len(), 64);
    assert_ne!(secret, JobSecret::generate().unwrap());
    assert_eq!(format!("{secret:?}"), "JobSecret(<redacted>)");
    for bad in ["short", "has a space in the middle!!", &"x".repeat(2000)] {
        let err = JobSecret::from_env_value(Some(bad.to_string()))
            .unwrap_err()
            .to_string();
        assert!(err.contains(JOB_SECRET) && !err.contains(bad), "{err}");
    }
    let missing = JobSecret::from_env_value(None).unwrap_err().to_string();
    assert!(missing.contains("must be set"), "{missing}");
}

#[test]
fn ranks_are_the_scheduler_then_servers_then_workers() {
    let roles: Vec<(Role, usize)> = (0..5).map(|r| Role::of_rank(r, 2)).collect();
    assert_eq!(
        roles,
        [
            (Role::Scheduler, 0),
            (Role::Server, 0),
            (Role::Server, 1),
            (Role::Worker, 0),
            (Role::Worker, 1)
        ]
    );
    for role in [Role::Scheduler, Role::Server, Role::Worker] {
        assert_eq!(Role::parse(role.name()), Some(role));
    }
}

#[test]
fn what_a_launcher_writes_a_role_reads() {
    let secret = secret();
    let vars = ProcessVars {
        role: Role::Server,
        id: 1,
        rank: 2,
        world_size: 5,
        local_rank: Some(2),
        device_id: None,
        num_servers: 2,
        num_workers: 2,
        scheduler_addr: Some("127.0.0.1:4242"),
        restart_count: 3,
        secret: Some(&secret),
    }
    .vars();
    assert!(vars.iter().all(|(k, _)| LAUNCHER_VARS.contains(k)));
    let env = RoleEnv::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .unwrap()
    .unwrap();
    assert_eq!(
        (env.role, env.rank, env.world_size, env.server_id),
        (Role::Server, 2, 5, 1)
    );
    assert_eq!((env.num_servers, env.num_workers), (Some(2), Some(2)));
    assert_eq!(
        (env.scheduler_addr.as_str(), env.restart_count),
        ("127.0.0.1:4242", 3)
    );
    assert_eq!(env.secret, secret);
}

/// MindSpore's names: every role's `MS_ROLE`, the counts and the scheduler's host and port;
/// a worker's rank and device; none of a worker's for the scheduler or a server.
#[test]
fn mindspore_scripts_find_their_variables() {
    let of = |role: Role, id: usize| {
        ProcessVars {
            role,
            id,
            rank: 3 + id,
            world_size: 5,
            local_rank: Some(3 + id),
            device_id: Some(id),
            num_servers: 2,
            num_workers: 2,
            scheduler_addr: Some("10.0.0.1:4242"),
            restart_count: 0,
            secret: None,
        }
        .vars()
    };
    let get = |vars: &[(&str, String)], name: &str| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    };
    let worker = of(Role::Worker, 1);
    for (name, value) in [
        (MS_ROLE, "MS_WORKER"),
        (MS_WORKER_NUM, "2"),
        (MS_SERVER_NUM, "2"),
        (MS_SCHED_HOST, "10.0.0.1"),
        (MS_SCHED_PORT, "4242"),
        (RANK_ID, "1"),
        (RANK_SIZE, "2"),
        (MS_NODE_ID, "1"),
        (DEVICE_ID, "1"),
    ] {
        assert_eq!(get(&worker, name).as_deref(), Some(value), "{name}");
    }
    for (role, name) in [(Role::Scheduler, "MS_SCHED"), (Role::Server, "MS_PSERVER")] {
        let vars = of(role, 0);
        assert_eq!(get(&vars, MS_ROLE).as_deref(), Some(name));
        for absent in [RANK_ID, RANK_SIZE, MS_NODE_ID, DEVICE_ID] {
            assert_eq!(get(&vars, absent), None, "{name}: {absent}");
        }
        assert!(vars.iter().all(|(k, _)| LAUNCHER_VARS.contains(k)));
    }
    assert!(worker.iter().all(|(k, _)| LAUNCHER_VARS.contains(k)));
}

/// OpenMPI's and Hydra's rank variables become the contract of a collective worker.
#[test]
fn an_mpi_launchers_rank_becomes_the_contract() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let ompi = env(&[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
    ]);
    assert_eq!(mpi_launcher_rank(ompi).unwrap(), Some((3, 4, 1)));
    let hydra = env(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]);
    assert_eq!(mpi_launcher_rank(hydra).unwrap(), Some((0, 2, 0)));
    assert_eq!(mpi_launcher_rank(env(&[])).unwrap(), None);
    for (bad, var) in [
        (&[("OMPI_COMM_WORLD_RANK", "1")][..], "OMPI_COMM_WORLD_SIZE"),
        (
            &[("OMPI_COMM_WORLD_RANK", "x"), ("OMPI_COMM_WORLD_SIZE", "2")][..],
            "OMPI_COMM_WORLD_RANK",
        ),
        (
            &[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "2")][..],
            "OMPI_COMM_WORLD_RANK",
        ),
        // A world of no rank is the size's fault, not the rank's.
        (
            &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "0")][..],
            "OMPI_COMM_WORLD_SIZE",
        ),
        (
            &[
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_SIZE", "4"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ][..],
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ),
        (
            &[
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_SIZE", "18446744073709551615"),
            ][..],
            "OMPI_COMM_WORLD_SIZE",
        ),
    ] {
        let pairs: Vec<(String, String)> = bad
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let err = mpi_launcher_rank(|name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
        .unwrap_err();
        assert_eq!(err.var, var, "{err}");
    }
    let vars = mpi_rank_vars(3, 4, 1, 2);
    let get = |name: &str| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get(ROLE), Some("worker"));
    assert_eq!(
        (get(RANK), get(WORLD_SIZE), get(LOCAL_RANK)),
        (Some("3"), Some("4"), Some("1"))
    );
    assert_eq!(
        (get(RANK_ID), get(RANK_SIZE), get(DEVICE_ID)),
        (Some("3"), Some("4"), Some("1"))
    );
    assert_eq!(get(BACKEND), Some("mpi"));
    assert_eq!(get(RESTART_COUNT), Some("2"));
    assert_eq!(get(SCHEDULER_ADDR), None);
}

#[test]
fn errors_name_the_variable() {
    let read = |vars: &[(&str, &str)]| {
        RoleEnv::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    };
    let addr = (SCHEDULER_ADDR, "h:1");
    let secret = (JOB_SECRET, "a-job-secret-of-enough-length");
    for (vars, var) in [
        (vec![(ROLE, "boss"), addr, secret], ROLE),
        (vec![(ROLE, "worker"), addr, secret], WORKER_ID),
        (vec![(ROLE, "scheduler"), secret], SCHEDULER_ADDR),
        (
            vec![(ROLE, "scheduler"), (SCHEDULER_ADDR, "h"), secret],
            SCHEDULER_ADDR,
        ),
        (vec![(ROLE, "scheduler"), addr, (RANK, "-1"), secret], RANK),
        (
            vec![(ROLE, "scheduler"), addr, (SERVER_PORT, "70000"), secret],
            SERVER_PORT,
        ),
        (
            vec![(ROLE, "scheduler"), addr, (SERVER_JOIN, "yes"), secret],
            SERVER_JOIN,
        ),
        (vec![(ROLE, "scheduler"), addr], JOB_SECRET),
        // A port above 65535, and ids no job can have (2^32 used to be cut to worker 0).
        (
            vec![(ROLE, "scheduler"), (SCHEDULER_ADDR, "h:99999"), secret],
            SCHEDULER_ADDR,
        ),
        (
            vec![(ROLE, "worker"), addr, (WORKER_ID, "4294967296"), secret],
            WORKER_ID,
        ),
        (
            vec![(ROLE, "server"), addr, (SERVER_ID, "4294967298"), secret],
            SERVER_ID,
        ),
    ] {
        let err = read(&vars).unwrap_err();
        assert_eq!(err.var, var, "{err}");
        assert!(err.to_string().starts_with(&format!("environment {var}: ")));
    }
}
