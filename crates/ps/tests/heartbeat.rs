//! Liveness: a worker that stops heartbeating is declared dead (over real gRPC).

use std::time::{Duration, Instant};

use ps::env::JobSettings;
use ps::proto::scheduler_client::SchedulerClient;
use ps::proto::scheduler_server::Scheduler as _;
use ps::proto::scheduler_server::SchedulerServer;
use ps::proto::{HeartbeatRequest, RegisterServerRequest, RegisterWorkerRequest, Role};
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
