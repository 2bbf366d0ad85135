//! Every rank of a multi-process job runs the same configuration.
//!
//! Each process of an `mpirun` job reads its own config file and `--set`s, so a per-node file
//! or an environment-dependent override can give one rank another learning rate. Nothing would
//! fail: the ranks would train different models and commit a checkpoint set whose replicas
//! disagree. [`check_same_config`] compares every rank's resolved configuration with rank 0's
//! before anything runs and refuses a difference, naming the setting and both values.
//!
//! The comparison covers every field of [`TrainConfig`] (read through its `Debug` form, so a
//! field added later is compared too), except what may rightly differ between ranks and does
//! not change the numbers: the config file's own path, the data's location (`data.dir`,
//! `data.path`: a copy per machine is common), the files each rank writes for itself
//! (`output.group_info_file`, `train.dump_local_norm_path`: a MindSpore script names them per
//! rank),
//! `train.threads_per_rank` (results are bitwise the same on any count) and the warnings.

use std::path::PathBuf;

use comm::Communicator;

use super::TrainConfig;
use crate::error::RuntimeError;

/// Rank 0's settings are at most this long (a bound on what a peer's length may allocate).
const MAX_SETTINGS_BYTES: u64 = 64 << 20;

/// Refuses to go on unless every rank of `comm` runs the configuration rank 0 runs.
///
/// Collective: every rank of `comm` must call it. A rank whose configuration differs fails
/// naming the first setting that differs, with its value and rank 0's; every other rank then
/// fails too, naming the ranks that differ, so the whole job stops here.
pub fn check_same_config(
    config: &TrainConfig,
    comm: &dyn Communicator,
) -> Result<(), RuntimeError> {
    let ours = settings_text(config);
    let theirs = rank0_text(&ours, comm)?;
    let difference = first_difference(&ours, &theirs);
    let mut differs = vec![0u8; comm.size()];
    comm.all_gather_bytes(&[u8::from(difference.is_some())], &mut differs)?;
    if let Some(d) = difference {
        return Err(RuntimeError::Config {
            key: d.key,
            reason: format!(
                "rank {} runs {} but rank 0 runs {}: every rank of a job must run the same configuration (only the data's location, each rank's own output files and train.threads_per_rank may differ)",
                comm.rank(),
                d.ours,
                d.theirs
            ),
        });
    }
    let others: Vec<usize> = (0..comm.size()).filter(|&r| differs[r] != 0).collect();
    if others.is_empty() {
        return Ok(());
    }
    Err(RuntimeError::Config {
        key: "(configuration)".to_string(),
        reason: format!(
            "rank(s) {others:?} run a configuration that differs from rank 0's (their errors name the setting); every rank of a job must run the same configuration"
        ),
    })
}

/// Rank 0's settings text, broadcast to every rank (length first, bounded before allocating).
fn rank0_text(ours: &str, comm: &dyn Communicator) -> Result<String, RuntimeError> {
    let mut len = (ours.len() as u64).to_le_bytes();
    comm.broadcast_bytes(&mut len, 0)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_SETTINGS_BYTES {
        return Err(RuntimeError::Config {
            key: "(configuration)".to_string(),
            reason: format!(
                "rank 0 announced {len} bytes of settings, above the {MAX_SETTINGS_BYTES}-byte bound"
            ),
        });
    }
    let mut text = if comm.rank() == 0 {
        ours.as_bytes().to_vec()
    } else {
        vec![0; len as usize]
    };
    comm.broadcast_bytes(&mut text, 0)?;
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// `config`'s settings as compared: its pretty `Debug` form with the settings that may differ
/// between ranks blanked.
fn settings_text(config: &TrainConfig) -> String {
    let mut c = config.clone();
    c.source = None;
    c.warnings.clear();
    c.data.dir = PathBuf::new();
    if let Some(text) = c.data.text.as_mut() {
        text.path = PathBuf::new();
    }
    c.train.threads_per_rank = 0;
    c.train.dump_local_norm = None;
    c.output.group_info_file = None;
    format!("{c:#?}")
}

/// The first setting where two settings texts differ.
#[derive(Debug, PartialEq)]
struct Difference {
    /// The setting, spelt as its config key where the two agree (`train.learning_rate`).
    key: String,
    /// Its value here.
    ours: String,
    /// Its value on rank 0.
    theirs: String,
}

/// One line of a pretty `Debug` form.
struct Line<'a> {
    /// Nesting depth (4 spaces a level).
    depth: usize,
    /// The field it names, if it is `name: value`.
    field: Option<&'a str>,
    /// What follows the field name (the whole line if it names none).
    value: &'a str,
}

