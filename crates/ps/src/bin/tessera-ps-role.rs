//! `tessera-ps-role CONFIG [SECTION.KEY=VALUE …]`: runs the parameter-server role of
//! `TESSERA_ROLE` for CONFIG, exactly as `tessera train CONFIG` does under a launcher. It
//! exists so the crate's tests can start real role processes without building the CLI.

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
            print!("{}", ps::summary(&report, &config, &env));
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
