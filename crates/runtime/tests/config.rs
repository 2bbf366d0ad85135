//! The training config: the example files, overrides, errors and paths.

use std::path::{Path, PathBuf};

use parallel::{DatasetStrategy, ParallelConfig, ParallelMode};
use runtime::{ModelName, OptimizerConfig, OptimizerKind, ResumeFrom, RuntimeError, TrainConfig};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn example(name: &str) -> (PathBuf, String) {
    let path = repo_root().join("examples").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    (path, text)
}

const MOMENTUM_09: OptimizerConfig = OptimizerConfig {
    kind: OptimizerKind::Momentum {
        momentum: 0.9,
        use_nesterov: false,
    },
    learning_rate: 0.05,
    weight_decay: 0.0,
};

#[test]
fn the_semi_auto_example_parses_to_its_parallel_config() {
    let (path, text) = example("seed_semi_auto.toml");
    let base = Path::new("/work/dir");
    let config = TrainConfig::parse(&text, Some(&path), &[], base).unwrap();
    assert_eq!(config.source(), Some(path.as_path()));
    assert_eq!(config.model().name, ModelName::SeedMlp);
    assert_eq!((config.model().hidden, config.model().classes), (512, 10));
    assert_eq!(config.data().dir, base.join("data/digits"));
    assert_eq!(
        (
            config.data().batch_size,
            config.data().shuffle,
            config.data().pixel_max
        ),
        (32, true, None)
    );
    let want = ParallelConfig::new(ParallelMode::SemiAuto, 8)
        .shard("matmul1", &[&[2, 4], &[4, 1]])
        .shard("relu1", &[&[4, 1]])
        .shard("matmul2", &[&[1, 8], &[8, 1]])
        .shard("relu2", &[&[8, 1]]);
    assert_eq!(config.parallel_config(), want);
    assert_eq!(config.optimizer_config(), MOMENTUM_09);
    let train = config.train();
    assert_eq!(
        (train.epochs, train.max_steps, train.seed, train.eval),
        (3, None, 1, true)
    );
    assert_eq!(
        (
            train.per_print_times,
            train.print_local_norm,
            train.dump_local_norm.clone()
        ),
        (1, false, None)
    );
    assert_eq!(config.output().dir, base.join("runs/seed_semi_auto"));
    assert!(config.output().save_checkpoint);
    assert_eq!(
        config.output().metrics_file(),
        base.join("runs/seed_semi_auto/metrics.jsonl")
    );
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
}

#[test]
fn the_stand_alone_and_data_parallel_examples_parse() {
    let (path, text) = example("seed_stand_alone.toml");
    let config = TrainConfig::parse(&text, Some(&path), &[], Path::new("/b")).unwrap();
    assert_eq!(config.parallel_config(), ParallelConfig::stand_alone());
    assert_eq!(config.optimizer_config(), MOMENTUM_09);
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());

    let (path, text) = example("seed_data_parallel.toml");
    let config = TrainConfig::parse(&text, Some(&path), &[], Path::new("/b")).unwrap();
    assert_eq!(
        config.parallel_config(),
        ParallelConfig::new(ParallelMode::DataParallel, 8)
    );
    assert_eq!(config.data().batch_size, 32);
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
}

#[test]
fn load_resolves_relative_paths_against_the_current_directory() {
    let (path, _) = example("seed_semi_auto.toml");
    let config = TrainConfig::load(&path, &[]).unwrap();
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(config.data().dir, cwd.join("data/digits"));
    assert_eq!(config.output().dir, cwd.join("runs/seed_semi_auto"));
    // Absolute paths stay as written.
    let config = TrainConfig::load(&path, &["data.dir=/srv/mnist".to_string()]).unwrap();
    assert_eq!(config.data().dir, Path::new("/srv/mnist"));
    match TrainConfig::load(Path::new("/no/such/config.toml"), &[]).unwrap_err() {
        RuntimeError::Io { path, .. } => assert_eq!(path, Path::new("/no/such/config.toml")),
        other => panic!("expected an Io error, got {other}"),
    }
}

pub(crate) const MINIMAL: &str = r#"
[model]
hidden = 64
classes = 10
[data]
dir = "d"
batch_size = 8
[train]
epochs = 1
optimizer = "sgd"
learning_rate = 0.1
[output]
dir = "out"
"#;

pub(crate) fn parse_with(text: &str, overrides: &[&str]) -> Result<TrainConfig, RuntimeError> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    TrainConfig::parse(
        text,
        Some(Path::new("conf.toml")),
        &overrides,
        Path::new("/base"),
    )
}

#[test]
fn defaults_fill_every_optional_key() {
    let config = parse_with(MINIMAL, &[]).unwrap();
    assert_eq!(config.model().name, ModelName::SeedMlp);
    assert_eq!(config.data().format.name(), "idx");
    assert!(config.data().shuffle);
    assert_eq!(config.parallel_config(), ParallelConfig::stand_alone());
    assert_eq!(
        config.optimizer_config(),
        OptimizerConfig {
            kind: OptimizerKind::Sgd,
            learning_rate: 0.1,
            weight_decay: 0.0
        }
    );
    let train = config.train();
    assert_eq!(
        (
            train.max_steps,
            train.seed,
            train.eval,
            train.per_print_times
        ),
        (None, 1, true, 1)
    );
    assert_eq!(config.output().resume_from, None);
    assert_eq!(
        (
            config.output().save_checkpoint_steps,
            config.output().save_checkpoint_seconds,
            config.output().keep_checkpoint_max,
            train.eval_interval
        ),
        (None, None, 5, None)
    );
    let latest = parse_with(MINIMAL, &["output.resume_from=\"latest\""]).unwrap();
    assert_eq!(latest.output().resume_from, Some(ResumeFrom::Latest));
    let named = parse_with(MINIMAL, &["output.resume_from=\"./latest\""]).unwrap();
    assert!(matches!(
        named.output().resume_from,
        Some(ResumeFrom::Dir(_))
    ));
    // MindSpore's eps defaults: 1e-8 for Adam, 1e-6 for AdamWeightDecay.
    let adam = parse_with(MINIMAL, &["train.optimizer=adam"]).unwrap();
    assert_eq!(
        adam.optimizer_config().kind,
        OptimizerKind::Adam {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            use_amsgrad: false,
            use_nesterov: false,
        }
    );
    let adamw = parse_with(MINIMAL, &["train.optimizer=adamw"]).unwrap();
    assert_eq!(
        adamw.optimizer_config().kind,
        OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-6
        }
    );
}

