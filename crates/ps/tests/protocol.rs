//! A server refuses pushes that break the protocol, naming the rule, and changes nothing.

use ps::compute::Compute;
use ps::env::JobSettings;
use ps::proto::parameter_server_server::ParameterServer;
use ps::proto::{PullRequest, PushRequest, StepSquareSum, TensorMsg};
use ps::server::ServerService;
use tensor::Tensor;
use tonic::Request;

use crate::util::ps_config;

/// The one server of a 1-server, 2-worker job with `[train]` keys `train` writing to `dir`,
/// its initial weights, and those weights as wire messages (a push's tensors).
fn one_server(dir: &std::path::Path, train: &str) -> (ServerService, Vec<Tensor>, Vec<TensorMsg>) {
    let config = ps_config(dir, "servers = 1\nworkers = 2", train);
    let settings = JobSettings::from_keys(config.ps().unwrap(), 1, 2, &config);
    let compute = Compute::new(&config).unwrap();
    let held = compute.params().to_vec();
    let initial = compute.initial_params().unwrap();
    let service = ServerService::new(&settings, &config, 0, &held, initial.clone(), false).unwrap();
    let messages = held
        .iter()
        .zip(&initial)
        .map(|(p, t)| ps::wire::to_msg(&p.name, t))
        .collect();
    (service, initial, messages)
}

#[test]
fn bad_pushes_are_refused_and_leave_the_weights_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (service, initial, good) = one_server(dir.path(), "max_steps = 4");
    let rt = ps::scheduler::runtime(1).unwrap();
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
                ..Default::default()
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

/// Sync clipping over the wire: with both pushes of a step in, the server holds the step and
/// answers a pull with its part of the square sum; a global sum that is not an encoded square
/// sum, or smaller than the server's own part, is refused naming `PullRequest.norm` and leaves
/// the step waiting; the right sum applies it, and the ready reply tells the sum applied.
#[test]
fn a_clipping_server_waits_for_the_global_norm_and_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    // The initial weights as a "gradient": its norm is far above 0.01.
    let (service, initial, grads) = one_server(dir.path(), "max_steps = 4\nmax_grad_norm = 0.01");
    let rt = ps::scheduler::runtime(1).unwrap();
    let push = |worker_id: u32| PushRequest {
        worker_id,
        step: 0,
        members: vec![0, 1],
        rows: 16,
        loss: 1.0,
        replay: false,
        seen_version: 0,
        tensors: grads.clone(),
        sparse: Vec::new(),
        learning_rate: Some(0.1),
    };
    let pull = |norm: Option<StepSquareSum>| PullRequest {
        worker_id: 0,
        min_version: 1,
        norm,
        no_weights: true,
        ..Default::default()
    };
    rt.block_on(async {
        for w in [0, 1] {
            service.push(Request::new(push(w))).await.unwrap();
        }
        let waiting = service
            .pull(Request::new(pull(None)))
            .await
            .unwrap()
            .into_inner();
        assert!(!waiting.ready);
        assert_eq!(waiting.version, 0, "the step waits for its norm");
        assert_eq!(waiting.norm_step, Some(0));
        let part = runtime::SquareSum::decode(&waiting.norm_part).expect("an encoded square sum");
        let mut expected = runtime::SquareSum::default();
        for t in &initial {
            expected.add_f32(t.as_f32().unwrap());
        }
        assert_eq!(part, expected, "the part is the mean gradient's square sum");
        let too_small = runtime::SquareSum::default().to_bytes();
        for (bad, rule) in [(vec![1u8, 2, 3], "bytes"), (too_small, "own part")] {
            let norm = StepSquareSum {
                step: 0,
                square_sum: bad,
            };
            let err = service
                .pull(Request::new(pull(Some(norm))))
                .await
                .unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(
                err.message().contains("PullRequest.norm") && err.message().contains(rule),
                "{rule}: {}",
                err.message()
            );
        }
        let norm = StepSquareSum {
            step: 0,
            square_sum: waiting.norm_part.clone(),
        };
        let applied = service
            .pull(Request::new(pull(Some(norm))))
            .await
            .unwrap()
            .into_inner();
        assert!(applied.ready);
        assert_eq!(applied.version, 1);
        assert!(applied.tensors.is_empty(), "no_weights: no tensors");
        assert_eq!(applied.applied_square_sum, waiting.norm_part);
        // A different sum for the applied step is a disagreement, refused.
        let mut other = expected.clone();
        other.add_f32(&[1.0]);
        let norm = StepSquareSum {
            step: 0,
            square_sum: other.to_bytes(),
        };
        let err = service
            .pull(Request::new(pull(Some(norm))))
            .await
            .unwrap_err();
        assert!(err.message().contains("disagree"), "{}", err.message());
    });
}

/// A server that starts fresh removes the snapshot an earlier job left in the same
/// `output.dir`: a restart of this job's server then begins at version 0 (replaying this job's
/// kept gradients onto the initial weights), not at the earlier job's version and weights.
#[test]
fn a_fresh_server_removes_an_earlier_jobs_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(dir.path(), "servers = 1\nworkers = 2", "max_steps = 4");
    let settings = JobSettings::from_keys(config.ps().unwrap(), 1, 2, &config);
    let compute = Compute::new(&config).unwrap();
    let held = compute.params().to_vec();
    let initial = compute.initial_params().unwrap();
    let names: Vec<String> = held.iter().map(|p| p.name.clone()).collect();
    // The earlier job's last snapshot: other weights, at version 138.
    let earlier: Vec<Tensor> = initial
        .iter()
        .map(|t| {
            let data = vec![0.5f32; t.shape().iter().product()];
            Tensor::from_vec(t.shape(), data).unwrap()
        })
        .collect();
    let specs: Vec<runtime::ParamSpec> = held
        .iter()
        .map(|p| runtime::ParamSpec {
            name: p.name.clone(),
            shape: p.shape.clone(),
            dtype: tensor::DType::F32,
        })
        .collect();
    let optimizer = runtime::Optimizer::new(config.optimizer_config(), &specs).unwrap();
    let path = ps::snapshot::snapshot_path(&settings.output_dir, 0);
    let state = ps::snapshot::PartitionState {
        names: &names,
        weights: &earlier,
        optimizer: &optimizer,
        version: 138,
    };
    ps::snapshot::save(&path, &state).unwrap();
    // This job's server starts, then dies before its first snapshot and is restarted.
    let fresh = ServerService::new(&settings, &config, 0, &held, initial.clone(), false).unwrap();
    assert_eq!(fresh.version(), 0);
    assert!(!path.exists(), "the earlier job's snapshot is removed");
    drop(fresh);
    let restarted = ServerService::new(&settings, &config, 0, &held, initial, true).unwrap();
    assert_eq!(
        restarted.version(),
        0,
        "a restart resumes from this job's start, not from the earlier job's snapshot"
    );
}
