//! Optimizers follow MindSpore's update rules and are sharding-independent.

use exec::{ExecError, Optimizer, OptimizerConfig, OptimizerKind, ParamSpec};
use layout::SliceBox;
use tensor::{DType, Tensor};

const MOMENTUM: OptimizerKind = OptimizerKind::Momentum {
    momentum: 0.9,
    use_nesterov: false,
};
const NESTEROV: OptimizerKind = OptimizerKind::Momentum {
    momentum: 0.9,
    use_nesterov: true,
};
const ADAM: OptimizerKind = OptimizerKind::Adam {
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    use_amsgrad: false,
    use_nesterov: false,
};
const ADAM_NESTEROV: OptimizerKind = OptimizerKind::Adam {
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    use_amsgrad: false,
    use_nesterov: true,
};
const ADAM_AMSGRAD: OptimizerKind = OptimizerKind::Adam {
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    use_amsgrad: true,
    use_nesterov: false,
};
const LAMB: OptimizerKind = OptimizerKind::Lamb {
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-6,
};
const ADAMW: OptimizerKind = OptimizerKind::AdamW {
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-6,
};

/// One of each rule (momentum twice: plain and Nesterov; Adam thrice: plain, Nesterov and
/// AMSGrad).
const EVERY_RULE: [OptimizerKind; 9] = [
    OptimizerKind::Sgd,
    MOMENTUM,
    NESTEROV,
    ADAM,
    ADAM_NESTEROV,
    ADAM_AMSGRAD,
    ADAMW,
    MINT_ADAMW,
    LAMB,
];

fn config(kind: OptimizerKind, learning_rate: f64, weight_decay: f64) -> OptimizerConfig {
    OptimizerConfig {
        kind,
        learning_rate,
        weight_decay,
    }
}

fn spec(name: &str, shape: &[usize], dtype: DType) -> ParamSpec {
    ParamSpec {
        name: name.to_string(),
        shape: shape.to_vec(),
        dtype,
    }
}

/// Runs `grads.len()` steps on the scalar parameter `1.0` (f64) and returns it after each.
fn scalar_run(config: OptimizerConfig, grads: &[f64]) -> Vec<f64> {
    let mut opt = Optimizer::new(config, &[spec("w", &[1], DType::F64)]).unwrap();
    let mut p = Tensor::from_vec(&[1], vec![1f64]).unwrap();
    grads
        .iter()
        .map(|&g| {
            opt.begin_step();
            opt.update_whole(0, &mut p, &Tensor::from_vec(&[1], vec![g]).unwrap())
                .unwrap();
            p.as_slice::<f64>().unwrap()[0]
        })
        .collect()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "element {i}: got {g}, want {w}"
        );
    }
}

/// Values worked out by hand from MindSpore's formulas (see the optimizer module docs).
#[test]
fn each_rule_matches_hand_computed_steps() {
    // SGD, wd 0.01: g' = 0.5 + 0.01·1 = 0.51, p = 1 - 0.051; then g' = 0.5 + 0.01·0.949.
    assert_close(
        &scalar_run(config(OptimizerKind::Sgd, 0.1, 0.01), &[0.5, 0.5]),
        &[0.949, 0.898051],
        1e-15,
    );
    // Momentum: v = 0.5, p = 0.95; v = 0.9·0.5 + 0.5 = 0.95, p = 0.95 - 0.095.
    assert_close(
        &scalar_run(config(MOMENTUM, 0.1, 0.0), &[0.5, 0.5]),
        &[0.95, 0.855],
        1e-15,
    );
    // Nesterov: p = 1 - 0.1·(0.5 + 0.9·0.5); p = 0.905 - 0.1·(0.5 + 0.9·0.95).
    assert_close(
        &scalar_run(config(NESTEROV, 0.1, 0.0), &[0.5, 0.5]),
        &[0.905, 0.7695],
        1e-15,
    );
    // Adam: lr_t = 0.1·√(1-0.999)/(1-0.9) = √0.001, m = 0.05, v = 0.00025, ε outside √v.
    assert_close(
        &scalar_run(config(ADAM, 0.1, 0.0), &[0.5, -0.25]),
        &[0.900_000_063_245_513_2, 0.873_366_374_351_792_9],
        1e-14,
    );
    // AdamWeightDecay: no bias correction, p -= 0.1·(m/(√v + 1e-6) + 0.01·p).
    assert_close(
        &scalar_run(config(ADAMW, 0.1, 0.01), &[0.5, -0.25]),
        &[0.682_792_232_718_331_2, 0.568_933_478_252_400_7],
        1e-14,
    );
}

