//! Adding servers mid-run (elasticity): the partition map moves to the enlarged server set at a
//! step boundary, the old owners hand the moved parameters over with their optimizer state,
//! and training goes on exactly as an uninterrupted run.

use std::time::Duration;

use crate::util::{
    final_accuracy, loss_lines, ps_config, ps_text, run_in_process, scheduler_addr, RoleProcess,
};

const LIMIT: Duration = Duration::from_secs(180);

/// The environment of a server added as `id` to a job started with `servers` servers and
/// `workers` workers: the launcher's counts stay, the id is the next one.
fn added_server_env(
    id: usize,
    servers: usize,
    workers: usize,
    addr: &str,
) -> Vec<(String, String)> {
    let mut env = crate::util::role_env(1, servers, workers, addr);
    for (k, v) in env.iter_mut() {
        if k == "TESSERA_SERVER_ID" {
            *v = id.to_string();
        }
    }
    env.push(("TESSERA_SERVER_JOIN".to_string(), "1".to_string()));
    env
}

/// A job of 1 server and 2 workers as processes (rank 0 scheduler, 1 server 0, 2..3 workers
/// 0..1), once worker 0 has reached step 5.
fn start_job(config: &std::path::Path, addr: &str) -> Vec<RoleProcess> {
    let mut job: Vec<RoleProcess> = (0..4)
        .map(|rank| RoleProcess::start(config, &crate::util::role_env(rank, 1, 2, addr)))
        .collect();
    assert!(
        job[2].wait_for_line("epoch: 1 step: 5,", LIMIT),
        "worker 0 reached step 5:\n{}",
        job[2].output()
    );
    job
}

/// The step a `partition map of epoch E committed: S servers from step K` line names.
fn switch_step(scheduler: &str, epoch: u64) -> u64 {
    let marker = format!("partition map of epoch {epoch} committed: ");
    scheduler
        .lines()
        .find_map(|l| {
            l.split_once(marker.as_str())
                .map(|(_, rest)| rest.to_string())
        })
        .and_then(|rest| rest.rsplit(' ').next().and_then(|n| n.parse().ok()))
        .unwrap_or_else(|| panic!("no commit of epoch {epoch}:\n{scheduler}"))
}

