//! The roles as they run in Kubernetes pods (`deploy/k8s`): the scheduler and the servers bind
//! every interface (`TESSERA_HOST=0.0.0.0`), the servers a fixed port (`TESSERA_SERVER_PORT`),
//! and each server gives the scheduler a name to be reached by (`TESSERA_ADVERTISE_HOST`), not
//! the address it bound.

use ps::{PsRole, RoleEnv};

use crate::util::{ps_config, run_in_process_with};

#[test]
fn roles_bound_to_every_interface_train_through_advertised_names() {
    let dir = tempfile::tempdir().unwrap();
    let config = ps_config(dir.path(), "servers = 2\nworkers = 2", "epochs = 1");
    let port = || ps::launch::free_local_port().expect("a free port");
    // The scheduler is reached by name; it binds 0.0.0.0 at that name's port.
    let addr = format!("localhost:{}", port());
    let server_ports = [port(), port()];
    let report = run_in_process_with(&config, (2, 2), &addr, |env: &mut RoleEnv| match env.role {
        PsRole::Scheduler => env.host = Some("0.0.0.0".to_string()),
        PsRole::Server => {
            env.host = Some("0.0.0.0".to_string());
            env.server_port = server_ports[env.server_id];
            env.advertise_host = Some("localhost".to_string());
        }
        PsRole::Worker => {}
    });
    assert_eq!(report.steps_run, 46, "one epoch of 46 steps");
    assert!(report.losses.iter().all(|l| l.is_finite()));
}

#[test]
fn pod_network_settings_are_read_and_checked() {
    let vars = |extra: &[(&'static str, &'static str)]| {
        let mut v = vec![
            ("TESSERA_ROLE", "server"),
            ("TESSERA_SERVER_ID", "0"),
            (
                "TESSERA_SCHEDULER_ADDR",
                "tessera-scheduler-0.tessera-scheduler:50051",
            ),
            ("TESSERA_JOB_SECRET", "a-job-secret-of-enough-length"),
        ];
        v.extend_from_slice(extra);
        RoleEnv::from_lookup(move |name| {
            v.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, x)| x.to_string())
        })
    };
    let env = vars(&[
        ("TESSERA_HOST", "0.0.0.0"),
        ("TESSERA_SERVER_PORT", "50052"),
        ("TESSERA_ADVERTISE_HOST", "tessera-server-0.tessera-server"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(env.host.as_deref(), Some("0.0.0.0"));
    assert_eq!(env.server_port, 50052);
    assert_eq!(
        env.advertise_host.as_deref(),
        Some("tessera-server-0.tessera-server")
    );
    let unset = vars(&[]).unwrap().unwrap();
    assert_eq!(
        (unset.host, unset.server_port, unset.advertise_host),
        (None, 0, None)
    );
    for bad in ["70000", "x"] {
        let err = vars(&[("TESSERA_SERVER_PORT", bad)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("TESSERA_SERVER_PORT") && err.contains(bad),
            "{err}"
        );
    }
}