/// An independent f64 transcription of MindSpore's formulas, element by element (Lamb's
/// trust ratio over the whole vector, as the `Lamb` kernel computes it).
fn reference(kind: OptimizerKind, lr: f64, wd: f64, p0: &[f64], grads: &[Vec<f64>]) -> Vec<f64> {
    let mut p = p0.to_vec();
    let mut s1 = vec![0.0; p.len()];
    let mut s2 = vec![0.0; p.len()];
    let mut s3 = vec![0.0; p.len()];
    for (t, g) in grads.iter().enumerate() {
        let t = (t + 1) as i32;
        if let OptimizerKind::Lamb { beta1, beta2, eps } = kind {
            let (bc1, bc2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
            let mut update = vec![0.0; p.len()];
            let (mut w2, mut u2) = (0.0, 0.0);
            for i in 0..p.len() {
                s1[i] = beta1 * s1[i] + (1.0 - beta1) * g[i];
                s2[i] = beta2 * s2[i] + (1.0 - beta2) * g[i] * g[i];
                let (m_hat, v_hat) = (s1[i] / bc1, s2[i] / bc2);
                update[i] = m_hat / (v_hat.sqrt() + eps) + wd * p[i];
                let g_hat = m_hat / (v_hat + eps).sqrt() + wd * p[i];
                w2 += p[i] * p[i];
                u2 += g_hat * g_hat;
            }
            let (w, u) = (f64::sqrt(w2), f64::sqrt(u2));
            let ratio = if w > 0.0 && u > 0.0 { w / u } else { 1.0 };
            let ratio = ratio.clamp(0.0, 10.0);
            for i in 0..p.len() {
                p[i] -= lr * ratio * update[i];
            }
            continue;
        }
        for i in 0..p.len() {
            match kind {
                OptimizerKind::Sgd => p[i] -= lr * (g[i] + wd * p[i]),
                OptimizerKind::Momentum {
                    momentum,
                    use_nesterov,
                } => {
                    let gd = g[i] + wd * p[i];
                    s1[i] = s1[i] * momentum + gd;
                    p[i] -= if use_nesterov {
                        gd * lr + s1[i] * momentum * lr
                    } else {
                        lr * s1[i]
                    };
                }
                OptimizerKind::Adam {
                    beta1,
                    beta2,
                    eps,
                    use_amsgrad,
                    use_nesterov,
                } => {
                    let gd = g[i] + wd * p[i];
                    s1[i] = beta1 * s1[i] + (1.0 - beta1) * gd;
                    s2[i] = beta2 * s2[i] + (1.0 - beta2) * gd * gd;
                    let l = lr * (1.0 - beta2.powi(t)).sqrt() / (1.0 - beta1.powi(t));
                    if use_amsgrad {
                        // ApplyAdamWithAmsgradV2: v̂ = max(v̂, v).
                        s3[i] = f64::max(s3[i], s2[i]);
                        p[i] -= l * s1[i] / (s3[i].sqrt() + eps);
                    } else if use_nesterov {
                        // ops.Adam(use_nesterov=True).
                        p[i] -= l * (beta1 * s1[i] + (1.0 - beta1) * gd) / (s2[i].sqrt() + eps);
                    } else {
                        p[i] -= l * s1[i] / (s2[i].sqrt() + eps);
                    }
                }
                OptimizerKind::AdamW { beta1, beta2, eps } => {
                    s1[i] = beta1 * s1[i] + (1.0 - beta1) * g[i];
                    s2[i] = beta2 * s2[i] + (1.0 - beta2) * g[i] * g[i];
                    let update = s1[i] / (s2[i].sqrt() + eps) + wd * p[i];
                    p[i] -= lr * update;
                }
                OptimizerKind::MintAdamW { beta1, beta2, eps } => {
                    p[i] -= lr * wd * p[i];
                    s1[i] = beta1 * s1[i] + (1.0 - beta1) * g[i];
                    s2[i] = beta2 * s2[i] + (1.0 - beta2) * g[i] * g[i];
                    let m_hat = s1[i] / (1.0 - beta1.powi(t));
                    let v_hat = s2[i] / (1.0 - beta2.powi(t));
                    p[i] -= lr * m_hat / (v_hat.sqrt() + eps);
                }
                OptimizerKind::Lamb { .. } => unreachable!("handled above"),
            }
        }
    }
    p
}

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, salt: usize) -> Vec<f64> {
    (0..n)
        .map(|i| (((i * 7919 + salt * 104_729) % 2003) as f64 / 1001.5) - 1.0)
        .collect()
}

fn run(
    kind: OptimizerKind,
    dtype: DType,
    name: &str,
    p0: &[f64],
    grads: &[Vec<f64>],
    wd: f64,
) -> Vec<f64> {
    let n = p0.len();
    let mut opt = Optimizer::new(config(kind, 0.05, wd), &[spec(name, &[n], dtype)]).unwrap();
    let mut p = Tensor::from_vec(&[n], p0.to_vec()).unwrap().to_dtype(dtype);
    for g in grads {
        opt.begin_step();
        let g = Tensor::from_vec(&[n], g.clone()).unwrap().to_dtype(dtype);
        opt.update_whole(0, &mut p, &g).unwrap();
    }
    p.to_f64_vec()
}

#[test]
fn every_rule_follows_the_reference_over_several_steps_in_f64_and_f32() {
    let p0 = values(37, 1);
    let grads: Vec<Vec<f64>> = (0..6).map(|s| values(37, s + 2)).collect();
    for kind in EVERY_RULE {
        let want = reference(kind, 0.05, 0.02, &p0, &grads);
        assert_close(
            &run(kind, DType::F64, "fc1_weight", &p0, &grads, 0.02),
            &want,
            1e-12,
        );
        assert_close(
            &run(kind, DType::F32, "fc1_weight", &p0, &grads, 0.02),
            &want,
            2e-5,
        );
    }
}

