//! `kubegrace-sidecar`: parses the command line and hands over to the
//! library. Exit status: 0 once drained after SIGTERM/SIGINT, 64 for
//! anything the user must fix (flags, environment, file), 1 otherwise.

use clap::Parser;
use kubegrace_sidecar::cli::{self, Cli, EXIT_USAGE, LogFormat};

fn main() {
    // First: on success this process image is replaced (allocator.rs).
    let untuned = kubegrace_sidecar::allocator::exec_tuned();
    kubegrace_sidecar::allocator::tune_heap();
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
    if let Some(err) = untuned {
        tracing::warn!(error = %err, "cannot start again with glibc's malloc tuned ({}); going on with its defaults", kubegrace_sidecar::allocator::TUNABLES_ENV);
    }

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
    match runtime.block_on(kubegrace_sidecar::run(startup, settings)) {
        Ok(report) => {
            tracing::info!(
                connections = report.connections,
                seconds = report.duration.as_secs_f64(),
                force_closed = report.force_closed,
                "{report}"
            );
            // An upgrade hands the container to the new process, whose own
            // drain writes the message the kubelet will read.
            if let Some(path) = termination_log
                .filter(|_| report.trigger != kubegrace_sidecar::stop::UPGRADE_REASON)
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
    use tracing_subscriber::{fmt, prelude::*};
    // KUBEGRACE_LOG (or RUST_LOG) tunes verbosity: a level (`warn`) or
    // comma-separated `target=level` directives (`info,kubegrace_sidecar::drain=debug`);
    // unset, empty or not parsable, info. `Targets` takes EnvFilter's syntax
    // minus span and field filters (`[span{field=value}]`), which need the
    // regex engine: EnvFilter linked ~0.3 MB of it into a binary that runs
    // in every pod, for a syntax no one is told about.
    let names = [kubegrace_sidecar_api::cli::env::LOG, "RUST_LOG"];
    let filter = log_filter(names.map(std::env::var));
    // A value that does not parse is passed over, as it was with
    // EnvFilter, but no longer silently: said once logging is up.
    let passed_over: Vec<String> = names
        .iter()
        .filter_map(|name| {
            let value = std::env::var(name).ok()?;
            let unreadable = !value.trim().is_empty()
                && value
                    .parse::<tracing_subscriber::filter::Targets>()
                    .is_err();
            unreadable.then(|| format!("{name}={value}"))
        })
        .collect();
    let layer = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let subscriber = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Text => subscriber.with(layer).init(),
        LogFormat::Json => subscriber.with(layer.json().flatten_event(true)).init(),
    }
    for setting in passed_over {
        tracing::warn!(
            %setting,
            "log filter not understood, passed over: give a level (warn) or target=level \
             directives (info,kubegrace_sidecar::drain=debug); span and field filters are not supported"
        );
    }
}

/// The first of the variables' values that is set, not empty and parses;
/// else info.
fn log_filter<E>(values: [Result<String, E>; 2]) -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    values
        .into_iter()
        .filter_map(Result::ok)
        .filter(|value| !value.trim().is_empty())
        .find_map(|value| value.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO))
}

#[cfg(test)]
mod tests {
    use super::log_filter;
    use tracing::Level;

    fn filter(
        kubegrace_log: Option<&str>,
        rust_log: Option<&str>,
    ) -> tracing_subscriber::filter::Targets {
        log_filter([kubegrace_log, rust_log].map(|v| v.map(str::to_owned).ok_or(())))
    }

    /// Asserts that `KUBEGRACE_LOG=spec` enables each `(target, level)` of
    /// `on` and none of `off`.
    fn assert_enables(spec: &str, on: &[(&str, Level)], off: &[(&str, Level)]) {
        let f = filter(Some(spec), None);
        for (target, level) in on {
            assert!(f.would_enable(target, level), "{spec}: {target} {level}");
        }
        for (target, level) in off {
            assert!(
                !f.would_enable(target, level),
                "{spec}: not {target} {level}"
            );
        }
    }

    #[test]
    fn a_level_applies_to_every_target() {
        let on = [
            ("kubegrace_sidecar::drain", Level::WARN),
            ("hyper::proto", Level::ERROR),
        ];
        assert_enables("warn", &on, &[("kubegrace_sidecar::drain", Level::INFO)]);
        assert_enables("DEBUG", &[("h2", Level::DEBUG)], &[]);
    }

    #[test]
    fn target_directives_as_documented() {
        assert_enables(
            "info,kubegrace_sidecar::drain=debug",
            &[
                ("kubegrace_sidecar::drain::driver", Level::DEBUG),
                ("kubegrace_sidecar::proxy", Level::INFO),
            ],
            &[("kubegrace_sidecar::proxy", Level::DEBUG)],
        );
        // A target alone: everything else is off, as with EnvFilter.
        assert_enables(
            "kubegrace_sidecar=debug",
            &[("kubegrace_sidecar", Level::DEBUG)],
            &[("hyper", Level::ERROR)],
        );
    }

    #[test]
    fn kubegrace_log_first_then_rust_log_then_info() {
        assert!(!filter(Some("error"), Some("debug")).would_enable("x", &Level::WARN));
        assert!(filter(None, Some("debug")).would_enable("x", &Level::DEBUG));
        // Empty or not parsable (span and field filters are not supported):
        // the next one.
        assert!(filter(Some(""), Some("debug")).would_enable("x", &Level::DEBUG));
        assert!(
            filter(Some("[conn{peer=1}]=debug"), Some("debug")).would_enable("x", &Level::DEBUG)
        );
        let default = filter(Some("nonsense=%"), None);
        assert!(default.would_enable("x", &Level::INFO));
        assert!(!default.would_enable("x", &Level::DEBUG));
    }
}