#[test]
fn every_override_form_applies() {
    let config = parse_with(
        MINIMAL,
        &[
            "train.epochs=5",               // integer
            "train.learning_rate = 2.5e-2", // float, spaces around '='
            "data.shuffle=false",           // boolean
            "data.dir=other/dir",           // not TOML: a plain string
            "output.dir=\"quoted dir\"",    // a TOML string
            "train.optimizer=momentum",     // enum as a plain string
            "train.momentum=0.8",           // a key absent from the file
            "train.use_nesterov=true",
            "parallel.mode=semi_auto", // a section absent from the file
            "parallel.devices=4",
            "parallel.shard.matmul1=[[2,2],[2,1]]", // a nested table
            "parallel.out_shard.matmul1=[[4,1]]",
            "parallel.dataset_strategy=[[4,1,1],[4]]", // a list value
            "train.max_steps=100",
            "train.dump_local_norm=true",
        ],
    )
    .unwrap();
    assert_eq!(config.train().epochs, 5);
    assert_eq!(config.train().max_steps, Some(100));
    assert!(!config.data().shuffle);
    assert_eq!(config.data().dir, Path::new("/base/other/dir"));
    assert_eq!(config.output().dir, Path::new("/base/quoted dir"));
    assert_eq!(
        config.train().dump_local_norm,
        Some(PathBuf::from("/base/quoted dir/local_norm"))
    );
    assert_eq!(
        config.optimizer_config(),
        OptimizerConfig {
            kind: OptimizerKind::Momentum {
                momentum: 0.8,
                use_nesterov: true
            },
            learning_rate: 0.025,
            weight_decay: 0.0
        }
    );
    let mut want = ParallelConfig::new(ParallelMode::SemiAuto, 4).shard_with_out(
        "matmul1",
        &[&[2, 2], &[2, 1]],
        &[&[4, 1]],
    );
    want.dataset_strategy = DatasetStrategy::PerInput(vec![vec![4, 1, 1], vec![4]]);
    assert_eq!(config.parallel_config(), want);
    // An override replaces a value of the file; later overrides win.
    let config = parse_with(MINIMAL, &["train.epochs=2", "train.epochs=9"]).unwrap();
    assert_eq!(config.train().epochs, 9);
    // The command line's --devices.
    let config = config.with_devices(16).unwrap();
    assert_eq!(config.parallel_config().devices, 16);
    assert!(
        matches!(config.with_devices(0), Err(RuntimeError::Config { key, .. }) if key == "--devices")
    );
}

/// The key and reason of a config error from the file `conf.toml`.
pub(crate) fn file_error(result: Result<TrainConfig, RuntimeError>) -> (String, String) {
    match result.unwrap_err() {
        RuntimeError::ConfigFile { path, key, reason } => {
            assert_eq!(path, Path::new("conf.toml"));
            (key, reason)
        }
        other => panic!("expected a ConfigFile error, got {other}"),
    }
}

/// `MINIMAL` with `line` added at the end of section `[section]`.
fn with_line(section: &str, line: &str) -> String {
    let header = format!("[{section}]\n");
    if MINIMAL.contains(&header) {
        MINIMAL.replacen(&header, &format!("{header}{line}\n"), 1)
    } else {
        format!("{MINIMAL}{header}{line}\n")
    }
}

#[test]
fn an_unknown_key_in_any_section_names_it_and_lists_the_valid_ones() {
    let cases = [
        ("model", "hiden = 3", "model.hiden", "hidden, classes"),
        ("data", "batchsize = 3", "data.batchsize", "batch_size"),
        ("parallel", "device = 3", "parallel.device", "devices, mode"),
        ("train", "lr = 0.1", "train.lr", "learning_rate"),
        (
            "output",
            "directory = \"x\"",
            "output.directory",
            "save_checkpoint",
        ),
        (
            "trian",
            "epochs = 3",
            "trian",
            "model, data, parallel, train, output",
        ),
    ];
    for (section, line, key, valid) in cases {
        let (got_key, reason) = file_error(parse_with(&with_line(section, line), &[]));
        assert_eq!(got_key, key);
        assert!(
            reason.contains("unknown") && reason.contains(valid),
            "{key}: {reason}"
        );
    }
    // A stray top-level key is an unknown section too.
    let (key, _) = file_error(parse_with(&format!("epochs = 3\n{MINIMAL}"), &[]));
    assert_eq!(key, "epochs");
}

#[test]
fn wrong_types_name_the_key_and_the_expected_type() {
    let cases = [
        (
            "model.hidden=\"512\"",
            "model.hidden",
            "expected a positive integer, got string",
        ),
        (
            "model.hidden=18446744073709551615",
            "model.hidden",
            "got 18446744073709551615, an integer outside the range TOML integers have",
        ),
        (
            "model.classes=2.5",
            "model.classes",
            "expected a positive integer, got float",
        ),
        ("data.shuffle=1", "data.shuffle", "expected a boolean"),
        ("data.dir=[1]", "data.dir", "expected a string, got array"),
        (
            "train.learning_rate=fast",
            "train.learning_rate",
            "expected a number, got string",
        ),
        ("train.seed=-1", "train.seed", "must be ≥ 0"),
        (
            "parallel.devices=true",
            "parallel.devices",
            "expected a positive integer, got boolean",
        ),
        (
            "parallel.shard.matmul1=[2,4]",
            "parallel.shard.matmul1",
            "[0] is integer 2",
        ),
        (
            "parallel.shard.matmul1=[[2,0]]",
            "parallel.shard.matmul1",
            "[0][1] is integer 0",
        ),
        (
            "parallel.shard.matmul1=[]",
            "parallel.shard.matmul1",
            "empty list",
        ),
        ("parallel.shard=3", "parallel.shard", "expected a table"),
    ];
    for (set, key, expected) in cases {
        let (got_key, reason) = config_error(parse_with(MINIMAL, &[set]));
        assert_eq!(got_key, key, "{set}");
        assert!(reason.contains(expected), "{set}: {reason}");
        // Values from --set say so.
        assert!(reason.contains("--set"), "{set}: {reason}");
    }
    // The same rule broken in the file names the file.
    let (key, reason) = file_error(parse_with(&with_line("model", "name = 7"), &[]));
    assert_eq!(key, "model.name");
    assert!(
        reason.contains("expected a string, got integer 7"),
        "{reason}"
    );
    let without_model = MINIMAL.replace("[model]\nhidden = 64\nclasses = 10\n", "");
    let (key, reason) = file_error(parse_with(&format!("model = 3\n{without_model}"), &[]));
    assert_eq!(key, "model");
    assert!(
        reason.contains("expected a table ([model]), got integer 3"),
        "{reason}"
    );
}