#[test]
fn weight_decay_skips_beta_and_gamma_parameters_as_mindspore_does() {
    let p0 = values(9, 3);
    let grads: Vec<Vec<f64>> = (0..3).map(|s| values(9, s + 5)).collect();
    for kind in EVERY_RULE {
        let undecayed = reference(kind, 0.05, 0.0, &p0, &grads);
        let decayed = reference(kind, 0.05, 0.3, &p0, &grads);
        assert_close(
            &run(kind, DType::F64, "ln.gamma", &p0, &grads, 0.3),
            &undecayed,
            1e-12,
        );
        assert_close(
            &run(kind, DType::F64, "ln.beta", &p0, &grads, 0.3),
            &undecayed,
            1e-12,
        );
        assert_close(
            &run(kind, DType::F64, "fc.weight", &p0, &grads, 0.3),
            &decayed,
            1e-12,
        );
    }
    assert!(exec::applies_weight_decay("fc1_weight"));
    assert!(!exec::applies_weight_decay("layernorm.gamma"));
}

/// Updating the shards of a tensor, each with its own optimizer state, gives exactly the
/// update of the whole tensor: for row halves and for column halves (a strided box).
#[test]
fn updating_shards_separately_equals_updating_the_whole() {
    let shape = [4usize, 6];
    let p0 = Tensor::from_vec(&shape, values(24, 7).iter().map(|&x| x as f32).collect()).unwrap();
    let grads: Vec<Tensor> = (0..5)
        .map(|s| {
            Tensor::from_vec(
                &shape,
                values(24, s + 11).iter().map(|&x| x as f32).collect(),
            )
            .unwrap()
        })
        .collect();
    let halves = [
        [
            SliceBox::new(vec![0, 0], vec![2, 6]),
            SliceBox::new(vec![2, 0], vec![2, 6]),
        ],
        [
            SliceBox::new(vec![0, 0], vec![4, 3]),
            SliceBox::new(vec![0, 3], vec![4, 3]),
        ],
    ];
    // Lamb is not elementwise: its shards need the whole parameter's norms (tested below).
    for kind in EVERY_RULE.into_iter().filter(|k| !k.needs_norms()) {
        let cfg = config(kind, 0.01, 0.05);
        let mut whole = p0.clone();
        let mut opt = Optimizer::new(cfg, &[spec("w", &shape, DType::F32)]).unwrap();
        for g in &grads {
            opt.begin_step();
            opt.update(0, &mut whole, g).unwrap();
        }
        for boxes in &halves {
            let specs: Vec<ParamSpec> = boxes
                .iter()
                .map(|b| spec("w", &b.shape, DType::F32))
                .collect();
            let mut sharded = Optimizer::new(cfg, &specs).unwrap();
            let mut shards: Vec<Tensor> =
                boxes.iter().map(|b| p0.extract_box(b).unwrap()).collect();
            for g in &grads {
                sharded.begin_step();
                for (i, b) in boxes.iter().enumerate() {
                    sharded
                        .update(i, &mut shards[i], &g.extract_box(b).unwrap())
                        .unwrap();
                }
            }
            let mut assembled = Tensor::zeros(DType::F32, &shape);
            for (b, shard) in boxes.iter().zip(&shards) {
                assembled.insert_box(b, shard).unwrap();
            }
            assert_eq!(assembled, whole, "{kind:?} over {boxes:?}");
            // The state is sharded like the parameter.
            for (i, b) in boxes.iter().enumerate() {
                for ((name, local), (_, global)) in sharded
                    .state(i)
                    .unwrap()
                    .into_iter()
                    .zip(opt.state(0).unwrap())
                {
                    assert_eq!(local, &global.extract_box(b).unwrap(), "state {name}");
                }
            }
        }
    }
}

#[test]
fn state_is_named_as_mindspore_names_it_and_resumes_exactly() {
    let names = |kind: OptimizerKind| kind.state_names().to_vec();
    assert!(names(OptimizerKind::Sgd).is_empty());
    assert_eq!(names(MOMENTUM), ["moments"]);
    assert_eq!(names(ADAM), ["moment1", "moment2"]);
    assert_eq!(names(ADAM_NESTEROV), ["moment1", "moment2"]);
    assert_eq!(names(ADAM_AMSGRAD), ["moment1", "moment2", "vhat"]);
    assert_eq!(names(ADAMW), ["adam_m", "adam_v"]);
    assert_eq!(names(LAMB), ["lamb_m", "lamb_v"]);
    assert_eq!(
        exec::state_checkpoint_name("moments", "fc1_weight"),
        "moments.fc1_weight"
    );

    let p0 = values(8, 2);
    let grads: Vec<Vec<f64>> = (0..6).map(|s| values(8, s + 20)).collect();
    let to_tensor = |v: &Vec<f64>| Tensor::from_vec(&[8], v.clone()).unwrap();
    for kind in EVERY_RULE.into_iter().skip(1) {
        let cfg = config(kind, 0.05, 0.01);
        let specs = [spec("w", &[8], DType::F64)];
        let mut straight = Optimizer::new(cfg, &specs).unwrap();
        let mut p_straight = to_tensor(&p0);
        for g in &grads {
            straight.begin_step();
            straight
                .update_whole(0, &mut p_straight, &to_tensor(g))
                .unwrap();
        }
        // Three steps, "checkpoint", a fresh optimizer loads the state, three more steps.
        let mut first = Optimizer::new(cfg, &specs).unwrap();
        let mut p = to_tensor(&p0);
        for g in &grads[..3] {
            first.begin_step();
            first.update_whole(0, &mut p, &to_tensor(g)).unwrap();
        }
        let saved: Vec<(&str, Tensor)> = first
            .state(0)
            .unwrap()
            .into_iter()
            .map(|(n, t)| (n, t.clone()))
            .collect();
        let mut resumed = Optimizer::new(cfg, &specs).unwrap();
        for (name, tensor) in &saved {
            // Saved in f32, loaded into an f64 optimizer: converted.
            resumed
                .load_state(0, name, &tensor.to_dtype(DType::F32))
                .unwrap();
            resumed.load_state(0, name, tensor).unwrap();
        }
        resumed.set_step_count(first.step_count());
        for g in &grads[3..] {
            resumed.begin_step();
            resumed.update_whole(0, &mut p, &to_tensor(g)).unwrap();
        }
        assert_eq!(p, p_straight, "{kind:?}");
        assert_eq!(resumed.step_count(), 6);
    }
}

