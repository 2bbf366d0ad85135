//! Callbacks: MindSpore's loss line, JSON-lines metrics and local norms.

use std::io::Write;
use std::sync::{Arc, Mutex};

use layout::SliceBox;
use runtime::{
    Callback, CallbackList, EpochInfo, LocalNorm, LossMonitor, MetricsLog, RuntimeError, ShardView,
    StepInfo, TrainEndInfo,
};
use serde_json::Value;
use tensor::Tensor;

/// A `Write` sink the test can read while the callback owns it.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Step `global_step` of a run with 3 steps per epoch.
fn step(global_step: u64, loss: f32) -> StepInfo<'static> {
    StepInfo {
        rank: 0,
        epoch: (global_step as usize - 1) / 3 + 1,
        step_in_epoch: (global_step as usize - 1) % 3 + 1,
        global_step,
        loss,
        step_ms: 1.5,
        lr: 0.01,
        grad_norm: None,
        moe_dropped: None,
        shards: &[],
    }
}

#[test]
fn loss_monitor_prints_mindspore_lines_every_per_print_times_steps() {
    let out = Captured::default();
    let mut monitor = LossMonitor::new(Box::new(out.clone()), 2);
    for global_step in 1..=5 {
        monitor
            .on_step_end(&step(global_step, 2.287_141_3 / global_step as f32))
            .unwrap();
    }
    assert_eq!(
        out.text(),
        "epoch: 1 step: 2, loss is 1.1435707\nepoch: 2 step: 1, loss is 0.57178533\n"
    );

    let silent = Captured::default();
    let mut never = LossMonitor::new(Box::new(silent.clone()), 0);
    never.on_step_end(&step(1, 1.0)).unwrap();
    assert_eq!(silent.text(), "");
}

#[test]
fn loss_monitor_stops_training_on_an_invalid_loss() {
    let mut monitor = LossMonitor::new(Box::new(Captured::default()), 100);
    for bad in [f32::NAN, f32::INFINITY] {
        match monitor.on_step_end(&step(5, bad)).unwrap_err() {
            RuntimeError::InvalidLoss { epoch, step, .. } => assert_eq!((epoch, step), (2, 2)),
            other => panic!("expected InvalidLoss, got {other}"),
        }
    }
}

fn read_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn metrics_log_writes_flushed_json_lines_and_replaces_an_old_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run/metrics.jsonl");
    let mut log = MetricsLog::create(&path).unwrap();
    log.on_step_end(&step(1, 0.5)).unwrap();
    // Flushed per line: readable while the log is open.
    assert_eq!(read_lines(&path).len(), 1);
    log.on_step_end(&step(2, 0.25)).unwrap();
    let epoch = |eval_accuracy| EpochInfo {
        rank: 0,
        epoch: 1,
        global_step: 2,
        eval_accuracy,
        eval_loss: None,
        epoch_ms: 10.0,
    };
    log.on_epoch_end(&epoch(Some(0.875))).unwrap();
    log.on_epoch_end(&epoch(None)).unwrap();
    let lines = read_lines(&path);
    assert_eq!(
        lines[0],
        serde_json::json!({"epoch": 1, "step": 1, "loss": 0.5, "lr": 0.01, "ms": 1.5})
    );
    assert_eq!(lines[1]["step"], 2);
    assert_eq!(
        lines[2],
        serde_json::json!({"epoch": 1, "eval_accuracy": 0.875})
    );
    assert_eq!(
        lines[3],
        serde_json::json!({"epoch": 1, "eval_accuracy": null})
    );
    // A language model's evaluation reports its validation loss instead.
    log.on_epoch_end(&EpochInfo {
        eval_loss: Some(2.5),
        ..epoch(None)
    })
    .unwrap();
    assert_eq!(
        read_lines(&path)[4],
        serde_json::json!({"epoch": 1, "eval_loss": 2.5})
    );
    // An evaluation every `train.eval_interval` steps names its global step.
    log.on_eval(&runtime::EvalInfo {
        rank: 0,
        global_step: 6,
        eval_accuracy: None,
        eval_loss: Some(2.25),
    })
    .unwrap();
    assert_eq!(
        read_lines(&path)[5],
        serde_json::json!({"global_step": 6, "eval_loss": 2.25})
    );
    drop(log);
    // A new log keeps the old one until its first line replaces it.
    let old = std::fs::read_to_string(&path).unwrap();
    let mut again = MetricsLog::create(&path).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), old);
    again
        .on_epoch_end(&EpochInfo {
            eval_loss: Some(1.5),
            ..epoch(None)
        })
        .unwrap();
    assert_eq!(
        read_lines(&path),
        [serde_json::json!({"epoch": 1, "eval_loss": 1.5})]
    );
}

