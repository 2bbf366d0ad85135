//! `tessera launch`'s collective-job flags refused before anything starts (any build), and a
//! build without the MPI backend saying how to get one. The jobs themselves run in
//! `mpi_launch.rs` (built with `--features mpi`).

use std::process::Output;

use crate::util::{tessera_command, Scratch};

fn launch(dir: &Scratch, args: &[&str]) -> Output {
    tessera_command()
        .arg("launch")
        .args(["--log-dir", crate::util::s(&dir.0.join("logs"))])
        .args(args)
        .args(["--", "true"])
        .output()
        .unwrap()
}

fn refused_with(dir: &Scratch, args: &[&str], message: &str) {
    let out = launch(dir, args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} was accepted");
    assert!(err.contains(message), "{args:?}: {err}");
    assert!(
        !dir.0.join("logs").exists(),
        "{args:?} created the log directory"
    );
}

#[test]
fn collective_flags_are_checked_before_anything_starts() {
    let dir = Scratch::new("launch-flags");
    let cases: [(&[&str], &str); 8] = [
        (
            &["--nproc", "0"],
            "--nproc (--worker_num) must be between 1 and 1024, got 0",
        ),
        (
            &["--worker_num", "4", "--local_worker_num", "3"],
            "--local_worker_num must divide --worker_num 4",
        ),
        (
            &[
                "--worker_num",
                "4",
                "--local_worker_num",
                "2",
                "--node_rank",
                "2",
            ],
            "--node_rank 2 must be below the job's 2 node(s)",
        ),
        (
            &[
                "--worker_num",
                "4",
                "--local_worker_num",
                "2",
                "--hostfile",
                "h",
            ],
            "--hostfile names the hosts of one mpirun",
        ),
        (
            &["--nproc", "2", "--join", "false"],
            "--join false is not supported",
        ),
        (
            &["--nproc", "2", "--cluster_time_out", "0"],
            "--cluster_time_out must be between 1 and 86400 seconds, got 0",
        ),
        (
            &["--nproc", "2", "--independent", "--node_rank", "0"],
            "cannot be combined with --ps-servers or --independent",
        ),
        (
            &["--nproc", "2", "--scheduler-addr", "h:1"],
            "--scheduler-addr needs --ps-servers",
        ),
    ];
    for (args, message) in cases {
        refused_with(&dir, args, message);
    }
    // A host file mpirun could not read is refused before mpirun starts, naming its line.
    let hosts = dir.0.join("hosts");
    std::fs::write(&hosts, "node-1 slots=2\nnode-2 slots two\n").unwrap();
    let hosts = crate::util::s(&hosts);
    refused_with(
        &dir,
        &["--nproc", "2", "--hostfile", hosts],
        "line 2: \"slots\" after host node-2 is not a KEY=NUMBER setting",
    );
    // msrun's `--join` (true) is accepted: it is what the launcher always does.
    let out = launch(&dir, &["--nproc", "1", "--join", "--independent"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Without the MPI backend, one collective job cannot run: the launcher says so and how to
/// build one, before it creates anything.
#[cfg(not(feature = "mpi"))]
#[test]
fn a_build_without_mpi_says_how_to_get_it() {
    let dir = Scratch::new("launch-no-mpi");
    refused_with(
        &dir,
        &["--nproc", "2"],
        "this tessera was built without the MPI backend, which one collective job across processes needs: build it with `cargo build --release -p tessera-cli --features mpi`",
    );
}

/// `train.elastic` keeps its snapshots in the store `tessera launch` gives each node: a run
/// without one is refused naming the key and the variable; a malformed `TESSERA_FAULT` is
/// refused naming it.
#[test]
fn elastic_training_needs_the_launchers_store() {
    let dir = Scratch::new("elastic-no-store");
    let train = |env: &[(&str, &str)]| {
        let mut c = tessera_command();
        c.args([
            "train",
            "examples/seed_stand_alone.toml",
            "--set",
            "train.elastic=true",
        ])
        .args([
            "--set",
            &format!("output.dir=\"{}\"", crate::util::s(&dir.0)),
        ])
        .current_dir(crate::util::repo_root())
        .env_remove("TESSERA_ELASTIC_DIR");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let out = train(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("train.elastic") && err.contains("TESSERA_ELASTIC_DIR is not set"),
        "{err}"
    );
    let store = dir.0.join("store");
    std::fs::create_dir_all(&store).unwrap();
    let out = train(&[
        ("TESSERA_ELASTIC_DIR", crate::util::s(&store)),
        ("TESSERA_FAULT", "rank=0,step=1,at=sometime"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("TESSERA_FAULT") && err.contains("unknown point"),
        "{err}"
    );
}