#[test]
fn state_mut_writes_through() {
    let mut opt =
        Optimizer::new(config(MOMENTUM, 0.1, 0.0), &[spec("w", &[1], DType::F64)]).unwrap();
    for (name, tensor) in opt.state_mut(0).unwrap() {
        assert_eq!(name, "moments");
        tensor.as_slice_mut::<f64>().unwrap()[0] = 1.0;
    }
    let mut p = Tensor::from_vec(&[1], vec![0f64]).unwrap();
    opt.begin_step();
    opt.update(0, &mut p, &Tensor::from_vec(&[1], vec![0f64]).unwrap())
        .unwrap();
    // v = 0.9·1 + 0, p = -0.1·0.9.
    assert!((p.as_slice::<f64>().unwrap()[0] + 0.09).abs() < 1e-15);
}

fn mismatch_what(err: ExecError) -> String {
    match err {
        ExecError::Mismatch { what, .. } => what,
        other => panic!("expected a Mismatch, got {other}"),
    }
}

fn config_key(err: ExecError) -> String {
    match err {
        ExecError::Config { key, .. } => key,
        other => panic!("expected a Config error, got {other}"),
    }
}

#[test]
fn bad_hyperparameters_name_their_key() {
    let adam = |beta1, beta2, eps| OptimizerKind::Adam {
        beta1,
        beta2,
        eps,
        use_amsgrad: false,
        use_nesterov: false,
    };
    let lamb = |beta1, beta2, eps| OptimizerKind::Lamb { beta1, beta2, eps };
    let cases = [
        (config(OptimizerKind::Sgd, 0.0, 0.0), "train.learning_rate"),
        (
            config(OptimizerKind::Sgd, f64::NAN, 0.0),
            "train.learning_rate",
        ),
        (
            config(OptimizerKind::Sgd, f64::INFINITY, 0.0),
            "train.learning_rate",
        ),
        (config(OptimizerKind::Sgd, 0.1, -1.0), "train.weight_decay"),
        (
            config(
                OptimizerKind::Momentum {
                    momentum: -0.1,
                    use_nesterov: false,
                },
                0.1,
                0.0,
            ),
            "train.momentum",
        ),
        (config(adam(1.0, 0.999, 1e-8), 0.1, 0.0), "train.beta1"),
        (config(adam(0.9, 0.0, 1e-8), 0.1, 0.0), "train.beta2"),
        (config(adam(0.9, 0.999, 0.0), 0.1, 0.0), "train.eps"),
        (config(lamb(0.0, 0.999, 1e-6), 0.1, 0.0), "train.beta1"),
        (config(lamb(0.9, 0.999, -1e-6), 0.1, 0.0), "train.eps"),
        // MindSpore's AMSGrad kernel has no Nesterov step: the pair is refused, not half-run.
        (
            config(
                OptimizerKind::Adam {
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    use_amsgrad: true,
                    use_nesterov: true,
                },
                0.1,
                0.0,
            ),
            "train.use_nesterov",
        ),
        (
            config(
                OptimizerKind::AdamW {
                    beta1: 0.9,
                    beta2: 1.5,
                    eps: 1e-6,
                },
                0.1,
                0.0,
            ),
            "train.beta2",
        ),
    ];
    for (cfg, key) in cases {
        assert_eq!(config_key(cfg.validate().unwrap_err()), key, "{cfg:?}");
        assert_eq!(config_key(Optimizer::new(cfg, &[]).unwrap_err()), key);
    }
}

#[test]
fn misuse_is_an_error_naming_the_parameter() {
    let cfg = config(ADAM, 0.1, 0.0);
    let err = Optimizer::new(cfg, &[spec("embedding_ids", &[2], DType::I32)]).unwrap_err();
    assert!(mismatch_what(err).contains("embedding_ids"));

    let mut opt = Optimizer::new(cfg, &[spec("fc1_weight", &[2, 2], DType::F32)]).unwrap();
    let mut p = Tensor::zeros(DType::F32, &[2, 2]);
    let g = Tensor::zeros(DType::F32, &[2, 2]);
    // No begin_step: Adam's bias correction would divide by zero.
    assert!(mismatch_what(opt.update(0, &mut p, &g).unwrap_err()).contains("step count"));
    opt.begin_step();
    let wrong_shape = Tensor::zeros(DType::F32, &[4]);
    let what = mismatch_what(opt.update(0, &mut p, &wrong_shape).unwrap_err());
    assert!(
        what.contains("fc1_weight") && what.contains("gradient"),
        "{what}"
    );
    let wrong_dtype = Tensor::zeros(DType::F64, &[2, 2]);
    assert!(mismatch_what(opt.update(0, &mut p, &wrong_dtype).unwrap_err()).contains("gradient"));
    let mut wrong_param = Tensor::zeros(DType::F32, &[2, 3]);
    assert!(mismatch_what(opt.update(0, &mut wrong_param, &g).unwrap_err()).contains("parameter"));
    assert!(mismatch_what(opt.update(1, &mut p, &g).unwrap_err()).contains("index"));
    assert!(opt.state(1).is_err());

    let what = mismatch_what(opt.load_state(0, "moments", &g).unwrap_err());
    assert!(what.contains("moments.fc1_weight"), "{what}");
    let what = mismatch_what(opt.load_state(0, "moment1", &wrong_shape).unwrap_err());
    assert!(what.contains("moment1.fc1_weight"), "{what}");
    assert!(opt
        .load_state(0, "moment1", &Tensor::zeros(DType::I32, &[2, 2]))
        .is_err());
    // Nothing above changed the parameter.
    assert_eq!(p, Tensor::zeros(DType::F32, &[2, 2]));
}