#[test]
fn local_norm_prints_parameter_and_gradient_norms() {
    let param = Tensor::from_vec(&[2], vec![3f32, 4.]).unwrap();
    let grad = Tensor::from_vec(&[2], vec![0.6f32, 0.8]).unwrap();
    let bias = Tensor::from_vec(&[1], vec![-2f64]).unwrap();
    let shards = [
        ShardView {
            name: "fc1_weight",
            param: &param,
            grad: Some(&grad),
        },
        ShardView {
            name: "fc1_bias",
            param: &bias,
            grad: None,
        },
    ];
    let out = Captured::default();
    let mut norms = LocalNorm::printing(Box::new(out.clone()));
    norms
        .on_step_end(&StepInfo {
            rank: 3,
            global_step: 10,
            shards: &shards,
            ..step(10, 1.0)
        })
        .unwrap();
    let text = out.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], "rank 3 step 10 local_norm fc1_weight 5");
    assert!(
        lines[1].starts_with("rank 3 step 10 local_grad_norm fc1_weight 1"),
        "{text}"
    );
    let grad_norm: f64 = lines[1].rsplit(' ').next().unwrap().parse().unwrap();
    assert!((grad_norm - 1.0).abs() < 1e-7);
    assert_eq!(lines[2], "rank 3 step 10 local_norm fc1_bias 2");
}

#[test]
fn local_norm_dumps_one_json_file_per_rank_and_step() {
    let dir = tempfile::tempdir().unwrap();
    let param = Tensor::from_vec(&[2, 2], vec![1f32, 1., 1., 1.]).unwrap();
    let grad = Tensor::from_vec(&[2, 2], vec![0f32, 0., 0., 3.]).unwrap();
    let bias = Tensor::from_vec(&[2], vec![2f32, 2.]).unwrap();
    let bias_grad = Tensor::from_vec(&[2], vec![4f32, 0.]).unwrap();
    let shards = [
        ShardView {
            name: "fc2_weight",
            param: &param,
            grad: Some(&grad),
        },
        ShardView {
            name: "fc2_bias",
            param: &bias,
            grad: Some(&bias_grad),
        },
    ];
    let mut norms = LocalNorm::dumping(dir.path());
    for rank in [0, 1] {
        norms.record(rank, 7, &shards).unwrap();
    }
    for rank in [0, 1] {
        let file = LocalNorm::dump_file(dir.path(), rank, 7);
        assert_eq!(
            file,
            dir.path()
                .join(format!("rank_{rank}/local_norm_step_7.json"))
        );
        let body: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"rank": rank, "step": 7,
                // √(2² + √8²) and √(3² + 4²): everything the rank holds
                "device_local_norm": (4.0 + 8f64.sqrt().powi(2)).sqrt(), "device_local_grad_norm": 5.0,
                "params": [
                {"name": "fc2_weight", "shape": [2, 2], "local_norm": 2.0, "local_grad_norm": 3.0},
                {"name": "fc2_bias", "shape": [2], "local_norm": 8f64.sqrt(), "local_grad_norm": 4.0}
            ]})
        );
        // Written through a temporary file that was renamed away.
        let names: Vec<_> = std::fs::read_dir(file.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }
}

/// A dump that cannot be renamed into place (here a directory holds the file's name; a full
/// disk cuts the write short the same way) fails naming the file and leaves no temporary file
/// beside it.
#[test]
fn local_norm_dump_that_fails_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let param = Tensor::from_vec(&[2], vec![3f32, 4.]).unwrap();
    let shards = [ShardView {
        name: "w",
        param: &param,
        grad: None,
    }];
    let file = LocalNorm::dump_file(dir.path(), 0, 1);
    std::fs::create_dir_all(file.join("in_the_way")).unwrap();
    let err = LocalNorm::dumping(dir.path())
        .record(0, 1, &shards)
        .unwrap_err();
    assert!(err.to_string().contains(&*file.to_string_lossy()), "{err}");
    let mut names: Vec<_> = std::fs::read_dir(file.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["local_norm_step_1.json"],
        "only the directory in the way"
    );
    assert!(file.join("in_the_way").is_dir());
}

