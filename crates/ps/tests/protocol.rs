//! A server refuses pushes that break the protocol, naming the rule, and changes nothing.

use ps::compute::Compute;
use ps::env::JobSettings;
use ps::proto::parameter_server_server::ParameterServer;
use ps::proto::{PullRequest, PushRequest, TensorMsg};
use ps::server::ServerService;
use tonic::Request;

use crate::util::ps_config;

#[test]
fn bad_pushes_are_refused_and_leave_the_weights_alone() {
    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(dir.path(), "servers = 1\nworkers = 2", "max_steps = 4");
    let settings = JobSettings::from_keys(config.ps().unwrap(), 1, 2, &config);
    let compute = Compute::new(&config).unwrap();
    let held = compute.params().to_vec();
    let initial = compute.initial_params().unwrap();
    let service = ServerService::new(&settings, &config, 0, &held, initial.clone(), false).unwrap();
    let rt = ps::scheduler::runtime(1).unwrap();
    let good: Vec<TensorMsg> = held
        .iter()
        .zip(&initial)
        .map(|(p, t)| ps::wire::to_msg(&p.name, t))
        .collect();
    let push = |tensors: Vec<TensorMsg>, members: Vec<u32>| PushRequest {
        worker_id: 0,
        step: 0,
        members,
        rows: 16,
        loss: 1.0,
        replay: false,
        seen_version: 0,
        tensors,
        sparse: Vec::new(),
        learning_rate: Some(0.1),
    };
    let mut wrong_shape = good.clone();
    wrong_shape[0].shape = vec![1];
    let mut short = good.clone();
    short[0].data.truncate(8);
    let cases = [
        (push(good[..1].to_vec(), vec![0, 1]), "tensors"),
        (push(wrong_shape, vec![0, 1]), "shape"),
        (push(short.clone(), vec![0, 1]), "bytes"),
        (push(good.clone(), vec![1]), "members"),
        (
            PushRequest {
                learning_rate: None,
                ..push(good.clone(), vec![0, 1])
            },
            "learning_rate",
        ),
        (
            PushRequest {
                learning_rate: Some(f64::NAN),
                ..push(good.clone(), vec![0, 1])
            },
            "learning_rate",
        ),
        (
            PushRequest {
                learning_rate: Some(-1.0),
                ..push(good.clone(), vec![0, 1])
            },
            "learning_rate",
        ),
    ];
    rt.block_on(async {
        for (request, rule) in cases {
            let err = service.push(Request::new(request)).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().contains(rule), "{rule}: {}", err.message());
        }
        let pulled = service
            .pull(Request::new(PullRequest {
                worker_id: 0,
                min_version: 0,
                sparse: Vec::new(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(pulled.version, 0, "nothing was applied");
        for (msg, t) in pulled.tensors.iter().zip(&initial) {
            assert_eq!(msg.data, t.as_bytes(), "{}", msg.name);
        }
    });
}