const MINT_ADAMW: OptimizerKind = OptimizerKind::MintAdamW {
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
};

/// mint AdamW (PyTorch's AdamW) against its update written out by hand: step 1 and 2 of
/// p = 1, g = 0.5, lr 0.1, wd 0.01, β = (0.9, 0.999), ε = 1e-8; then five steps of varying
/// gradients against PyTorch's documented form `p -= lr·m̂/(√v̂ + ε)`, `m̂ = m/(1-β1ᵗ)`,
/// `v̂ = v/(1-β2ᵗ)`, after `p -= lr·wd·p`.
#[test]
fn mint_adamw_is_pytorch_s_bias_corrected_rule() {
    let got = scalar_run(config(MINT_ADAMW, 0.1, 0.01), &[0.5, 0.5]);
    // Step 1: p·(1 − 0.001); m = 0.05, v = 0.00025; m̂ = 0.5, √v̂ = 0.5.
    let step1 = 0.999 - 0.05 / (0.5 + 1e-8);
    // Step 2: m = 0.095, v = 0.00049975; 1-β1² = 0.19, 1-β2² = 0.001999, √v̂ = 0.5.
    let step2 = step1 * 0.999 - (0.1 / 0.19) * 0.095 / (0.5 + 1e-8);
    assert_close(&got, &[step1, step2], 1e-12);
    // MindSpore's AdamWeightDecay (no bias correction) moves ~3× further on step 1.
    let no_correction = 1.0 - scalar_run(config(ADAMW, 0.1, 0.0), &[0.5])[0];
    assert!(
        no_correction > 3.0 * (1.0 - step1) * 0.99,
        "{no_correction}"
    );

    let grads = [0.3, -1.2, 0.05, 2.0, -0.4];
    let (lr, wd, b1, b2, eps) = (0.01, 0.1, 0.9, 0.999, 1e-8);
    let (mut p, mut m, mut v) = (1.0f64, 0.0f64, 0.0f64);
    let mut want = Vec::new();
    for (k, g) in grads.iter().enumerate() {
        let t = k as i32 + 1;
        p -= lr * wd * p;
        m = b1 * m + (1.0 - b1) * g;
        v = b2 * v + (1.0 - b2) * g * g;
        let m_hat = m / (1.0 - b1.powi(t));
        let v_hat = v / (1.0 - b2.powi(t));
        p -= lr * m_hat / (v_hat.sqrt() + eps);
        want.push(p);
    }
    assert_close(
        &scalar_run(config(MINT_ADAMW, lr, wd), &grads),
        &want,
        1e-12,
    );
    assert_eq!(MINT_ADAMW.state_names(), ["exp_avg", "exp_avg_sq"]);
}

/// The step's learning rate ([`Optimizer::set_learning_rate`]) replaces the configured one in
/// every rule, and a bad one is refused.
#[test]
fn the_step_s_learning_rate_drives_every_rule() {
    for kind in EVERY_RULE {
        let run = |set: Option<f64>| {
            let mut opt =
                Optimizer::new(config(kind, 0.1, 0.0), &[spec("w", &[1], DType::F64)]).unwrap();
            if let Some(lr) = set {
                opt.set_learning_rate(lr).unwrap();
            }
            let mut p = Tensor::from_vec(&[1], vec![1f64]).unwrap();
            opt.begin_step();
            opt.update_whole(0, &mut p, &Tensor::from_vec(&[1], vec![0.5]).unwrap())
                .unwrap();
            1.0 - p.as_slice::<f64>().unwrap()[0]
        };
        let (base, half, zero) = (run(None), run(Some(0.05)), run(Some(0.0)));
        assert!(
            (half - base / 2.0).abs() < 1e-12,
            "{kind:?}: {half} vs {base}"
        );
        assert_eq!(zero, 0.0, "{kind:?}: a rate of 0 leaves the parameter");
    }
    let mut opt = Optimizer::new(config(ADAM, 0.1, 0.0), &[]).unwrap();
    for bad in [-0.1, f64::NAN, f64::INFINITY] {
        assert!(opt.set_learning_rate(bad).is_err(), "{bad}");
    }
}

