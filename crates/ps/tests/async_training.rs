//! Async updates with bounded staleness train the seed MLP to the seed run's accuracy.

use crate::util::{ps_config, run_in_process};

#[test]
fn async_ps_reaches_ninety_percent() {
    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(
        dir.path(),
        "servers = 2\nworkers = 2\nsync = false\nstaleness = 2",
        "epochs = 8\neval = true\nper_print_times = 0",
    );
    let report = run_in_process(&config, 2, 2);
    let accuracy = *report.accuracies.last().expect("an accuracy");
    assert!(accuracy >= 0.90, "async accuracy {accuracy}");
    // 8 epochs of 46 steps: worker 0 took every step.
    assert_eq!(report.steps_run, 8 * 46);
    assert_eq!(report.accuracies.len(), 8);
}