/// The key and reason of a `Config` error (not from the file).
fn config_error(result: Result<TrainConfig, RuntimeError>) -> (String, String) {
    match result.unwrap_err() {
        RuntimeError::Config { key, reason } => (key, reason),
        other => panic!("expected a Config error, got {other}"),
    }
}

/// Adam's `train.use_amsgrad` and `train.use_nesterov` (MindSpore's `nn.Adam` arguments, the
/// Nesterov key shared with momentum) and `train.optimizer = "lamb"` (MindSpore's `nn.Lamb`
/// defaults, eps 1e-6): read, the AMSGrad–Nesterov pair refused naming the key, and the keys
/// reported as without effect under a rule that does not read them.
#[test]
fn adam_flags_and_lamb_are_read_and_checked() {
    for (amsgrad, nesterov) in [(false, true), (true, false)] {
        let config = parse_with(
            MINIMAL,
            &[
                "train.optimizer=adam",
                &format!("train.use_amsgrad={amsgrad}"),
                &format!("train.use_nesterov={nesterov}"),
            ],
        )
        .unwrap();
        assert_eq!(
            config.optimizer_config().kind,
            OptimizerKind::Adam {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                use_amsgrad: amsgrad,
                use_nesterov: nesterov,
            }
        );
        assert!(
            !config.warnings().join("\n").contains("use_"),
            "{:?}",
            config.warnings()
        );
    }
    let amsgrad = parse_with(MINIMAL, &["train.optimizer=adam", "train.use_amsgrad=true"]);
    assert_eq!(
        amsgrad.unwrap().optimizer_config().kind.state_names(),
        ["moment1", "moment2", "vhat"]
    );
    let (key, reason) = config_error(parse_with(
        MINIMAL,
        &[
            "train.optimizer=adam",
            "train.use_amsgrad=true",
            "train.use_nesterov=true",
        ],
    ));
    assert_eq!(key, "train.use_nesterov");
    assert!(reason.contains("use_amsgrad"), "{reason}");
    let (key, _) = config_error(parse_with(
        MINIMAL,
        &["train.optimizer=adam", "train.use_amsgrad=1"],
    ));
    assert_eq!(key, "train.use_amsgrad");

    let lamb = parse_with(MINIMAL, &["train.optimizer=lamb", "train.beta2=0.99"]).unwrap();
    assert_eq!(
        lamb.optimizer_config().kind,
        OptimizerKind::Lamb {
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-6,
        }
    );
    assert_eq!(
        lamb.optimizer_config().kind.state_names(),
        ["lamb_m", "lamb_v"]
    );
    let (key, _) = config_error(parse_with(
        MINIMAL,
        &["train.optimizer=lamb", "train.eps=0"],
    ));
    assert_eq!(key, "train.eps");
    // The servers update tables by rows: no whole-parameter norm there.
    let (key, reason) = config_error(parse_with(
        GPT_MINIMAL,
        &["parallel.mode=\"parameter_server\"", "train.optimizer=lamb"],
    ));
    assert_eq!(key, "train.optimizer");
    assert!(reason.contains("parameter_server"), "{reason}");
    for (rule, key) in [
        ("adamw", "train.use_amsgrad"),
        ("lamb", "train.use_nesterov"),
        ("momentum", "train.use_amsgrad"),
    ] {
        let config = parse_with(
            MINIMAL,
            &[
                &format!("train.optimizer={rule}"),
                "train.momentum=0.9",
                &format!("{key}=true"),
            ],
        )
        .unwrap();
        let warnings = config.warnings().join("\n");
        assert!(
            warnings.contains(&format!("{key} has no effect")),
            "{rule}: {warnings}"
        );
    }
}

#[test]
fn unknown_enum_values_list_the_valid_ones() {
    let cases = [
        ("model.name=resnet", "model.name", "seed_mlp"),
        ("data.format=csv", "data.format", "idx"),
        (
            "parallel.mode=auto",
            "parallel.mode",
            "stand_alone, data_parallel, semi_auto",
        ),
        (
            "parallel.dataset_strategy=half_batch",
            "parallel.dataset_strategy",
            "full_batch",
        ),
        (
            "train.optimizer=rmsprop",
            "train.optimizer",
            "sgd, momentum, adam, adamw, mint_adamw, lamb",
        ),
    ];
    for (set, key, valid) in cases {
        let (got_key, reason) = config_error(parse_with(MINIMAL, &[set]));
        assert_eq!(got_key, key);
        assert!(
            reason.contains("unknown value") && reason.contains(valid),
            "{set}: {reason}"
        );
    }
}

#[test]
fn missing_required_keys_and_sections_are_named() {
    let (key, reason) = file_error(parse_with(&MINIMAL.replace("hidden = 64\n", ""), &[]));
    assert_eq!(
        (key.as_str(), reason.as_str()),
        ("model.hidden", "missing required key")
    );
    let (key, _) = file_error(parse_with(
        &MINIMAL.replace("optimizer = \"sgd\"\n", ""),
        &[],
    ));
    assert_eq!(key, "train.optimizer");
    let (key, _) = file_error(parse_with(&MINIMAL.replace("dir = \"d\"\n", ""), &[]));
    assert_eq!(key, "data.dir");
    let (key, reason) = file_error(parse_with(
        &MINIMAL.replace("[output]\ndir = \"out\"\n", ""),
        &[],
    ));
    assert_eq!(key, "output");
    assert!(reason.contains("missing required section [output]"));
    // Momentum has no default momentum, as in MindSpore.
    let (key, reason) = file_error(parse_with(&MINIMAL.replace("\"sgd\"", "\"momentum\""), &[]));
    assert_eq!(
        (key.as_str(), reason.as_str()),
        ("train.momentum", "missing required key")
    );
}

