//! Liveness: a worker that stops heartbeating is declared dead (over real gRPC).

use std::time::{Duration, Instant};

use ps::env::JobSettings;
use ps::proto::scheduler_client::SchedulerClient;
use ps::proto::scheduler_server::Scheduler as _;
use ps::proto::scheduler_server::SchedulerServer;
use ps::proto::{
    GetServersRequest, HeartbeatRequest, RegisterServerRequest, RegisterWorkerRequest, Role,
};
use ps::scheduler::SchedulerService;

use crate::util::ps_config;

#[test]
fn a_silent_worker_is_declared_dead_and_a_beating_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(
        dir.path(),
        "heartbeat_ms = 50\ndead_after_ms = 300",
        "max_steps = 4",
    );
    let settings = JobSettings::from_keys(config.ps().unwrap(), 1, 2, &config);
    let service = SchedulerService::new(&settings, 32);
    let rt = ps::scheduler::runtime(2).unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(SchedulerServer::new(service.clone()))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        let mut client = SchedulerClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        for worker_id in [0, 1] {
            client
                .register_worker(RegisterWorkerRequest {
                    worker_id,
                    restart_count: 0,
                    incarnation: u64::from(worker_id),
                })
                .await
                .unwrap();
        }
        // Worker 0 beats; worker 1 is silent. A bound far above dead_after keeps the test
        // from hanging if liveness breaks.
        let give_up = Instant::now() + Duration::from_secs(30);
        while !service.dead_workers().contains(&1) {
            assert!(Instant::now() < give_up, "worker 1 was never declared dead");
            client
                .heartbeat(HeartbeatRequest {
                    role: Role::Worker as i32,
                    id: 0,
                    step: 0,
                })
                .await
                .unwrap();
            service.sweep().unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(service.live_workers(), vec![0]);
        // The dead worker's heartbeat is answered with "register again".
        let reply = client
            .heartbeat(HeartbeatRequest {
                role: Role::Worker as i32,
                id: 1,
                step: 0,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(reply.rejoin);
    });
}

/// A server declared dead that never registers again (nothing restarted it, or it hangs)
/// fails the job naming it, once a restarted process would have had time to start
/// (`ps.rpc_timeout_ms` × (`ps.rpc_retries` + 1)); the job does not wait for it forever.
#[test]
fn a_dead_server_nothing_restarts_fails_the_job_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(
        dir.path(),
        "heartbeat_ms = 20\ndead_after_ms = 100\nrpc_timeout_ms = 200\nrpc_retries = 0",
        "max_steps = 4",
    );
    let settings = JobSettings::from_keys(config.ps().unwrap(), 1, 1, &config);
    let service = SchedulerService::new(&settings, 32);
    let rt = ps::scheduler::runtime(1).unwrap();
    rt.block_on(
        service.register_server(tonic::Request::new(RegisterServerRequest {
            server_id: 0,
            addr: "127.0.0.1:1".to_string(),
            restart_count: 0,
            incarnation: 7,
        })),
    )
    .unwrap();
    // Server 0 never beats again. A bound far above the wait keeps the test from hanging.
    let give_up = Instant::now() + Duration::from_secs(60);
    let err = loop {
        match service.sweep() {
            Err(e) => break e.to_string(),
            Ok(()) => {
                assert!(
                    Instant::now() < give_up,
                    "the job waits forever for server 0, which nothing restarts"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    assert!(err.contains("server 0 was declared dead"), "{err}");
    assert!(err.contains("did not register again within 0.2 s"), "{err}");
}

/// GetServers tells the workers which servers the scheduler waits for to restart (declared
/// dead, how long ago), its restart wait, and how long each live server has been silent: what
/// a worker whose retries are spent decides by (docs/PS.md, Failures).
#[test]
fn get_servers_reports_the_dead_servers_and_the_restart_wait() {
    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(
        dir.path(),
        "heartbeat_ms = 20\ndead_after_ms = 100\nrpc_timeout_ms = 2000\nrpc_retries = 2",
        "max_steps = 4",
    );
    let settings = JobSettings::from_keys(config.ps().unwrap(), 2, 1, &config);
    let service = SchedulerService::new(&settings, 32);
    let rt = ps::scheduler::runtime(1).unwrap();
    for server_id in 0..2 {
        rt.block_on(
            service.register_server(tonic::Request::new(RegisterServerRequest {
                server_id,
                addr: format!("127.0.0.1:{}", 1 + server_id),
                restart_count: 0,
                incarnation: 7 + u64::from(server_id),
            })),
        )
        .unwrap();
    }
    let get = || {
        rt.block_on(service.get_servers(tonic::Request::new(GetServersRequest {})))
            .unwrap()
            .into_inner()
    };
    let first = get();
    assert_eq!(first.restart_wait_ms, 6000, "2000 ms × (2 + 1)");
    assert!(first.dead.is_empty());
    assert!(first.servers.iter().all(|s| s.silent_ms < 100), "{first:?}");
    // Server 0 beats, server 1 falls silent past dead_after_ms.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(250) {
        let beat = HeartbeatRequest {
            role: Role::Server as i32,
            id: 0,
            ..Default::default()
        };
        rt.block_on(service.heartbeat(tonic::Request::new(beat)))
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let reply = get();
    assert!(
        reply
            .servers
            .iter()
            .any(|s| s.server_id == 1 && s.silent_ms >= 200),
        "{reply:?}"
    );
    service.sweep().unwrap();
    let reply = get();
    assert_eq!(
        reply
            .servers
            .iter()
            .map(|s| s.server_id)
            .collect::<Vec<_>>(),
        vec![0]
    );
    assert_eq!(reply.dead.len(), 1, "{reply:?}");
    assert_eq!(reply.dead[0].server_id, 1);
    assert!(
        reply.dead[0].dead_for_ms < reply.restart_wait_ms,
        "{reply:?}"
    );
}