#[test]
fn servers_added_mid_run_take_over_parameters_and_the_losses_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let train = "epochs = 3\neval = false";
    let config = dir.path().join("ps.toml");
    std::fs::write(
        &config,
        ps_text(
            &dir.path().join("out"),
            "servers = 1\nworkers = 2\nheartbeat_ms = 100\ndead_after_ms = 3000",
            train,
        ),
    )
    .unwrap();
    let addr = scheduler_addr();
    let mut job = start_job(&config, &addr);
    // 1 → 2 servers, then 2 → 3 once the first map is committed.
    let mut added = vec![RoleProcess::start(
        &config,
        &added_server_env(1, 1, 2, &addr),
    )];
    assert!(
        job[0].wait_for_line("partition map of epoch 1 committed", LIMIT),
        "scheduler:\n{}\nserver 1:\n{}",
        job[0].output(),
        added[0].output()
    );
    added.push(RoleProcess::start(
        &config,
        &added_server_env(2, 1, 2, &addr),
    ));
    assert!(
        job[0].wait_for_line("partition map of epoch 2 committed", LIMIT),
        "scheduler:\n{}\nserver 2:\n{}",
        job[0].output(),
        added[1].output()
    );
    let ok: Vec<bool> = job.iter_mut().map(|p| p.finish(LIMIT)).collect();
    let added_ok: Vec<bool> = added.iter_mut().map(|p| p.finish(LIMIT)).collect();
    assert_eq!(
        (ok, added_ok),
        (vec![true; 4], vec![true; 2]),
        "scheduler:\n{}\nserver 0:\n{}\nserver 1:\n{}\nserver 2:\n{}\nworker 0:\n{}",
        job[0].output(),
        job[1].output(),
        added[0].output(),
        added[1].output(),
        job[2].output()
    );
    let scheduler = job[0].output();
    let (first, second) = (switch_step(&scheduler, 1), switch_step(&scheduler, 2));
    assert!(
        5 < first && first <= second && second < 138,
        "{first} {second}"
    );
    // The new servers own parameters: they received them with their optimizer state.
    for (id, server) in [(1, &added[0]), (2, &added[1])] {
        let out = server.output();
        let switched = out
            .lines()
            .find(|l| l.contains("switched to the partition map"))
            .unwrap_or_else(|| panic!("server {id} never switched:\n{out}"));
        assert!(!switched.contains("holds nothing"), "{switched}");
        assert!(!switched.contains("received nothing"), "{switched}");
    }
    assert!(
        job[1].output().contains("over to server 1"),
        "{}",
        job[1].output()
    );
    assert!(
        added[0].output().contains("over to server 2"),
        "{}",
        added[0].output()
    );
    // Every server's last snapshot holds what the 3-server map gives it.
    let params = ps::compute::Compute::new(&runtime::TrainConfig::load(&config, &[]).unwrap())
        .unwrap()
        .params()
        .to_vec();
    let owners = ps::migrate::owners(&params, 3);
    for server in 0..3 {
        let snapshot = ps::snapshot::snapshot_path(&dir.path().join("out"), server);
        let file = ckpt::CheckpointFile::open(&snapshot).expect("a snapshot");
        for (p, &owner) in params.iter().zip(&owners) {
            assert_eq!(
                file.read_tensor(&p.name).is_ok(),
                owner == server,
                "{} in {}",
                p.name,
                snapshot.display()
            );
        }
    }
    for w in [2, 3] {
        assert!(
            job[w]
                .output()
                .contains("routes by the partition map of epoch 2"),
            "{}",
            job[w].output()
        );
    }
    // Nothing lost: the losses are an uninterrupted run's, step for step.
    let losses = loss_lines(&job[2].output());
    assert_eq!(losses.len(), 138);
    let reference = run_in_process(
        &ps_config(
            &dir.path().join("reference"),
            "servers = 1\nworkers = 2",
            &format!("{train}\nper_print_times = 0"),
        ),
        1,
        2,
    );
    assert_eq!(reference.losses.len(), 138);
    for (i, (a, b)) in losses.iter().zip(&reference.losses).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5,
            "step {}: {a} vs uninterrupted {b}",
            i + 1
        );
    }
}

/// A server that switched to a later map refuses routes of an earlier one (and untagged ones)
/// with an error naming both epochs, serves the current one, and takes in a handover only of
/// parameters the new map gives it.
#[test]
fn stale_routes_and_misrouted_handovers_are_refused() {
    use ps::proto::parameter_server_server::ParameterServer;
    use ps::proto::{HandoverRequest, PullRequest};

    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(dir.path(), "servers = 1\nworkers = 2", "max_steps = 4");
    let settings = ps::env::JobSettings::from_keys(config.ps().unwrap(), 1, 2, &config);
    let compute = ps::compute::Compute::new(&config).unwrap();
    let all = compute.params().to_vec();
    let initial = compute.initial_params().unwrap();
    let service =
        ps::server::ServerService::new(&settings, &config, 0, &all, initial.clone(), false)
            .unwrap();
    service.enable_migration(all.clone(), Some(1));
    let rt = ps::scheduler::runtime(1).unwrap();
    let pull = || PullRequest {
        worker_id: 0,
        min_version: 0,
        ..Default::default()
    };
    rt.block_on(async {
        for request in [ps::migrate::tagged(pull(), 0), tonic::Request::new(pull())] {
            let err = service.pull(request).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::FailedPrecondition);
            assert!(
                err.message().contains(ps::migrate::STALE_ROUTE)
                    && err.message().contains("serves epoch 1"),
                "{}",
                err.message()
            );
        }
        let ok = service
            .pull(ps::migrate::tagged(pull(), 1))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ok.tensors.len(), all.len());
        // Under a 2-server map, server 0 keeps the largest parameter: handing it to server 0
        // again is fine, but one the map gives server 1 is refused, naming it.
        let owners = ps::migrate::owners(&all, 2);
        let theirs = owners
            .iter()
            .position(|&o| o == 1)
            .expect("server 1 owns one");
        let handover = |param: usize| HandoverRequest {
            from_server: 1,
            epoch: 2,
            servers: 2,
            version: 0,
            optimizer_steps: 0,
            last_loss: 0.0,
            weights: vec![ps::wire::to_msg(&all[param].name, &initial[param])],
            states: Vec::new(),
        };
        let err = service
            .handover(tonic::Request::new(handover(theirs)))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message().contains(&all[theirs].name)
                && err.message().contains("belongs to server 1"),
            "{}",
            err.message()
        );
        // Momentum keeps one state per parameter: a handover without it is refused.
        let mine = owners
            .iter()
            .position(|&o| o == 0)
            .expect("server 0 owns one");
        let err = service
            .handover(tonic::Request::new(handover(mine)))
            .await
            .unwrap_err();
        assert!(
            err.message().contains("optimizer state"),
            "{}",
            err.message()
        );
    });
}