#[test]
fn out_of_range_values_are_rejected() {
    let cases = [
        ("train.epochs=0", "train.epochs"),
        ("data.batch_size=-8", "data.batch_size"),
        ("train.learning_rate=0", "train.learning_rate"),
        ("train.learning_rate=nan", "train.learning_rate"),
        ("train.weight_decay=-0.1", "train.weight_decay"),
        ("data.pixel_max=0", "data.pixel_max"),
        ("output.resume_from=\"\"", "output.resume_from"),
        (
            "output.save_checkpoint_steps=0",
            "output.save_checkpoint_steps",
        ),
        (
            "output.save_checkpoint_seconds=0",
            "output.save_checkpoint_seconds",
        ),
        (
            "output.save_checkpoint_seconds=-5",
            "output.save_checkpoint_seconds",
        ),
        ("output.keep_checkpoint_max=0", "output.keep_checkpoint_max"),
        (
            "output.save_checkpoint_steps=1.5",
            "output.save_checkpoint_steps",
        ),
        ("train.eval_interval=0", "train.eval_interval"),
    ];
    for (set, key) in cases {
        assert_eq!(config_error(parse_with(MINIMAL, &[set])).0, key, "{set}");
    }
    let (key, _) = config_error(parse_with(
        MINIMAL,
        &["train.optimizer=adam", "train.beta1=1.0"],
    ));
    assert_eq!(key, "train.beta1");
    let (key, reason) = config_error(parse_with(MINIMAL, &["parallel.out_shard.matmul1=[[8,1]]"]));
    assert_eq!(key, "parallel.out_shard.matmul1");
    assert!(reason.contains("parallel.shard.matmul1"), "{reason}");
}

#[test]
fn bad_overrides_are_errors_naming_the_override() {
    let cases = [
        ("trian.epochs=3", "unknown section `trian`"),
        ("epochs=3", "does not name a key inside a section"),
        ("train.epochs", "expected section.key=value"),
        ("train..epochs=3", "does not name a key"),
        ("train.epochs.x=1", "train.epochs is integer 1, not a table"),
    ];
    for (set, expected) in cases {
        let (key, reason) = config_error(parse_with(MINIMAL, &[set]));
        assert_eq!(key, format!("--set {set}"));
        assert!(reason.contains(expected), "{set}: {reason}");
    }
    // A key the override creates inside a known section is still checked.
    let (key, _) = config_error(parse_with(MINIMAL, &["train.epochz=3"]));
    assert_eq!(key, "train.epochz");
}

/// A value given with `--set` is blamed on the override, also when the error names a key
/// inside it (a table set at once, an element of a list), never on the file.
#[test]
fn errors_in_overridden_values_name_the_override_not_the_file() {
    for (set, key) in [
        ("parallel.hsdp={shard_size=0}", "parallel.hsdp.shard_size"),
        (
            "parallel.shard.matmul1=[[0, 1], [1, 1]]",
            "parallel.shard.matmul1",
        ),
        ("train.epochs=0", "train.epochs"),
    ] {
        let (got, reason) = config_error(parse_with(MINIMAL, &[set]));
        assert_eq!(got, key, "{set}");
        assert!(reason.contains(&format!("--set {set}")), "{set}: {reason}");
    }
}

/// TOML's quoted key parts work in `--set`: a pattern key holding dots names one entry.
#[test]
fn quoted_key_parts_in_overrides_name_one_entry() {
    let config = parse_with(
        MINIMAL,
        &[
            r#"parallel.shard."matmul*"=[[2, 1], [1, 1]]"#,
            "parallel.mode=semi_auto",
            "parallel.devices=2",
        ],
    )
    .unwrap();
    let strategies = &config.parallel_config().strategies;
    assert!(
        strategies.keys().any(|k| k == "matmul*"),
        "{:?}",
        strategies.keys().collect::<Vec<_>>()
    );
    assert!(!strategies.keys().any(|k| k.contains('"')));
}

#[test]
fn a_toml_syntax_error_names_the_file_and_line() {
    let (key, reason) = file_error(parse_with("[model]\nhidden = = 3\n", &[]));
    assert_eq!(key, "(syntax)");
    assert!(reason.contains("line 2"), "{reason}");
}

#[test]
fn keys_without_effect_are_warned_about() {
    let config = parse_with(
        MINIMAL,
        &[
            "train.momentum=0.9",
            "train.beta1=0.8",
            "parallel.mode=data_parallel",
            "parallel.devices=8",
            "parallel.shard.matmul1=[[8,1],[1,1]]",
            "train.dump_local_norm_path=norms",
            "train.elastic_interval=5",
        ],
    )
    .unwrap();
    let warnings = config.warnings().join("\n");
    for expected in [
        "train.momentum",
        "train.beta1",
        "[parallel.shard]",
        "dump_local_norm_path",
        "train.elastic_interval has no effect unless train.elastic = true",
    ] {
        assert!(
            warnings.contains(expected),
            "{expected} missing from:\n{warnings}"
        );
    }
    assert_eq!(config.train().dump_local_norm, None);
    assert_eq!(config.train().elastic, None);
    let elastic = parse_with(MINIMAL, &["train.elastic=true"]).unwrap();
    assert_eq!(
        elastic.train().elastic,
        Some(runtime::elastic::DEFAULT_INTERVAL)
    );
    let every_3 = parse_with(MINIMAL, &["train.elastic=true", "train.elastic_interval=3"]).unwrap();
    assert_eq!(every_3.train().elastic, Some(3));
    let (key, _) = config_error(parse_with(MINIMAL, &["train.elastic_interval=0"]));
    assert_eq!(key, "train.elastic_interval");
    let config = parse_with(MINIMAL, &["parallel.devices=8"]).unwrap();
    assert!(
        config.warnings()[0].contains("stand_alone"),
        "{:?}",
        config.warnings()
    );
    assert_eq!(config.parallel_config().effective_devices(), 1);
}

#[test]
fn auto_pipeline_needs_a_search_mode() {
    let (key, reason) = config_error(parse_with(MINIMAL, &["parallel.auto_pipeline=true"]));
    assert_eq!(key, "parallel.auto_pipeline");
    assert!(
        reason.contains("applies only with a search mode"),
        "{reason}"
    );
    let searched = parse_with(
        MINIMAL,
        &[
            "parallel.auto_pipeline=true",
            "parallel.mode=\"dynamic_programming\"",
        ],
    )
    .expect("valid with a search mode");
    assert!(searched.search().auto_pipeline);
    assert!(!parse_with(MINIMAL, &[]).unwrap().search().auto_pipeline);
}