fn parse_lines(text: &str) -> Vec<Line<'_>> {
    text.lines()
        .map(|line| {
            let body = line.trim_start_matches(' ');
            let depth = (line.len() - body.len()) / 4;
            let named = body.split_once(": ").filter(|(name, _)| {
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            match named {
                Some((name, value)) => Line {
                    depth,
                    field: Some(name),
                    value,
                },
                None => Line {
                    depth,
                    field: None,
                    value: body,
                },
            }
        })
        .collect()
}

/// The first difference between `ours` and `theirs` (settings texts), `None` when equal.
fn first_difference(ours: &str, theirs: &str) -> Option<Difference> {
    if ours == theirs {
        return None;
    }
    let a = parse_lines(ours);
    let b = parse_lines(theirs);
    let at = a
        .iter()
        .zip(&b)
        .position(|(x, y)| x.depth != y.depth || x.field != y.field || x.value != y.value)
        .unwrap_or(a.len().min(b.len()));
    // The innermost named line holding the difference (the lines before it are the same).
    let j = owner(&a, at).max(owner(&b, at));
    Some(Difference {
        key: j.map_or_else(|| "(configuration)".to_string(), |j| key_of(&a, j)),
        ours: j.map_or_else(String::new, |j| value_of(&a, j)),
        theirs: j.map_or_else(String::new, |j| value_of(&b, j)),
    })
}

/// The innermost named line at or enclosing line `at`.
fn owner(lines: &[Line<'_>], at: usize) -> Option<usize> {
    let line = lines.get(at)?;
    if line.field.is_some() {
        return Some(at);
    }
    let mut depth = line.depth;
    for j in (0..at).rev() {
        if lines[j].depth < depth {
            if lines[j].field.is_some() {
                return Some(j);
            }
            depth = lines[j].depth;
        }
    }
    None
}

/// The config key of named line `j`: the names of the fields enclosing it, spelt as the
/// sections a config file uses.
fn key_of(lines: &[Line<'_>], j: usize) -> String {
    let mut path = vec![lines[j].field.unwrap_or_default()];
    let mut depth = lines[j].depth;
    for line in lines[..j].iter().rev() {
        if line.depth < depth {
            depth = line.depth;
            if let Some(name) = line.field {
                path.push(name);
            }
        }
    }
    path.reverse();
    // Structs that hold a section's keys without being a section of their own.
    let section = match path.first().copied() {
        Some("optimizer" | "lr_schedule" | "weight_decay_filter") => "train",
        Some("gpt_parallel") => "parallel",
        Some(first) => first,
        None => "",
    };
    let rest = path
        .iter()
        .skip(1)
        .filter(|name| !matches!((section, **name), ("model", "gpt") | ("data", "text")));
    std::iter::once(section)
        .chain(rest.copied())
        .collect::<Vec<_>>()
        .join(".")
}

/// The value of named line `j`, its nested lines folded onto one line.
fn value_of(lines: &[Line<'_>], j: usize) -> String {
    let mut text = lines[j].value.to_string();
    for line in &lines[j + 1..] {
        if line.depth <= lines[j].depth {
            if line.depth == lines[j].depth && line.field.is_none() {
                text.push_str(line.value);
            }
            break;
        }
        if let Some(name) = line.field {
            text.push_str(name);
            text.push_str(": ");
        }
        text.push_str(line.value);
        text.push(' ');
    }
    let text = text
        .replace(", )", ")")
        .replace(", }", " }")
        .replace(", ]", "]");
    text.trim_end_matches(',')
        .replace("( ", "(")
        .replace(" )", ")")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use comm::LocalCluster;

    use super::*;

    fn config(sets: &[&str]) -> TrainConfig {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/gpt_kjv.toml"),
        )
        .unwrap();
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        TrainConfig::parse(&text, None, &sets, Path::new("/work")).unwrap()
    }

    #[test]
    fn a_difference_is_named_by_its_key_with_both_values() {
        let a = settings_text(&config(&["train.learning_rate=0.5"]));
        let b = settings_text(&config(&["train.learning_rate=0.05"]));
        let d = first_difference(&a, &b).expect("they differ");
        assert_eq!(d.key, "train.learning_rate");
        assert_eq!((d.ours.as_str(), d.theirs.as_str()), ("0.5", "0.05"));
        let a = settings_text(&config(&["train.max_steps=5"]));
        let b = settings_text(&config(&[]));
        let d = first_difference(&a, &b).expect("they differ");
        assert_eq!(d.key, "train.max_steps");
        assert_eq!(d.ours, "Some(5)");
        let a = settings_text(&config(&["model.layers=3"]));
        let b = settings_text(&config(&["model.layers=2"]));
        assert_eq!(first_difference(&a, &b).unwrap().key, "model.layers");
        assert_eq!(first_difference(&a, &a), None);
    }

    #[test]
    fn the_data_location_each_ranks_own_files_and_threads_may_differ() {
        let a = settings_text(&config(&[
            "data.dir=\"/a\"",
            "train.threads_per_rank=2",
            "output.group_info_file=\"/tmp/group_1.ckpt\"",
            "train.dump_local_norm=true",
            "train.dump_local_norm_path=\"/tmp/norms_1\"",
        ]));
        let b = settings_text(&config(&[
            "data.dir=\"/b\"",
            "output.group_info_file=\"/tmp/group_0.ckpt\"",
            "train.dump_local_norm=true",
            "train.dump_local_norm_path=\"/tmp/norms_0\"",
        ]));
        assert_eq!(first_difference(&a, &b), None);
        let a = settings_text(&config(&["output.dir=\"/a\""]));
        let b = settings_text(&config(&["output.dir=\"/b\""]));
        assert_eq!(first_difference(&a, &b).unwrap().key, "output.dir");
    }

    #[test]
    fn every_rank_refuses_a_rank_with_another_configuration() {
        let configs = [
            config(&[]),
            config(&[]),
            config(&["train.learning_rate=0.5"]),
        ];
        let results = LocalCluster::new(3)
            .unwrap()
            .run(|comm| check_same_config(&configs[comm.rank()], &comm).map_err(|e| e.to_string()));
        let errors: Vec<String> = results
            .into_iter()
            .map(|r| r.unwrap().expect_err("every rank stops"))
            .collect();
        assert!(errors[2].contains("train.learning_rate"), "{}", errors[2]);
        assert!(errors[2].contains("rank 2 runs 0.5"), "{}", errors[2]);
        assert!(errors[0].contains("rank(s) [2]"), "{}", errors[0]);
        let same = [config(&[]), config(&[])];
        for r in LocalCluster::new(2)
            .unwrap()
            .run(|comm| check_same_config(&same[comm.rank()], &comm).map_err(|e| e.to_string()))
        {
            r.unwrap().unwrap();
        }
    }
}