/// Async training (bounded staleness) takes a server mid-run too: the map switches at a step
/// boundary, the new server owns parameters afterwards, and the job still reaches the seed
/// run's accuracy.
#[test]
fn a_server_added_to_an_async_run_takes_over_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ps.toml");
    std::fs::write(
        &config,
        ps_text(
            &dir.path().join("out"),
            "servers = 1\nworkers = 2\nsync = false\nstaleness = 2\nheartbeat_ms = 100\n\
             dead_after_ms = 3000",
            "epochs = 5\neval = true",
        ),
    )
    .unwrap();
    let addr = scheduler_addr();
    let mut job = start_job(&config, &addr);
    let mut added = RoleProcess::start(&config, &added_server_env(1, 1, 2, &addr));
    assert!(
        job[0].wait_for_line("partition map of epoch 1 committed", LIMIT),
        "scheduler:\n{}\nserver 1:\n{}",
        job[0].output(),
        added.output()
    );
    let ok: Vec<bool> = job.iter_mut().map(|p| p.finish(LIMIT)).collect();
    assert_eq!(
        (ok, added.finish(LIMIT)),
        (vec![true; 4], true),
        "scheduler:\n{}\nserver 0:\n{}\nserver 1:\n{}\nworker 0:\n{}",
        job[0].output(),
        job[1].output(),
        added.output(),
        job[2].output()
    );
    let out = added.output();
    let switched = out
        .lines()
        .find(|l| l.contains("switched to the partition map"))
        .unwrap_or_else(|| panic!("server 1 never switched:\n{out}"));
    assert!(!switched.contains("received nothing"), "{switched}");
    let worker0 = job[2].output();
    assert!(
        worker0.contains("routes by the partition map of epoch 1"),
        "{worker0}"
    );
    let accuracy = final_accuracy(&worker0).expect("an accuracy line");
    eprintln!("async run with a server added: {accuracy} %");
    // Async updates land in an order the machine's load decides: on a loaded 2-core machine
    // this run ends at 87.9–92 %, an untrained model at ~10 %.
    assert!(accuracy >= 85.0, "accuracy {accuracy} %\n{worker0}");
}

/// A server cannot join a job that is over: the join would open a partition map no step uses
/// (it used to be accepted, and the new server then waited on heartbeats until it failed). One
/// of the job's own servers may still register.
#[test]
fn a_server_cannot_join_a_job_that_is_over() {
    use ps::proto::scheduler_server::Scheduler;
    use ps::proto::{FinishRequest, RegisterServerRequest};

    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(dir.path(), "servers = 1\nworkers = 2", "max_steps = 4");
    let settings = ps::env::JobSettings::from_keys(config.ps().unwrap(), 1, 2, &config);
    let service = ps::scheduler::SchedulerService::new(&settings, 32);
    let register = |server_id, incarnation| {
        tonic::Request::new(RegisterServerRequest {
            server_id,
            addr: "127.0.0.1:1".to_string(),
            restart_count: 0,
            incarnation,
        })
    };
    let rt = ps::scheduler::runtime(1).unwrap();
    rt.block_on(async {
        service
            .finish(tonic::Request::new(FinishRequest {}))
            .await
            .unwrap();
        let err = service.register_server(register(1, 3)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(
            err.message()
                .contains("server 1 cannot be added: the job is over"),
            "{}",
            err.message()
        );
        service.register_server(register(0, 4)).await.unwrap();
    });
}
