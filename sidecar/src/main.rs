//! `kubegrace-sidecar`: parses the command line and hands over to the
//! library. Exit status: 0 once drained after SIGTERM/SIGINT, 64 for
//! anything the user must fix (flags, environment, file), 1 otherwise.

use clap::Parser;
use kubegrace_sidecar::cli::{self, Cli, EXIT_USAGE, LogFormat};

fn main() {
    let args = match Cli::try_parse() {
        Ok(args) => args,
        Err(err) => {
            let code = if err.use_stderr() { EXIT_USAGE } else { 0 };
            // clap's message names the flag (and says why); --help and
            // --version land here too, on stdout with status 0.
            let _ = err.print();
            std::process::exit(code);
        }
    };
    if let Some(cli::Command::Upgrade { admin, token }) = &args.command {
        match kubegrace_sidecar::upgrade::request(*admin, token.as_deref()) {
            Ok(answer) => {
                println!("{answer}");
                std::process::exit(0);
            }
            Err(why) => {
                eprintln!("kubegrace-sidecar upgrade: {why}");
                std::process::exit(1);
            }
        }
    }
    let settings = args.settings();
    let termination_log =
        kubegrace_sidecar::termination::target(settings.termination_log.as_deref());
    init_logging(settings.log_format);

    let startup = match cli::load_at_start(settings.config_file.as_deref(), &settings.overrides) {
        Ok(startup) => startup,
        Err(err) => {
            eprintln!("kubegrace-sidecar: {err}");
            std::process::exit(err.exit_code());
        }
    };

    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("kubegrace-sidecar: cannot start the runtime: {err}");
            std::process::exit(1);
        }
    };
    match runtime.block_on(kubegrace_sidecar::run(
        startup.config,
        settings,
        startup.file_missing,
    )) {
        Ok(report) => {
            tracing::info!(
                connections = report.connections,
                seconds = report.duration.as_secs_f64(),
                force_closed = report.force_closed,
                "{report}"
            );
            // An upgrade hands the container to the new process, whose own
            // drain writes the message the kubelet will read.
            if let Some(path) =
                termination_log.filter(|_| report.trigger != kubegrace_sidecar::UPGRADE_REASON)
                && let Err(err) = kubegrace_sidecar::termination::write(&report, &path)
            {
                tracing::warn!(path = %path.display(), error = %err, "cannot write the drain report as the termination message");
            }
            // Connection tasks may still hold sockets the drain already gave
            // up on; exiting closes them.
            runtime.shutdown_background();
            std::process::exit(0);
        }
        Err(err) => {
            eprintln!("kubegrace-sidecar: {err}");
            std::process::exit(err.exit_code());
        }
    }
}

/// The runtime: on one CPU (a sidecar's usual CPU limit; `available_parallelism`
/// reads the cgroup quota and the affinity mask) tokio's single-threaded
/// scheduler on the main thread, not one worker thread beside a main
/// thread that only waits: one thread stack and one malloc arena fewer,
/// and no cross-thread hand-off (wake-ups, the inject queue's atomics)
/// per task. The parallelism is the same, one: the multi-threaded runtime
/// sizes itself to one worker there. `TOKIO_WORKER_THREADS` (tokio's own
/// knob) asks for worker threads explicitly.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    if cpus == 1 && std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    // KUBEGRACE_LOG (or RUST_LOG) tunes verbosity; info is the default.
    let filter = EnvFilter::try_from_env(kubegrace_sidecar_api::cli::env::LOG)
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