/// `train.no_weight_decay`: a filtered parameter is updated exactly as with weight decay 0,
/// the others exactly as with the configured decay; MindSpore's `beta`/`gamma` stay excluded.
#[test]
fn the_weight_decay_filter_updates_excluded_parameters_without_decay() {
    let names = [
        "layers.0.dense.weight",
        "layers.0.dense.bias",
        "embedding.embedding_table",
        "layers.0.norm.gamma",
    ];
    let filter = exec::WeightDecayFilter {
        excluded: vec!["bias".to_string(), "embedding".to_string()],
    };
    for kind in [
        OptimizerKind::Sgd,
        ADAM,
        ADAM_AMSGRAD,
        ADAMW,
        MINT_ADAMW,
        LAMB,
    ] {
        let run = |wd: f64, filter: Option<&exec::WeightDecayFilter>| {
            let specs: Vec<ParamSpec> = names.iter().map(|n| spec(n, &[3], DType::F32)).collect();
            let mut opt = Optimizer::new(config(kind, 0.05, wd), &specs).unwrap();
            if let Some(f) = filter {
                opt.set_weight_decay_filter(f);
            }
            let mut params: Vec<Tensor> = (0..names.len())
                .map(|k| Tensor::from_vec(&[3], vec![1.0f32, -2.0, 0.5 + k as f32]).unwrap())
                .collect();
            let grad = Tensor::from_vec(&[3], vec![0.1f32, 0.2, -0.3]).unwrap();
            for _ in 0..3 {
                opt.begin_step();
                for (k, p) in params.iter_mut().enumerate() {
                    opt.update_whole(k, p, &grad).unwrap();
                }
            }
            let decays: Vec<bool> = (0..names.len()).map(|k| opt.decays(k).unwrap()).collect();
            (params, decays)
        };
        let (filtered, decays) = run(0.1, Some(&filter));
        let (no_decay, _) = run(0.0, None);
        let (decayed, default_decays) = run(0.1, None);
        assert_eq!(decays, [true, false, false, false], "{kind:?}");
        assert_eq!(default_decays, [true, true, true, false], "{kind:?}");
        assert_eq!(filtered[0], decayed[0], "{kind:?}: the weight decays");
        for k in 1..names.len() {
            assert_eq!(
                filtered[k], no_decay[k],
                "{kind:?}: {} without decay",
                names[k]
            );
        }
        assert_ne!(
            filtered[1], decayed[1],
            "{kind:?}: the filter changes the bias's update"
        );
    }
}

/// Every rule splits a large parameter's elements over the rank's threads: three steps on a
/// ragged 100,003-element f32 parameter give the one thread's bits on 2 and 3 threads.
#[test]
fn every_rule_is_bitwise_the_same_on_any_thread_count() {
    let n = 100_003;
    let start: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    for kind in EVERY_RULE {
        let run = |threads: usize| {
            let mut opt =
                Optimizer::new(config(kind, 0.01, 0.1), &[spec("w", &[n], DType::F32)]).unwrap();
            let mut p = Tensor::from_vec(&[n], start.clone()).unwrap();
            tensor::kernels::threads::set_threads(threads);
            for step in 0..3 {
                let g: Vec<f32> = (0..n)
                    .map(|i| ((i * 104_729 + step * 31) % 997) as f32 / 997.0 - 0.5)
                    .collect();
                opt.begin_step();
                opt.update_whole(0, &mut p, &Tensor::from_vec(&[n], g).unwrap())
                    .unwrap();
            }
            tensor::kernels::threads::set_threads(1);
            let bits = p.as_slice::<f32>().unwrap().iter().map(|v| v.to_bits());
            bits.collect::<Vec<_>>()
        };
        let one = run(1);
        assert!(run(2) == one && run(3) == one, "{}", kind.name());
    }
}

/// Adam's `use_nesterov` and `use_amsgrad` against MindSpore 2.10's `nn.Adam` on the CPU:
/// p = [0.5, -1.25, 2, 0], three gradients, lr 0.1, β = (0.9, 0.99), ε 1e-3, wd 0.01, in f32.
/// The numbers are MindSpore's, from
/// `w = Parameter(Tensor(p)); opt = nn.Adam([w], 0.1, 0.9, 0.99, 1e-3, weight_decay=0.01,
/// use_nesterov=…/use_amsgrad=…); for g in grads: opt((Tensor(g),))` (PyNative, CPU); with
/// both flags MindSpore gave the AMSGrad numbers (its AMSGrad kernel has no Nesterov step),
/// which is why the engine refuses the pair.
#[test]
fn adam_nesterov_and_amsgrad_match_mindspore_2_10() {
    let p0 = [0.5, -1.25, 2.0, 0.0];
    let grads = [
        vec![0.1, -0.2, 0.3, -0.4],
        vec![-0.5, 0.25, 0.05, 0.4],
        vec![0.3, 0.3, -0.6, 0.01],
    ];
    let mindspore: [(bool, bool, [f64; 4]); 2] = [
        (
            false,
            true,
            [
                0.422_903_507_947_921_75,
                -1.217_280_507_087_707_5,
                1.806_699_156_761_169_4,
                0.122_526_936_233_043_67,
            ],
        ),
        (
            true,
            false,
            [
                0.472_373_187_541_961_67,
                -1.213_126_063_346_862_8,
                1.848_589_420_318_603_5,
                0.086_982_689_797_878_27,
            ],
        ),
    ];
    for (use_amsgrad, use_nesterov, want) in mindspore {
        let kind = OptimizerKind::Adam {
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-3,
            use_amsgrad,
            use_nesterov,
        };
        let mut opt = Optimizer::new(
            OptimizerConfig {
                kind,
                learning_rate: 0.1,
                weight_decay: 0.01,
            },
            &[spec("w", &[4], DType::F32)],
        )
        .unwrap();
        let mut p = Tensor::from_vec(&[4], p0.to_vec())
            .unwrap()
            .to_dtype(DType::F32);
        for g in &grads {
            opt.begin_step();
            let g = Tensor::from_vec(&[4], g.clone())
                .unwrap()
                .to_dtype(DType::F32);
            opt.update(0, &mut p, &g).unwrap();
        }
        assert_close(&p.to_f64_vec(), &want, 2e-6);
        // And the f64 transcription of the formula agrees with both.
        let by_formula = reference(kind, 0.1, 0.01, &p0, &grads);
        assert_close(&by_formula, &want, 2e-6);
        // The flag changes the run beyond the tolerance (AMSGrad only where `v` shrinks: the
        // last element's third step).
        let plain = OptimizerKind::Adam {
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-3,
            use_amsgrad: false,
            use_nesterov: false,
        };
        let plain = reference(plain, 0.1, 0.01, &p0, &grads);
        let apart = plain.iter().zip(&want).any(|(a, b)| (a - b).abs() > 1e-5);
        assert!(apart, "{plain:?} vs {want:?}");
    }
}

