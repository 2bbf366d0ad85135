//! Sampling text from a trained GPT: `tessera generate RUN_DIR --prompt ... --tokens N`.
//!
//! A GPT run saves `model.json` (the model's shape and tokenizer) beside its checkpoints. The
//! checkpoint may have been saved under any strategy: every parameter is loaded whole (one
//! device, replicated), merged on the fly from the ranks' files by the checkpoint planner.
//! Sampling runs the forward graph on one device, one new token per pass over the last
//! `seq_len` tokens.

use std::path::{Path, PathBuf};

use graph::exec::Executor;
use graph::rng::{bits_at, stream_key};
use layout::{Mesh, TensorLayout};
use models::{GptConfig, MoeConfig};
use serde_json::{json, Value};
use tensor::{DType, Tensor};

use crate::data::Tokenizer;
use crate::error::RuntimeError;
use crate::host_memory::{host_memory, HostMemory};

/// The model description a GPT run saves in its output directory.
pub const MODEL_FILE: &str = "model.json";

/// How generated ids become text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vocabulary {
    /// Text tokenised by byte or character.
    Text(Tokenizer),
    /// Token ids of a token file, printed as numbers.
    Ids,
}

/// What [`MODEL_FILE`] holds: the GPT's shape (batch 1) and its vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedModel {
    /// The model's shape.
    pub gpt: GptConfig,
    /// Its tokens.
    pub vocabulary: Vocabulary,
}

impl SavedModel {
    /// The JSON of [`MODEL_FILE`].
    pub fn to_json(&self) -> Value {
        let g = &self.gpt;
        let (tokenizer, alphabet) = match &self.vocabulary {
            Vocabulary::Text(Tokenizer::Byte) => ("byte", None),
            Vocabulary::Text(Tokenizer::Char { alphabet }) => {
                ("char", Some(alphabet.iter().collect::<String>()))
            }
            Vocabulary::Ids => ("ids", None),
        };
        json!({
            "model": "gpt",
            "vocab_size": g.vocab_size,
            "layers": g.layers,
            "heads": g.heads,
            "hidden": g.hidden,
            "seq_len": g.seq_len,
            "ffn_hidden": g.ffn_hidden,
            "tie_embeddings": g.tie_embeddings,
            "moe": g.moe.as_ref().map(moe_to_json),
            "tokenizer": tokenizer,
            "alphabet": alphabet,
        })
    }

    /// Reads `dir/model.json`.
    pub fn read(dir: &Path) -> Result<SavedModel, RuntimeError> {
        let path = dir.join(MODEL_FILE);
        let text = layout::limits::read_text_bounded(&path, layout::limits::MAX_TEXT_FILE_BYTES)
            .map_err(|e| RuntimeError::Data {
                path: path.clone(),
                reason: format!(
                "cannot read the model description ({e}); is {} the output directory of a GPT run?",
                dir.display()
            ),
            })?;
        let bad = |reason: String| RuntimeError::Data {
            path: path.clone(),
            reason,
        };
        let json: Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON ({e})")))?;
        if json["model"] != "gpt" {
            return Err(bad(format!("\"model\" is {}, not \"gpt\"", json["model"])));
        }
        let size = |key: &str| -> Result<usize, RuntimeError> {
            json[key]
                .as_u64()
                .filter(|n| (1..=1 << 24).contains(n))
                .map(|n| n as usize)
                .ok_or_else(|| bad(format!("\"{key}\" must be an integer from 1 to 2^24")))
        };
        let vocabulary = match json["tokenizer"].as_str() {
            Some("byte") => Vocabulary::Text(Tokenizer::Byte),
            Some("char") => {
                let alphabet = json["alphabet"]
                    .as_str()
                    .ok_or_else(|| bad("a char tokenizer needs its \"alphabet\"".to_string()))?;
                Vocabulary::Text(Tokenizer::Char {
                    alphabet: alphabet.chars().collect(),
                })
            }
            Some("ids") => Vocabulary::Ids,
            other => return Err(bad(format!("unknown \"tokenizer\" {other:?}"))),
        };
        let gpt = GptConfig {
            vocab_size: size("vocab_size")?,
            layers: size("layers")?,
            heads: size("heads")?,
            hidden: size("hidden")?,
            seq_len: size("seq_len")?,
            ffn_hidden: size("ffn_hidden")?,
            dropout: 0.0,
            tie_embeddings: match &json["tie_embeddings"] {
                Value::Null => true,
                value => value
                    .as_bool()
                    .ok_or_else(|| bad(format!("\"tie_embeddings\" is {value}, not a boolean")))?,
            },
            fused_attention: true,
            packed_attention: true,
            batch: 1,
            vocab_parallel_loss: false,
            moe: moe_from_json(&json["moe"]).map_err(bad)?,
        };
        gpt.validate().map_err(|e| bad(e.to_string()))?;
        check_vocabulary(&vocabulary, gpt.vocab_size).map_err(bad)?;
        Ok(SavedModel { gpt, vocabulary })
    }
}