/// The local norms of the distinct shards of a tensor combine into its global norm.
#[test]
fn local_norms_of_shards_combine_into_the_global_norm() {
    let global = Tensor::from_vec(&[4, 4], (0..16).map(|i| i as f32 - 7.5).collect()).unwrap();
    let boxes = [
        SliceBox::new(vec![0, 0], vec![2, 4]),
        SliceBox::new(vec![2, 0], vec![2, 2]),
        SliceBox::new(vec![2, 2], vec![2, 2]),
    ];
    let sum_sq: f64 = boxes
        .iter()
        .map(|b| runtime::l2_norm(&global.extract_box(b).unwrap()).powi(2))
        .sum();
    assert!((sum_sq.sqrt() - runtime::l2_norm(&global)).abs() < 1e-12);
}

/// Records the order of calls into a shared log.
struct Recorder {
    name: &'static str,
    calls: Arc<Mutex<Vec<String>>>,
    fail_on_epoch: bool,
}

impl Callback for Recorder {
    fn on_step_end(&mut self, step: &StepInfo<'_>) -> Result<(), RuntimeError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("{} step {}", self.name, step.global_step));
        Ok(())
    }
    fn on_epoch_end(&mut self, epoch: &EpochInfo) -> Result<(), RuntimeError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("{} epoch {}", self.name, epoch.epoch));
        if self.fail_on_epoch {
            return Err(RuntimeError::Config {
                key: "test".into(),
                reason: "stop".into(),
            });
        }
        Ok(())
    }
}

#[test]
fn a_callback_list_calls_in_order_and_stops_at_the_first_error() {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mut list = CallbackList::new();
    for (name, fail_on_epoch) in [("a", true), ("b", false)] {
        list.push(Box::new(Recorder {
            name,
            calls: calls.clone(),
            fail_on_epoch,
        }));
    }
    assert_eq!(list.len(), 2);
    list.on_step_end(&step(1, 1.0)).unwrap();
    let epoch = EpochInfo {
        rank: 0,
        epoch: 1,
        global_step: 1,
        eval_accuracy: None,
        eval_loss: None,
        epoch_ms: 1.0,
    };
    assert!(list.on_epoch_end(&epoch).is_err());
    let end = TrainEndInfo {
        rank: 0,
        epochs: 1,
        global_step: 1,
        last_loss: Some(1.0),
        memory: &[],
    };
    list.on_train_end(&end).unwrap();
    assert_eq!(
        *calls.lock().unwrap(),
        ["a step 1", "b step 1", "a epoch 1"]
    );
}

/// A callback that fails when training ends.
struct FailsAtTheEnd;

impl Callback for FailsAtTheEnd {
    fn on_train_end(&mut self, _end: &TrainEndInfo<'_>) -> Result<(), RuntimeError> {
        Err(RuntimeError::Config {
            key: "test".into(),
            reason: "the end callback fails".into(),
        })
    }
}

/// A callback failing at the end (the metrics log's memory lines on a full disk) failed the
/// run before the final checkpoint was saved, losing the whole run's training; the set is now
/// committed first, and the run still fails with the callback's error.
#[test]
fn an_end_callback_that_fails_leaves_the_final_checkpoint_saved() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::run_util::small_gpt(
        dir.path(),
        "adamw",
        "",
        "mode = \"stand_alone\"",
        &["train.max_steps=2".to_string()],
    );
    let session = runtime::Session::new(&config).unwrap();
    let cluster = comm::LocalCluster::new(1).unwrap();
    let world: Arc<dyn comm::Communicator> = Arc::new(cluster.comms().remove(0));
    let err = session
        .run_rank(world, &mut FailsAtTheEnd, false)
        .expect_err("the callback's error fails the run");
    assert!(err.to_string().contains("the end callback fails"), "{err}");
    assert!(dir.path().join("tessera_set.json").is_file());
    let names = ["blocks.0.attn.qkv.weight".to_string()];
    let params = crate::run_util::merged_params(dir.path(), &names);
    assert_eq!(params.len(), 1);
}