/// `optimizer = "mint_adamw"` is mint.optim.AdamW with its defaults (weight decay 1e-2,
/// ε 1e-8); the schedule defaults to a constant rate; `no_weight_decay` lists name parts.
#[test]
fn mint_adamw_schedule_and_decay_filter_keys_parse() {
    let config = parse_with(
        MINIMAL,
        &[
            "train.optimizer=\"mint_adamw\"",
            "train.no_weight_decay=[\"bias\", \"embedding\"]",
        ],
    )
    .unwrap();
    assert_eq!(
        config.optimizer_config(),
        OptimizerConfig {
            kind: OptimizerKind::MintAdamW {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            learning_rate: 0.1,
            weight_decay: 1e-2,
        }
    );
    assert_eq!(*config.lr_schedule(), runtime::LrSchedule::constant(0.1));
    assert_eq!(config.weight_decay_filter().excluded, ["bias", "embedding"]);
    let config = parse_with(
        MINIMAL,
        &[
            "train.lr_schedule=\"cosine\"",
            "train.warmup_steps=10",
            "train.min_lr=0.01",
            "train.decay_steps=100",
        ],
    )
    .unwrap();
    assert_eq!(
        config.lr_schedule().decay,
        runtime::LrDecay::CosineWithWarmUp {
            lr_end: 0.01,
            decay_steps: Some(100),
            num_cycles: 0.5,
        }
    );
    assert_eq!(config.lr_schedule().warmup_steps, 10);
}

/// A front end's configuration for a network built in code: the file's sections and rules, the
/// model and data from the caller, `[model]` and `[data]` refused.
#[test]
fn a_network_built_in_code_takes_the_files_sections_and_rules() {
    let (_, text) = example("seed_semi_auto.toml");
    let mut root: toml::Table = text.parse().unwrap();
    let file = TrainConfig::parse(&text, None, &[], Path::new("/w")).unwrap();
    let model = file.model().clone();
    let data = file.data().clone();
    // With [model] and [data] left in: refused, naming the section.
    let err = TrainConfig::for_network(root.clone(), Path::new("/w"), model.clone(), data.clone())
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Config { key, .. } if key == "model"),
        "{err}"
    );
    root.remove("model");
    root.remove("data");
    let config =
        TrainConfig::for_network(root.clone(), Path::new("/w"), model.clone(), data.clone())
            .unwrap();
    assert_eq!(config.parallel_config(), file.parallel_config());
    assert_eq!(config.optimizer_config(), file.optimizer_config());
    assert_eq!(config.output().dir, file.output().dir);
    // A key's rule is the file's: a bad pipeline is an error naming the key.
    let mut bad = root.clone();
    let parallel = bad["parallel"].as_table_mut().unwrap();
    parallel.insert(
        "pipeline".to_string(),
        toml::Value::Table(toml::toml! { stages = 0 }),
    );
    let err = TrainConfig::for_network(bad, Path::new("/w"), model, data).unwrap_err();
    assert!(err.to_string().contains("parallel.pipeline"), "{err}");
}

/// A GPT config (parsing only: the text file need not exist).
const GPT_MINIMAL: &str = r#"
[model]
name = "gpt"
layers = 2
heads = 4
hidden = 32
seq_len = 16
[data]
format = "text"
path = "t.txt"
batch_size = 8
[train]
epochs = 1
optimizer = "adam"
learning_rate = 0.01
[output]
dir = "out"
"#;

/// The MindFormers keys split the GPT in `semi_auto` only: in any other mode each one set is
/// reported as having no effect (none is when it is left at its default), and
/// `expert_parallel` without `[model.moe]` is refused in every mode.
#[test]
fn gpt_parallel_keys_outside_semi_auto_are_warned_about() {
    let keys = [
        "parallel.model_parallel=2",
        "parallel.context_parallel=2",
        "parallel.context_parallel_algo=\"ring\"",
        "parallel.use_seq_parallel=true",
    ];
    for (mode, why) in [
        ("stand_alone", "only semi_auto"),
        ("data_parallel", "only semi_auto"),
        ("sharding_propagation", "the search chooses"),
    ] {
        let mode_key = format!("parallel.mode=\"{mode}\"");
        let mut overrides = vec![mode_key.as_str(), "parallel.devices=4"];
        overrides.extend(keys);
        let config = parse_with(GPT_MINIMAL, &overrides).unwrap();
        let warnings = config.warnings().join("\n");
        for key in keys {
            let name = key.split('=').next().unwrap();
            let line = format!("{name} has no effect in mode \"{mode}\"");
            assert!(warnings.contains(&line), "{line} missing from:\n{warnings}");
        }
        assert!(warnings.contains(why), "{warnings}");
        let plain = parse_with(GPT_MINIMAL, &[mode_key.as_str(), "parallel.devices=4"]).unwrap();
        assert!(
            !plain
                .warnings()
                .iter()
                .any(|w| w.contains("parallel.model_parallel")),
            "{:?}",
            plain.warnings()
        );
        let (key, reason) = config_error(parse_with(
            GPT_MINIMAL,
            &[mode_key.as_str(), "parallel.expert_parallel=2"],
        ));
        assert_eq!(key, "parallel.expert_parallel", "{mode}");
        assert!(reason.contains("set [model.moe]"), "{reason}");
    }
    let semi = parse_with(
        GPT_MINIMAL,
        &["parallel.mode=\"semi_auto\"", "parallel.devices=4", keys[0]],
    )
    .unwrap();
    assert!(semi.warnings().is_empty(), "{:?}", semi.warnings());
}

/// In semi_auto with model and context parallel 1, every device is a data-parallel shard: a
/// `data_parallel` that says otherwise is reported as unused, against the device count in
/// force (after `--devices`).
#[test]
fn a_data_parallel_semi_auto_does_not_use_is_warned_about() {
    let unused = |warnings: Vec<String>| {
        warnings
            .into_iter()
            .find(|w| w.contains("parallel.data_parallel = 2 is not used"))
    };
    let semi = ["parallel.mode=\"semi_auto\"", "parallel.devices=4"];
    let config = parse_with(GPT_MINIMAL, &[semi[0], semi[1], "parallel.data_parallel=2"]).unwrap();
    let warning = unused(config.warnings()).expect("warned");
    assert!(warning.contains("every one of the 4 devices"), "{warning}");
    // On 2 devices the key is what happens anyway.
    let config = config.with_devices(2).unwrap();
    assert_eq!(unused(config.warnings()), None);
    // With model parallel the key is used.
    let config = parse_with(
        GPT_MINIMAL,
        &[
            semi[0],
            semi[1],
            "parallel.data_parallel=2",
            "parallel.model_parallel=2",
        ],
    )
    .unwrap();
    assert_eq!(unused(config.warnings()), None);
    // More pipeline stages than devices: no stage has a device, which the pipeline check
    // refuses; no warning about "every one of the 0 devices" comes before it.
    let staged = parse_with(
        GPT_MINIMAL,
        &[
            semi[0],
            semi[1],
            "parallel.data_parallel=2",
            "parallel.pipeline.stages=8",
        ],
    )
    .unwrap();
    let warnings = staged.warnings();
    assert!(
        warnings.iter().all(|w| !w.contains("0 devices")),
        "{warnings:?}"
    );
}

