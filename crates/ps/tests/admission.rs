//! Job admission over real gRPC: a caller without the job's secret (or with another job's)
//! can neither end the job nor register, nor call a server; a caller with the secret cannot
//! register an id that is alive in another process.

use std::time::{Duration, Instant};

use ps::auth::{AttachSecret, JobSecret};
use ps::proto::parameter_server_client::ParameterServerClient;
use ps::proto::scheduler_client::SchedulerClient;
use ps::proto::*;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::Channel;
use tonic::Code;

use crate::util::{env_of, ps_config, scheduler_addr, secret_of};

/// Longest wait for the server to register (a guard against a hang, not a timing check).
const GUARD: Duration = Duration::from_secs(120);

/// Adds the job's secret to every call, or (`None`) nothing.
#[derive(Clone)]
struct MaybeSecret(Option<AttachSecret>);

impl Interceptor for MaybeSecret {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        match &mut self.0 {
            Some(attach) => attach.call(request),
            None => Ok(request),
        }
    }
}

/// A client of `addr` whose calls carry `secret` (none: no secret at all).
async fn scheduler(
    addr: &str,
    secret: Option<&JobSecret>,
) -> SchedulerClient<InterceptedService<Channel, MaybeSecret>> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("the scheduler accepts connections");
    SchedulerClient::with_interceptor(channel, attach(secret))
}

/// An interceptor adding `secret`, or nothing.
fn attach(secret: Option<&JobSecret>) -> MaybeSecret {
    MaybeSecret(secret.map(|s| AttachSecret::new(s).unwrap()))
}

/// Asserts that `result` is a refusal with `code` whose message contains `text`.
fn refused<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, text: &str) {
    let status = result.expect_err("the call is refused");
    assert_eq!(status.code(), code, "{}", status.message());
    assert!(status.message().contains(text), "{}", status.message());
}

#[test]
fn only_the_jobs_own_processes_are_admitted() {
    let dir = tempfile::tempdir().unwrap();
    // No worker of the job runs: the scheduler and a server wait for the test's calls. A long
    // dead_after keeps the worker the test registers alive until the test ends the job.
    let config = ps_config(
        dir.path(),
        "servers = 1\nworkers = 1\nheartbeat_ms = 50\ndead_after_ms = 600000",
        "max_steps = 4",
    );
    let addr = scheduler_addr();
    let secret = secret_of(&addr);
    let roles: Vec<_> = [0, 1]
        .into_iter()
        .map(|rank| {
            let (config, env) = (config.clone(), env_of(rank, 1, 1, &addr));
            std::thread::spawn(move || ps::run_role(&config, &env, None))
        })
        .collect();
    let rt = ps::scheduler::runtime(2).unwrap();
    rt.block_on(async {
        // Connect (the scheduler binds a moment after its thread starts).
        let start = Instant::now();
        let mut own = loop {
            if let Ok(channel) = Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
            {
                break SchedulerClient::with_interceptor(channel, attach(Some(&secret)));
            }
            assert!(start.elapsed() < GUARD, "the scheduler never listened");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let server_addr = loop {
            let servers = own.get_servers(GetServersRequest {}).await.unwrap();
            if let Some(s) = servers.into_inner().servers.first() {
                break s.addr.clone();
            }
            assert!(start.elapsed() < GUARD, "the server never registered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };

        // Without the secret, or with another job's: refused, naming the variable.
        let other = JobSecret::generate().unwrap();
        for (secret, text) in [
            (None, "carries no"),
            (Some(&other), "not this job's secret"),
        ] {
            let mut stray = scheduler(&addr, secret).await;
            refused(
                stray.finish(FinishRequest {}).await,
                Code::Unauthenticated,
                text,
            );
            refused(
                stray
                    .register_worker(RegisterWorkerRequest {
                        worker_id: 0,
                        restart_count: 0,
                        incarnation: 7,
                    })
                    .await,
                Code::Unauthenticated,
                "TESSERA_JOB_SECRET",
            );
            let channel = Channel::from_shared(format!("http://{server_addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut server = ParameterServerClient::with_interceptor(channel, attach(secret));
            refused(
                server
                    .pull(PullRequest {
                        worker_id: 0,
                        min_version: 0,
                        ..Default::default()
                    })
                    .await,
                Code::Unauthenticated,
                "server 0 refuses the call",
            );
        }
        // The refused Finish did not end the job.
        let beat = own
            .heartbeat(HeartbeatRequest {
                role: Role::Server as i32,
                id: 0,
                step: 0,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!beat.shutdown, "a stray Finish ended the job");

        // With the secret: a live id is not taken by a second process.
        refused(
            own.register_server(RegisterServerRequest {
                server_id: 0,
                addr: "127.0.0.1:1".to_string(),
                restart_count: 0,
                incarnation: 7,
            })
            .await,
            Code::AlreadyExists,
            "server 0 is alive",
        );
        let register = |incarnation| RegisterWorkerRequest {
            worker_id: 0,
            restart_count: 0,
            incarnation,
        };
        own.register_worker(register(1)).await.unwrap();
        // The same process again (a reply lost on the way) is admitted; another is not, nor a
        // caller that gives no incarnation (0).
        own.register_worker(register(1)).await.unwrap();
        for other in [2, 0] {
            refused(
                own.register_worker(register(other)).await,
                Code::AlreadyExists,
                "worker 0 is alive",
            );
        }

        own.finish(FinishRequest {}).await.unwrap();
    });
    for (rank, role) in roles.into_iter().enumerate() {
        let outcome = role.join().expect("the role thread does not panic");
        assert!(outcome.is_ok(), "rank {rank}: {:?}", outcome.err());
    }
}

#[test]
fn a_role_without_the_secret_refuses_to_start_naming_it() {
    let vars = ps::launch::role_env(2, 1, 1, "127.0.0.1:1", &JobSecret::generate().unwrap());
    let without: Vec<_> = vars
        .into_iter()
        .filter(|(k, _)| k != "TESSERA_JOB_SECRET")
        .collect();
    let err = ps::RoleEnv::from_lookup(|name| {
        without
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("TESSERA_JOB_SECRET") && err.contains("must be set"),
        "{err}"
    );
}