/// Lamb on the pieces of a parameter, each piece's square sums added before `set_norms`, gives
/// the update of the whole parameter bit for bit: for row halves, column halves and quarters,
/// in f32 and f64, with and without weight decay; the state is sharded like the parameter.
#[test]
fn lamb_pieces_with_summed_norms_equal_the_whole_bitwise() {
    let shape = [4usize, 6];
    let layouts = [
        vec![
            SliceBox::new(vec![0, 0], vec![2, 6]),
            SliceBox::new(vec![2, 0], vec![2, 6]),
        ],
        vec![
            SliceBox::new(vec![0, 0], vec![4, 3]),
            SliceBox::new(vec![0, 3], vec![4, 3]),
        ],
        vec![
            SliceBox::new(vec![0, 0], vec![2, 3]),
            SliceBox::new(vec![0, 3], vec![2, 3]),
            SliceBox::new(vec![2, 0], vec![2, 3]),
            SliceBox::new(vec![2, 3], vec![2, 3]),
        ],
    ];
    for dtype in [DType::F32, DType::F64] {
        for wd in [0.0, 0.05] {
            let p0 = Tensor::from_vec(&shape, values(24, 7))
                .unwrap()
                .to_dtype(dtype);
            let grads: Vec<Tensor> = (0..5)
                .map(|s| {
                    Tensor::from_vec(&shape, values(24, s + 11))
                        .unwrap()
                        .to_dtype(dtype)
                })
                .collect();
            let cfg = config(LAMB, 0.01, wd);
            let mut whole = p0.clone();
            let mut opt = Optimizer::new(cfg, &[spec("w", &shape, dtype)]).unwrap();
            for g in &grads {
                opt.begin_step();
                opt.update_whole(0, &mut whole, g).unwrap();
            }
            assert_ne!(whole, p0);
            for boxes in &layouts {
                let specs: Vec<ParamSpec> =
                    boxes.iter().map(|b| spec("w", &b.shape, dtype)).collect();
                let mut sharded = Optimizer::new(cfg, &specs).unwrap();
                let mut shards: Vec<Tensor> =
                    boxes.iter().map(|b| p0.extract_box(b).unwrap()).collect();
                for g in &grads {
                    sharded.begin_step();
                    let (mut param, mut update) = (
                        exec::clip::SquareSum::default(),
                        exec::clip::SquareSum::default(),
                    );
                    // The pieces in reverse order: the exact sums do not depend on it.
                    for (i, b) in boxes.iter().enumerate().rev() {
                        let g = g.extract_box(b).unwrap();
                        let squares = sharded.prepare_piece(i, &shards[i], 0, &g, 0).unwrap();
                        param.merge(&squares.param);
                        update.merge(&squares.update);
                    }
                    for (i, b) in boxes.iter().enumerate() {
                        sharded
                            .set_norms(i, param.to_f64().sqrt(), update.to_f64().sqrt())
                            .unwrap();
                        let g = g.extract_box(b).unwrap();
                        sharded.update_piece(i, &mut shards[i], 0, &g, 0).unwrap();
                    }
                }
                let mut assembled = Tensor::zeros(dtype, &shape);
                for (b, shard) in boxes.iter().zip(&shards) {
                    assembled.insert_box(b, shard).unwrap();
                }
                assert_eq!(assembled, whole, "{dtype} wd {wd} over {boxes:?}");
                for (i, b) in boxes.iter().enumerate() {
                    for ((name, local), (_, global)) in sharded
                        .state(i)
                        .unwrap()
                        .into_iter()
                        .zip(opt.state(0).unwrap())
                    {
                        assert_eq!(local, &global.extract_box(b).unwrap(), "state {name}");
                    }
                }
                // A piece's own norms would give another update: the sums matter.
                let mut alone = Optimizer::new(cfg, &specs[..1]).unwrap();
                let mut piece = p0.extract_box(&boxes[0]).unwrap();
                for g in &grads {
                    alone.begin_step();
                    alone
                        .update_whole(0, &mut piece, &g.extract_box(&boxes[0]).unwrap())
                        .unwrap();
                }
                assert_ne!(piece, whole.extract_box(&boxes[0]).unwrap(), "{boxes:?}");
            }
        }
    }
}