/// Mixture-of-experts blocks are refused in parameter-server mode (each worker would balance
/// the experts over its own batch), naming `model.moe`.
#[test]
fn moe_is_refused_in_parameter_server_mode() {
    let (key, reason) = config_error(parse_with(
        GPT_MINIMAL,
        &["parallel.mode=\"parameter_server\"", "model.moe.experts=4"],
    ));
    assert_eq!(key, "model.moe");
    assert!(reason.contains("parameter_server"), "{reason}");
    assert!(parse_with(GPT_MINIMAL, &["parallel.mode=\"parameter_server\""]).is_ok());
}

/// `output.group_info_file` inside a checkpoint set's folder (which every checkpoint replaces)
/// is refused naming the key; beside them, or at an absolute path, it is taken as given.
#[test]
fn a_group_info_file_inside_a_checkpoint_folder_is_refused() {
    for inside in ["rank_{rank}/g.pb", "rank_0/g.pb", "checkpoint_step_5/g.pb"] {
        let set = format!("output.group_info_file=\"{inside}\"");
        let (key, reason) = config_error(parse_with(MINIMAL, &[set.as_str()]));
        assert_eq!(key, "output.group_info_file");
        assert!(reason.contains("replaces"), "{reason}");
    }
    for fine in ["group_info.pb", "groups/g_{rank}.pb", "/tmp/g.pb"] {
        let set = format!("output.group_info_file=\"{fine}\"");
        let config = parse_with(MINIMAL, &[set.as_str()]).unwrap();
        assert_eq!(config.output().group_info_file.as_deref(), Some(fine));
    }
}

/// The seed MLP's weights are bounded before any graph is built: an absurd `model.hidden` or
/// `model.classes` is refused naming the key that makes the largest weight.
#[test]
fn absurd_mlp_sizes_name_their_key() {
    let (key, reason) = config_error(parse_with(MINIMAL, &["model.hidden=1000000000000"]));
    assert_eq!(key, "model.hidden");
    assert!(reason.contains("element bound"), "{reason}");
    let (key, _) = config_error(parse_with(MINIMAL, &["model.classes=100000000000"]));
    assert_eq!(key, "model.classes");
    assert!(parse_with(MINIMAL, &["model.hidden=4096"]).is_ok());
}

/// `--devices` replaces `parallel.devices` before the keys that depend on the count are
/// checked: `parallel.hsdp.shard_size` is checked against the count the run uses, not the
/// file's.
#[test]
fn the_devices_flag_is_the_count_every_key_is_checked_against() {
    let on = |overrides: &[&str], devices: usize| {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        TrainConfig::parse_on(
            MINIMAL,
            Some(Path::new("conf.toml")),
            &overrides,
            Some(devices),
            Path::new("/base"),
        )
    };
    let semi = "parallel.mode=\"data_parallel\"";
    // Valid on 4 devices, though the file says 1.
    let config = on(&[semi, "parallel.hsdp.shard_size=2"], 4).unwrap();
    assert_eq!(config.parallel_config().devices, 4);
    assert_eq!(
        config.parallel_config().hsdp.map(|h| h.shard_size),
        Some(Some(2))
    );
    // Invalid on 4 devices, though the file's 8 would allow it.
    let err = on(
        &[semi, "parallel.devices=8", "parallel.hsdp.shard_size=8"],
        4,
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("parallel.hsdp.shard_size")
            && text.contains("8 must be -1 or a positive divisor of the 4 devices"),
        "{text}"
    );
    // A bad count is named as the flag.
    assert!(matches!(
        on(&[], 0),
        Err(RuntimeError::Config { key, .. }) if key == "--devices"
    ));
    // `with_devices` on a parsed config checks the same key.
    let config = parse_with(
        MINIMAL,
        &[semi, "parallel.devices=8", "parallel.hsdp.shard_size=8"],
    )
    .unwrap();
    let err = config.with_devices(4).unwrap_err().to_string();
    assert!(
        err.contains("parallel.hsdp.shard_size") && err.contains("--devices"),
        "{err}"
    );
}

/// An error about a batch that micro-batches cut says so: the batch it quotes is one
/// micro-batch, cut from the file's `data.batch_size` by the named setting.
#[test]
fn a_batch_error_after_a_micro_batch_cut_names_the_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let parallel = "devices = 4\nmode = \"semi_auto\"\ndata_parallel = 2\n\
                    [parallel.pipeline]\nstages = 2\nmicro_batches = 8";
    let config = crate::run_util::small_gpt(tmp.path(), "sgd", "", parallel, &[]);
    let err = match runtime::Session::new(&config) {
        Ok(_) => panic!("a micro-batch of 1 row cannot be split over 2 ranks"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("data.batch_size")
            && err.contains("one micro-batch of 1 rows")
            && err.contains("data.batch_size = 8 cut by parallel.pipeline.micro_batches = 8"),
        "{err}"
    );
    let err = runtime::plan(&config).unwrap_err().to_string();
    assert!(
        err.contains("cut by parallel.pipeline.micro_batches = 8"),
        "{err}"
    );
}

