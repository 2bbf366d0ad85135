//! `tessera bench profile` records the cores and the local links, and `tessera plan` slows
//! compute by the ranks per core with such a profile.

use crate::util::{assert_ok, s, tessera, Scratch};

/// `tessera plan … --json` of the seed MLP (data parallel, no search) on `devices` ranks.
fn plan(profile: &str, devices: &str, out: &std::path::Path) -> serde_json::Value {
    let out_dir = format!("output.dir=\"{}\"", s(out));
    let run = tessera(&[
        "plan",
        "examples/seed_data_parallel.toml",
        "--devices",
        devices,
        "--profile",
        profile,
        "--json",
        "--set",
        &out_dir,
    ]);
    assert_ok(&run);
    serde_json::from_slice(&run.stdout).expect("plan --json prints JSON")
}

#[test]
fn a_cores_aware_profile_slows_compute_past_the_cores() {
    let tmp = Scratch::new("profile-cores");
    let file = tmp.0.join("cpu.toml");
    let bench = tessera(&[
        "bench",
        "profile",
        "--out",
        s(&file),
        "--cores",
        "3",
        "--link-ranks",
        "2,4",
    ]);
    assert_ok(&bench);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.lines().any(|l| l == "compute_slots = 3"), "{text}");
    let ranks: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("ranks = "))
        .collect();
    assert_eq!(ranks, vec!["2", "4"], "{text}");
    assert_eq!(text.matches("[[local_link]]").count(), 2, "{text}");
    // The same profile as if every rank had its own device.
    let flat = tmp.0.join("flat.toml");
    let stripped: String = text
        .split("\n[[local_link]]")
        .next()
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("compute_slots"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&flat, stripped).unwrap();
    let compute = |profile: &std::path::Path, devices: &str| {
        plan(s(profile), devices, &tmp.0.join("plan"))["compute_ms"]
            .as_f64()
            .unwrap()
    };
    // 8 ranks on 3 cores: 8/3 ranks per core; 2 ranks fit the cores.
    let ratio = compute(&file, "8") / compute(&flat, "8");
    assert!((ratio - 8.0 / 3.0).abs() < 1e-6, "{ratio}");
    assert_eq!(compute(&file, "2"), compute(&flat, "2"));
}
