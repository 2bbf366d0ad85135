//! `tessera-ps-role CONFIG [SECTION.KEY=VALUE …]`: runs the parameter-server role of
//! `TESSERA_ROLE` for CONFIG, exactly as `tessera train CONFIG` does under a launcher. It
//! exists so the crate's tests can start real role processes without building the CLI.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use runtime::launch_env::ROLE;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(config) = args.next().map(PathBuf::from) else {
        eprintln!("usage: tessera-ps-role CONFIG [SECTION.KEY=VALUE …] (with {ROLE} set)");
        return ExitCode::from(2);
    };
    let overrides: Vec<String> = args.collect();
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let config = runtime::TrainConfig::load(&config, &overrides)?;
        let env = ps::RoleEnv::from_process()?.ok_or(format!("{ROLE} is not set"))?;
        if let Some(report) = ps::run_role(&config, &env, None)? {
            // Not `print!`, which panics when stdout cannot be written (a full disk).
            let mut out = std::io::stdout().lock();
            out.write_all(ps::summary(&report, &config, &env).as_bytes())
                .and_then(|()| out.flush())
                .map_err(|e| format!("cannot write the summary to stdout: {e}"))?;
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