/// `virtual_stages` without interleaving is reported as having no effect; a bad stage number's
/// key quotes a cell prefix holding a dot, as the key is written.
#[test]
fn pipeline_keys_without_effect_are_warned_and_stage_keys_quoted() {
    let pipeline = [
        "parallel.pipeline.stages=2",
        "parallel.pipeline.virtual_stages=3",
    ];
    let config = parse_with(MINIMAL, &pipeline).unwrap();
    assert!(
        config
            .warnings()
            .iter()
            .any(|w| w.contains("virtual_stages = 3 has no effect")),
        "{:?}",
        config.warnings()
    );
    let config = parse_with(
        MINIMAL,
        &[
            pipeline[0],
            pipeline[1],
            "parallel.pipeline.scheduler=\"interleaved_1f1b\"",
            "parallel.pipeline.micro_batches=2",
        ],
    )
    .unwrap();
    assert!(!config
        .warnings()
        .iter()
        .any(|w| w.contains("virtual_stages")));
    let err = parse_with(
        MINIMAL,
        &[
            pipeline[0],
            "parallel.pipeline.stage_config.\"blocks.1\"=-1",
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("parallel.pipeline.stage_config.\"blocks.1\""),
        "{err}"
    );
}

/// A text run without a validation split that asks for evaluation is warned: nothing is
/// evaluated.
#[test]
fn evaluation_without_a_validation_split_is_warned() {
    let warned = |overrides: &[&str]| {
        parse_with(GPT_MINIMAL, overrides)
            .unwrap()
            .warnings()
            .iter()
            .any(|w| w.contains("data.val_fraction = 0"))
    };
    assert!(warned(&["data.val_fraction=0.0", "train.eval=true"]));
    assert!(warned(&[
        "data.val_fraction=0.0",
        "train.eval=false",
        "train.eval_interval=2"
    ]));
    assert!(!warned(&["data.val_fraction=0.0", "train.eval=false"]));
    assert!(!warned(&["data.val_fraction=0.1", "train.eval=true"]));
}

/// Search, resume and retention keys set where nothing reads them were taken silently: a
/// `load_operator_strategy_file` or `search_time_budget` outside the search modes, a device
/// profile or memory budget `tessera train` ignores outside them (even a profile file that
/// does not exist, or a 2-byte budget), a `resume_strategy` without `resume_from`, a
/// `keep_checkpoint_max` without periodic sets. Each is now a warning naming the key.
#[test]
fn search_resume_and_retention_keys_without_effect_are_warned_about() {
    let config = parse_with(
        MINIMAL,
        &[
            "parallel.mode=semi_auto",
            "parallel.devices=2",
            "parallel.load_operator_strategy_file=strategies.json",
            "parallel.search_time_budget=2",
            "parallel.device_profile=no-such-profile.toml",
            "parallel.max_device_memory=2",
            "parallel.save_operator_strategy_file=out.json",
            "output.resume_strategy=strategy.json",
            "output.keep_checkpoint_max=3",
        ],
    )
    .unwrap();
    let warnings = config.warnings().join("\n");
    for expected in [
        "parallel.load_operator_strategy_file has no effect in mode \"semi_auto\"",
        "parallel.search_time_budget has no effect in mode \"semi_auto\"",
        "output.resume_strategy has no effect without output.resume_from",
        "output.keep_checkpoint_max has no effect without output.save_checkpoint_steps",
    ] {
        assert!(
            warnings.contains(expected),
            "{expected} missing from:\n{warnings}"
        );
    }
    // `tessera plan` costs semi_auto's strategies with the profile and the budget, and writes
    // the strategy file: only training ignores them.
    assert!(!warnings.contains("device_profile"), "{warnings}");
    let train = config.train_warnings().join("\n");
    for key in [
        "device_profile",
        "max_device_memory",
        "save_operator_strategy_file",
    ] {
        assert!(
            train.contains(&format!("parallel.{key} has no effect on training")),
            "{key} missing from:\n{train}"
        );
    }
    // In a search mode, or where each key has its partner, none is warned about.
    let used = parse_with(
        MINIMAL,
        &[
            "parallel.mode=dynamic_programming",
            "parallel.devices=2",
            "parallel.search_time_budget=2",
            "parallel.max_device_memory=2000000",
            "output.resume_from=run",
            "output.resume_strategy=strategy.json",
            "output.save_checkpoint_steps=10",
            "output.keep_checkpoint_max=3",
        ],
    )
    .unwrap();
    assert!(used.warnings().is_empty(), "{:?}", used.warnings());
    assert!(
        used.train_warnings().is_empty(),
        "{:?}",
        used.train_warnings()
    );
}

/// A key without effect in a config (another data format's, another model's, another
/// optimizer's or schedule's) used to be dropped unread, with a warning that it has no effect,
/// whatever its value: `data.dtype = 5` beside IDX data was "without effect", not wrong. Its
/// value is now checked by the rule that reads it where it acts, and a wrong type or a value out
/// of its range is an error naming the key and the rule, in the file and from `--set`; a good
/// value is still only a warning.
#[test]
fn keys_without_effect_are_still_type_and_range_checked() {
    // (config, overrides, key, fragment of the reason)
    let cases: [(&str, &[&str], &str, &str); 24] = [
        // Text-format keys beside IDX data.
        (
            MINIMAL,
            &["data.dtype=5"],
            "data.dtype",
            "expected a string, got integer 5",
        ),
        (
            MINIMAL,
            &["data.dtype=\"u8\""],
            "data.dtype",
            "unknown value \"u8\" (valid: u16, u32)",
        ),
        (
            MINIMAL,
            &["data.val_fraction=1.5"],
            "data.val_fraction",
            "at least 0 and below 1",
        ),
        (
            MINIMAL,
            &["data.eval_batches=0"],
            "data.eval_batches",
            "must be ≥ 1",
        ),
        (
            MINIMAL,
            &["data.tokenizer=\"word\""],
            "data.tokenizer",
            "valid: byte, char",
        ),
        (MINIMAL, &["data.path=3"], "data.path", "expected a string"),
        (
            MINIMAL,
            &["data.vocab_size=-2"],
            "data.vocab_size",
            "must be ≥ 1",
        ),
        // The GPT's keys beside the seed MLP.
        (
            MINIMAL,
            &["model.layers=\"4\""],
            "model.layers",
            "expected a positive integer",
        ),
        (
            MINIMAL,
            &["model.dropout=1.5"],
            "model.dropout",
            "at least 0 and below 1",
        ),
        (
            MINIMAL,
            &["model.moe.experts=1"],
            "model.moe.experts",
            "must be ≥ 2",
        ),
        (
            MINIMAL,
            &["model.tie_embeddings=1"],
            "model.tie_embeddings",
            "expected a boolean",
        ),
        (
            MINIMAL,
            &["parallel.model_parallel=0"],
            "parallel.model_parallel",
            "must be ≥ 1",
        ),
        (
            MINIMAL,
            &["parallel.context_parallel_algo=\"zigzag\""],
            "parallel.context_parallel_algo",
            "unknown value \"zigzag\"",
        ),
        // Another optimizer's hyperparameters (MINIMAL trains with SGD).
        (
            MINIMAL,
            &["train.beta1=1.5"],
            "train.beta1",
            "it must lie in (0, 1)",
        ),
        (
            MINIMAL,
            &["train.momentum=-0.5"],
            "train.momentum",
            "it must be ≥ 0",
        ),
        (
            MINIMAL,
            &["train.use_nesterov=1"],
            "train.use_nesterov",
            "expected a boolean",
        ),
        // Another schedule's keys (MINIMAL's schedule is constant, without warm-up).
        (MINIMAL, &["train.min_lr=-1"], "train.min_lr", "must be ≥ 0"),
        (
            MINIMAL,
            &["train.power=\"high\""],
            "train.power",
            "expected a number",
        ),
        (
            MINIMAL,
            &["train.milestone=[3, 2]"],
            "train.milestone",
            "above the one before",
        ),
        (
            MINIMAL,
            &["train.decay_rate=0"],
            "train.decay_rate",
            "finite and > 0",
        ),
        (
            MINIMAL,
            &["train.warmup_lr_init=0.5"],
            "train.warmup_lr_init",
            "≤ train.learning_rate",
        ),
        // The image format's keys, and the seed MLP's, beside a GPT on text.
        (
            GPT_MINIMAL,
            &["data.pixel_max=-1"],
            "data.pixel_max",
            "finite and > 0",
        ),
        (
            GPT_MINIMAL,
            &["data.normalize=\"z\""],
            "data.normalize",
            "valid: standardize, scale",
        ),
        (
            GPT_MINIMAL,
            &["model.classes=0"],
            "model.classes",
            "must be ≥ 1",
        ),
    ];
    for (text, overrides, key, fragment) in cases {
        let (got_key, reason) = config_error(parse_with(text, overrides));
        assert_eq!(got_key, key, "{overrides:?}: {reason}");
        assert!(reason.contains(fragment), "{overrides:?}: {reason}");
        assert!(reason.contains("--set"), "{overrides:?}: {reason}");
    }
    // The same value in the file names the file.
    let (key, reason) = file_error(parse_with(&with_line("data", "dtype = 5"), &[]));
    assert_eq!(key, "data.dtype");
    assert!(reason.contains("expected a string"), "{reason}");
    // Good values of the same keys are accepted, each with its warning.
    let good = parse_with(
        MINIMAL,
        &[
            "data.dtype=\"u32\"",
            "model.layers=4",
            "model.moe.experts=4",
            "parallel.model_parallel=2",
            "train.beta1=0.8",
            "train.min_lr=0.01",
            "train.milestone=[2, 3]",
            "train.warmup_lr_init=0.05",
        ],
    )
    .unwrap();
    let warnings = good.warnings().join("\n");
    for key in [
        "data.dtype",
        "model.layers",
        "model.moe",
        "parallel.model_parallel",
        "train.beta1",
        "train.min_lr",
        "train.milestone",
        "train.warmup_lr_init",
    ] {
        assert!(
            warnings.contains(&format!("{key} has no effect")),
            "{key} missing from:\n{warnings}"
        );
    }
    // An empty device profile is no profile, in any mode.
    let (key, reason) = config_error(parse_with(MINIMAL, &["parallel.device_profile=\"\""]));
    assert_eq!(key, "parallel.device_profile");
    assert!(reason.contains("empty path"), "{reason}");
}

/// A session (and a plan) checks the config's paths before it reads, builds or searches
/// anything: each error is a config error naming the key, the path and the kind expected
/// (they were bare system errors: "Is a directory (os error 21)").
#[test]
fn a_session_checks_its_config_paths_before_reading_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a_file");
    std::fs::write(&file, b"x").unwrap();
    let digits = repo_root().join("data/digits");
    let quoted = |key: &str, path: &Path| format!("{key}={:?}", path.to_str().unwrap());
    let data_dir = quoted("data.dir", &digits);
    let cases: Vec<(Vec<String>, &str, &Path, &str)> = vec![
        (
            vec![quoted("data.dir", &file)],
            "data.dir",
            &file,
            "is a file",
        ),
        (
            vec![quoted("data.dir", &tmp.path().join("missing"))],
            "data.dir",
            tmp.path(),
            "does not exist",
        ),
        (
            vec![
                data_dir.clone(),
                quoted("parallel.strategy_file", tmp.path()),
            ],
            "parallel.strategy_file",
            tmp.path(),
            "is a directory; expected a file",
        ),
        (
            vec![
                data_dir.clone(),
                "parallel.mode=sharding_propagation".to_string(),
                quoted("parallel.load_operator_strategy_file", tmp.path()),
            ],
            "parallel.load_operator_strategy_file",
            tmp.path(),
            "is a directory; expected a file",
        ),
        (
            vec![
                data_dir.clone(),
                "parallel.mode=sharding_propagation".to_string(),
                quoted("parallel.save_operator_strategy_file", &file.join("s.json")),
            ],
            "parallel.save_operator_strategy_file",
            &file,
            "is a file, not a directory",
        ),
    ];
    for (sets, key, path, problem) in &cases {
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let config = parse_with(MINIMAL, &sets).unwrap();
        let session = match runtime::Session::new(&config) {
            Ok(_) => panic!("{sets:?} should be refused"),
            Err(e) => e,
        };
        let plan = runtime::plan(&config).unwrap_err();
        for err in [session, plan] {
            match &err {
                RuntimeError::Config { key: named, reason } => {
                    assert_eq!(named, key, "{err}");
                    let path = path.to_str().unwrap();
                    assert!(reason.contains(path) && reason.contains(problem), "{err}");
                }
                other => panic!("{sets:?}: expected a config error, got {other}"),
            }
        }
    }
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        1,
        "nothing is left"
    );
}

/// An error about a whole table (`parallel.pipeline`'s keys checked together) lists every
/// override inside it instead of blaming the last one given (`virtual_stages = 1 … (the value
/// comes from --set parallel.pipeline.scheduler=gpipe)` named a key that broke no rule); an
/// error about one key still names the override that set it.
#[test]
fn a_table_error_lists_the_overrides_inside_it() {
    let sets = [
        "parallel.mode=\"semi_auto\"",
        "parallel.devices=2",
        "parallel.pipeline.stages=2",
        "parallel.pipeline.interleave=true",
        "parallel.pipeline.virtual_stages=1",
        "parallel.pipeline.scheduler=\"gpipe\"",
    ];
    let err = parse_with(MINIMAL, &sets).unwrap_err().to_string();
    assert!(
        err.contains(
            "parallel.pipeline keys set by --set parallel.pipeline.stages=2, --set \
             parallel.pipeline.interleave=true, --set parallel.pipeline.virtual_stages=1, --set \
             parallel.pipeline.scheduler=\"gpipe\""
        ) && !err.contains("the value comes from"),
        "{err}"
    );
    let err = parse_with(MINIMAL, &["train.epochs=0"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("(the value comes from --set train.epochs=0)"),
        "{err}"
    );
}