/// The tokenizer of `model.json` agrees with its `"vocab_size"`: 256 for bytes; for characters
/// one per character of `"alphabet"`, which must be in strictly increasing code-point order (as
/// a run writes it: encoding looks characters up by binary search, so an unsorted or repeated
/// alphabet would silently map text to the wrong ids).
fn check_vocabulary(vocabulary: &Vocabulary, vocab_size: usize) -> Result<(), String> {
    match vocabulary {
        Vocabulary::Text(Tokenizer::Byte) if vocab_size != 256 => Err(format!(
            "\"vocab_size\" is {vocab_size}, but the byte tokenizer has a vocabulary of 256"
        )),
        Vocabulary::Text(Tokenizer::Char { alphabet }) => {
            if let Some(pair) = alphabet.windows(2).find(|pair| pair[0] >= pair[1]) {
                return Err(format!(
                    "the \"alphabet\" is not in strictly increasing code-point order ({:?} before {:?}): it is the sorted distinct characters of the training text",
                    pair[0], pair[1]
                ));
            }
            if alphabet.len() != vocab_size {
                return Err(format!(
                    "the \"alphabet\" holds {} characters, but \"vocab_size\" is {vocab_size}: one token per character",
                    alphabet.len()
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// At least the memory sampling from `gpt` takes, in bytes: its parameters twice (the
/// executor's and the checkpoint's, read whole before they are copied in) and a forward pass's
/// activations of batch 1 (a few of the largest per layer), 4 bytes per element.
fn generate_memory(gpt: &GptConfig) -> u128 {
    let activations = gpt.largest_activation() * (2 * gpt.layers as u128 + 4);
    (gpt.parameter_count() * 2 + activations) * 4
}

/// Sampling from `gpt` (described by `path`) fits `memory`, or the error names the model's
/// sizes and both figures.
fn check_generate_memory(
    gpt: &GptConfig,
    path: &Path,
    memory: Option<HostMemory>,
) -> Result<(), RuntimeError> {
    let need = generate_memory(gpt);
    match memory {
        Some(memory) if need > u128::from(memory.available) => Err(RuntimeError::Data {
            path: path.to_path_buf(),
            reason: format!(
                "sampling from this model needs at least {need} bytes ({} parameters, held twice while the checkpoint loads, plus the activations of vocabulary {}, hidden {}, seq_len {}, layers {}), but {} bytes are available ({})",
                gpt.parameter_count(),
                gpt.vocab_size,
                gpt.hidden,
                gpt.seq_len,
                gpt.layers,
                memory.available,
                memory.source
            ),
        }),
        _ => Ok(()),
    }
}

/// `[model.moe]` as `model.json` records it.
fn moe_to_json(moe: &MoeConfig) -> Value {
    json!({
        "experts": moe.experts,
        "top_k": moe.top_k,
        "capacity_factor": moe.capacity_factor,
        "aux_loss_coeff": moe.aux_loss_coeff,
        "shared_expert": moe.shared_expert,
        "every": moe.every,
    })
}

/// `model.json`'s `"moe"` (`null` or absent: dense MLPs); a missing or mistyped key is an error
/// naming it (the ranges are checked by `GptConfig::validate`).
fn moe_from_json(value: &Value) -> Result<Option<MoeConfig>, String> {
    if value.is_null() {
        return Ok(None);
    }
    let count = |key: &str| {
        value[key]
            .as_u64()
            .map(|n| n.min(1 << 24) as usize)
            .ok_or_else(|| format!("\"moe.{key}\" must be a non-negative integer"))
    };
    let number = |key: &str| {
        value[key]
            .as_f64()
            .ok_or_else(|| format!("\"moe.{key}\" must be a number"))
    };
    Ok(Some(MoeConfig {
        experts: count("experts")?,
        top_k: count("top_k")?,
        capacity_factor: number("capacity_factor")?,
        aux_loss_coeff: number("aux_loss_coeff")?,
        shared_expert: value["shared_expert"]
            .as_bool()
            .ok_or_else(|| "\"moe.shared_expert\" must be a boolean".to_string())?,
        every: count("every")?,
    }))
}

/// What to sample.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// The text the sample continues.
    pub prompt: String,
    /// New tokens to sample.
    pub tokens: usize,
    /// Softmax temperature; 0 takes the most likely token every time.
    pub temperature: f64,
    /// Seed of the sampling.
    pub seed: u64,
}

/// The prompt followed by `options.tokens` sampled tokens, decoded.
pub fn generate(run_dir: &Path, options: &GenerateOptions) -> Result<String, RuntimeError> {
    if !(options.temperature >= 0.0 && options.temperature.is_finite()) {
        return Err(RuntimeError::Config {
            key: "--temperature".to_string(),
            reason: format!("{} must be a finite number ≥ 0", options.temperature),
        });
    }
    let saved = SavedModel::read(run_dir)?;
    let gpt = &saved.gpt;
    let mut ids: Vec<u32> = match &saved.vocabulary {
        Vocabulary::Text(t) => {
            t.encode(&options.prompt)
                .map_err(|reason| RuntimeError::Config {
                    key: "--prompt".to_string(),
                    reason,
                })?
        }
        Vocabulary::Ids => parse_ids(&options.prompt, gpt.vocab_size)?,
    };
    if ids.is_empty() {
        return Err(RuntimeError::Config {
            key: "--prompt".to_string(),
            reason: "the prompt is empty: give at least one token to continue".to_string(),
        });
    }
    check_generate_memory(gpt, &run_dir.join(MODEL_FILE), host_memory())?;
    let model = models::gpt(gpt, DType::F32).map_err(|e| RuntimeError::Config {
        key: MODEL_FILE.to_string(),
        reason: e.to_string(),
    })?;
    let mut exec = Executor::with_outputs(&model.graph, &[model.logits])?;
    exec.init_parameters(0)?;
    load_whole_parameters(&mut exec, &model.graph, run_dir)?;
    let key = stream_key(options.seed, "generate");
    let prompt_len = ids.len();
    for n in 0..options.tokens {
        let window = &ids[ids.len().saturating_sub(gpt.seq_len)..];
        // Positions after the window are padding: the causal mask keeps them from the last
        // real position's logits.
        let mut input = vec![0i32; gpt.seq_len];
        for (slot, &id) in input.iter_mut().zip(window) {
            *slot = id as i32;
        }
        exec.set_input(model.input, &Tensor::from_vec(&[1, gpt.seq_len], input)?)?;
        let labels = Tensor::from_vec(&[1, gpt.seq_len], vec![0i32; gpt.seq_len])?;
        exec.set_input(model.labels, &labels)?;
        exec.run()?;
        let logits = exec.value(model.logits)?.to_f64_vec();
        let row = &logits[(window.len() - 1) * gpt.vocab_size..window.len() * gpt.vocab_size];
        if let Some(at) = row.iter().position(|v| !v.is_finite()) {
            return Err(RuntimeError::Data {
                path: run_dir.to_path_buf(),
                reason: format!(
                    "the logit of token {at} at generated token {n} is not finite: the \
                     checkpoint's weights overflow on this input, and no token can be drawn"
                ),
            });
        }
        ids.push(sample(row, options.temperature, bits_at(key, n as u64)));
    }
    Ok(match &saved.vocabulary {
        Vocabulary::Text(t) => t.decode(&ids),
        Vocabulary::Ids => ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                if i == prompt_len {
                    format!("| {id}")
                } else {
                    id.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
    })
}

/// Space-separated ids below `vocab_size`.
fn parse_ids(prompt: &str, vocab_size: usize) -> Result<Vec<u32>, RuntimeError> {
    prompt
        .split_whitespace()
        .map(|word| {
            word.parse::<u32>()
                .ok()
                .filter(|&id| (id as usize) < vocab_size)
                .ok_or_else(|| RuntimeError::Config {
                    key: "--prompt".to_string(),
                    reason: format!(
                        "{word:?} is not a token id below the vocabulary of {vocab_size} (a token-file model takes space-separated ids)"
                    ),
                })
        })
        .collect()
}

/// Draws a token from `logits` at `temperature` with 64 random `bits` (the arg max at 0).
fn sample(logits: &[f64], temperature: f64, bits: u64) -> u32 {
    let best = logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i);
    if temperature == 0.0 {
        return best as u32;
    }
    let top = logits[best];
    let weights: Vec<f64> = logits
        .iter()
        .map(|&l| ((l - top) / temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut target = (bits >> 11) as f64 / (1u64 << 53) as f64 * total;
    for (i, w) in weights.iter().enumerate() {
        if target < *w {
            return i as u32;
        }
        target -= w;
    }
    best as u32
}

/// Loads every parameter of `graph` whole from the checkpoint set in `run_dir` (any strategy).
fn load_whole_parameters(
    exec: &mut Executor,
    graph: &graph::Graph,
    run_dir: &Path,
) -> Result<(), RuntimeError> {
    let one = Mesh::line("one", 1).map_err(|e| RuntimeError::Mismatch {
        what: "the one-device mesh".to_string(),
        expected: "a valid mesh".to_string(),
        got: e.to_string(),
    })?;
    let params: Vec<(graph::ValueId, String, TensorLayout)> = graph
        .values()
        .iter()
        .enumerate()
        .filter(|(_, v)| matches!(v.kind, graph::ValueKind::Parameter { .. }))
        .map(|(i, v)| {
            let layout = TensorLayout::replicated(one.clone(), &v.shape);
            (graph::ValueId(i), v.name.clone(), layout)
        })
        .collect();
    let targets: Vec<(&str, &TensorLayout)> =
        params.iter().map(|(_, n, l)| (n.as_str(), l)).collect();
    let strategy: PathBuf = run_dir.join("strategy.json");
    let loaded = ckpt::load_rank_tensors(run_dir, &strategy, 0, &targets)?;
    for (name, tensor) in loaded {
        if let Some((id, _, _)) = params.iter().find(|(_, n, _)| *n == name) {
            let slot = exec.value_mut(*id)?;
            let want = slot.dtype();
            *slot = tensor.to_dtype(want);
            // A diverged run's checkpoint holds NaN or infinite weights: its logits are NaN,
            // and sampling from them printed text as if nothing were wrong.
            if !exec::all_finite(slot) {
                return Err(RuntimeError::Data {
                    path: run_dir.to_path_buf(),
                    reason: format!(
                        "the checkpoint's tensor {name} holds a non-finite value: the run it \
                         comes from diverged, and no text can be sampled from it"
                    ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_json_keeps_the_moe_blocks() {
        let dir = tempfile::tempdir().unwrap();
        for moe in [
            None,
            Some(MoeConfig {
                shared_expert: true,
                every: 2,
                ..MoeConfig::new(4, 2)
            }),
        ] {
            let gpt = GptConfig {
                moe,
                ..GptConfig::new(256, 2, 4, 16, 8, 1)
            };
            let saved = SavedModel {
                gpt: gpt.clone(),
                vocabulary: Vocabulary::Text(Tokenizer::Byte),
            };
            std::fs::write(dir.path().join(MODEL_FILE), saved.to_json().to_string()).unwrap();
            assert_eq!(SavedModel::read(dir.path()).unwrap().gpt, gpt);
        }
        let text = r#"{"model": "gpt", "vocab_size": 256, "layers": 2, "heads": 4, "hidden": 16,
            "seq_len": 8, "ffn_hidden": 64, "tokenizer": "byte", "moe": {"experts": 4}}"#;
        std::fs::write(dir.path().join(MODEL_FILE), text).unwrap();
        let err = SavedModel::read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("moe.top_k"), "{err}");
    }

    fn write_model(dir: &Path, edit: impl FnOnce(&mut Value)) {
        let saved = SavedModel {
            gpt: GptConfig::new(3, 1, 2, 16, 8, 1),
            vocabulary: Vocabulary::Text(Tokenizer::Char {
                alphabet: vec!['a', 'b', 'c'],
            }),
        };
        let mut json = saved.to_json();
        edit(&mut json);
        std::fs::write(dir.join(MODEL_FILE), json.to_string()).unwrap();
    }

    /// An alphabet out of order, repeated or of the wrong length, and a byte tokenizer whose
    /// vocabulary is not 256, used to encode prompts to wrong ids (binary search on an unsorted
    /// alphabet) or decode samples to U+FFFD without a word; a mistyped `tie_embeddings` was
    /// read as `true`.
    #[test]
    fn model_json_vocabulary_must_agree_with_its_tokenizer() {
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), |_| {});
        assert!(SavedModel::read(dir.path()).is_ok());
        let cases: [(&str, Value, &str); 5] = [
            ("alphabet", json!("bac"), "strictly increasing"),
            ("alphabet", json!("abb"), "strictly increasing"),
            ("alphabet", json!("ab"), "holds 2 characters"),
            ("tokenizer", json!("byte"), "vocabulary of 256"),
            ("tie_embeddings", json!("yes"), "not a boolean"),
        ];
        for (key, value, want) in cases {
            write_model(dir.path(), |json| json[key] = value.clone());
            let err = SavedModel::read(dir.path()).unwrap_err().to_string();
            assert!(
                err.contains(want) && err.contains(MODEL_FILE),
                "{key} = {value}: {err}"
            );
        }
    }

    /// A `model.json` within every per-size bound can still describe a model far larger than
    /// the memory (vocabulary 2^24 × hidden 64: 4 GiB of parameters); sampling from it aborted
    /// on allocation. It is refused before the model is built, naming the file and both figures.
    #[test]
    fn a_model_larger_than_the_memory_is_refused_before_it_is_built() {
        let huge = GptConfig {
            batch: 1,
            ..GptConfig::new(1 << 24, 1, 2, 64, 8, 1)
        };
        huge.validate().unwrap();
        let memory = HostMemory {
            available: 3 << 30,
            source: "the address-space limit (ulimit -v)",
        };
        let path = Path::new("run/model.json");
        let err = check_generate_memory(&huge, path, Some(memory))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("run/model.json")
                && err.contains(&format!("{} bytes are available", 3u64 << 30)),
            "{err}"
        );
        let small = GptConfig {
            batch: 1,
            ..GptConfig::new(256, 2, 4, 16, 8, 1)
        };
        assert!(check_generate_memory(&small, path, Some(memory)).is_ok());
        assert!(generate_memory(&huge) > u128::from(memory.available));
    }
}
