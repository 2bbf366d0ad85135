//! `tessera train` in `parallel.mode = "parameter_server"`: run the role `TESSERA_ROLE` names,
//! or, when it is unset, start every role as a child process on this machine.

use runtime::TrainConfig;

/// Runs a parameter-server config.
pub fn run(config: &TrainConfig) -> anyhow::Result<()> {
    let Some(env) = ps::RoleEnv::from_process()? else {
        let keys = config
            .ps()
            .ok_or_else(|| anyhow::anyhow!("the config is not in parameter_server mode"))?;
        let servers = keys.servers.unwrap_or(1);
        let workers = keys.workers.unwrap_or(2);
        let program = std::env::current_exe()?;
        let args: Vec<String> = std::env::args().skip(1).collect();
        eprintln!(
            "parameter-server job on this machine: 1 scheduler, {servers} server(s), {workers} worker(s)"
        );
        ps::launch::run_local_job(&program, &args, servers, workers)?;
        return Ok(());
    };
    if let Some(report) = ps::run_role(config, &env)? {
        print!("{}", ps::summary(&report, config, &env));
    }
    Ok(())
}