/// Lamb by hand on one step of a 2-element parameter: the trust ratio is ‖p‖/‖ĝ‖ with ε
/// inside ĝ's square root and outside the update's, as MindSpore's `Lamb` kernel has it.
#[test]
fn lamb_follows_mindspore_s_kernel_by_hand() {
    let (lr, wd, b1, b2, eps) = (0.1, 0.01, 0.9, 0.999, 1e-6);
    let p = [3.0f64, -4.0];
    let g = [0.5f64, 0.25];
    let mut want = Vec::new();
    let (mut w2, mut u2) = (0.0, 0.0);
    let mut update = [0.0; 2];
    for i in 0..2 {
        // Step 1: m̂ = g, v̂ = g².
        let m_hat = (1.0 - b1) * g[i] / (1.0 - b1);
        let v_hat = (1.0 - b2) * g[i] * g[i] / (1.0 - b2);
        update[i] = m_hat / (v_hat.sqrt() + eps) + wd * p[i];
        let g_hat = m_hat / (v_hat + eps).sqrt() + wd * p[i];
        w2 += p[i] * p[i];
        u2 += g_hat * g_hat;
    }
    let ratio = (w2.sqrt() / u2.sqrt()).min(10.0);
    assert!(ratio > 3.0 && ratio < 4.0, "{ratio}: ‖p‖ = 5, ‖ĝ‖ ≈ √2");
    for i in 0..2 {
        want.push(p[i] - lr * ratio * update[i]);
    }
    let mut opt = Optimizer::new(config(LAMB, lr, wd), &[spec("w", &[2], DType::F64)]).unwrap();
    let mut t = Tensor::from_vec(&[2], p.to_vec()).unwrap();
    opt.begin_step();
    opt.update_whole(0, &mut t, &Tensor::from_vec(&[2], g.to_vec()).unwrap())
        .unwrap();
    assert_close(&t.to_f64_vec(), &want, 1e-15);

    // MindSpore's guards: 1 when either norm is 0, at most 10, a NaN gives 0.
    assert_eq!(exec::trust_ratio(0.0, 2.0), 1.0);
    assert_eq!(exec::trust_ratio(2.0, 0.0), 1.0);
    assert_eq!(exec::trust_ratio(100.0, 2.0), 10.0);
    assert_eq!(exec::trust_ratio(3.0, 2.0), 1.5);
    assert_eq!(exec::trust_ratio(f64::NAN, 2.0), 1.0);
    assert_eq!(exec::trust_ratio(2.0, f64::NAN), 1.0);
    assert_eq!(exec::trust_ratio(f64::INFINITY, f64::INFINITY), 0.0);
    // A zero parameter moves by the plain update (ratio 1).
    let mut opt = Optimizer::new(config(LAMB, lr, 0.0), &[spec("w", &[2], DType::F64)]).unwrap();
    let mut zero = Tensor::from_vec(&[2], vec![0.0f64, 0.0]).unwrap();
    opt.begin_step();
    opt.update_whole(0, &mut zero, &Tensor::from_vec(&[2], g.to_vec()).unwrap())
        .unwrap();
    assert_eq!(opt.trust_ratio(0).unwrap(), Some(1.0));
    let moved = zero.to_f64_vec();
    assert!(
        (moved[0] + lr * 1.0 / (1.0 + eps / 0.5)).abs() < 1e-12,
        "{moved:?}"
    );
}

/// Lamb's parts out of order are errors naming the parameter; the elementwise rules refuse
/// the norm parts.
#[test]
fn lamb_out_of_order_is_an_error_naming_the_parameter() {
    let specs = [spec("fc1_weight", &[2], DType::F32)];
    let mut opt = Optimizer::new(config(LAMB, 0.1, 0.0), &specs).unwrap();
    let mut p = Tensor::from_vec(&[2], vec![1.0f32, 2.0]).unwrap();
    let g = Tensor::from_vec(&[2], vec![0.5f32, -0.5]).unwrap();
    assert!(mismatch_what(opt.prepare_piece(0, &p, 0, &g, 0).unwrap_err()).contains("step"));
    opt.begin_step();
    let what = mismatch_what(opt.update(0, &mut p, &g).unwrap_err());
    assert!(what.contains("fc1_weight"), "{what}");
    assert!(opt.set_norms(0, 1.0, 1.0).is_err());
    opt.prepare_piece(0, &p, 0, &g, 0).unwrap();
    let what = mismatch_what(opt.prepare_piece(0, &p, 0, &g, 0).unwrap_err());
    assert!(what.contains("fc1_weight"), "{what}");
    assert_eq!(p.to_f64_vec(), [1.0, 2.0], "nothing moved yet");
    opt.set_norms(0, 1.0, 1.0).unwrap();
    opt.update(0, &mut p, &g).unwrap();
    // The update consumed the norms: a second one is refused.
    assert!(opt.update(0, &mut p, &g).is_err());

    // A whole update of the wrong shape is refused before the moments advance.
    opt.begin_step();
    let before: Vec<Tensor> = opt
        .state(0)
        .unwrap()
        .into_iter()
        .map(|(_, t)| t.clone())
        .collect();
    let mut wide = Tensor::zeros(DType::F32, &[3]);
    let wide_grad = Tensor::zeros(DType::F32, &[3]);
    let what = mismatch_what(opt.update_whole(0, &mut wide, &wide_grad).unwrap_err());
    assert!(what.contains("fc1_weight"), "{what}");
    let after: Vec<Tensor> = opt
        .state(0)
        .unwrap()
        .into_iter()
        .map(|(_, t)| t.clone())
        .collect();
    assert_eq!(before, after);
    opt.update_whole(0, &mut p, &g).unwrap();

    let mut adam = Optimizer::new(config(ADAM, 0.1, 0.0), &specs).unwrap();
    adam.begin_step();
    assert!(!adam.needs_norms());
    assert!(adam.prepare_piece(0, &p, 0, &g, 0).is_err());
    assert!(adam.set_norms(0, 1.0, 1.0).is_err());
}
