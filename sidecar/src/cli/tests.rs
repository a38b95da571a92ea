//! Flag and environment parsing, and how they lay over the file.
use super::*;

use std::time::Duration;

fn cli(args: &[&str]) -> std::result::Result<Cli, clap::Error> {
    let mut full = vec!["kubegrace-sidecar"];
    full.extend_from_slice(args);
    Cli::try_parse_from(full)
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    crate::testing::config_file("cli", name, text)
}

/// The config loaded from a file of `yaml` alone, and from the same file
/// with the flag `flag` given too (where the flag must win).
fn file_then_flag(name: &str, yaml: &str, flag: [&str; 2]) -> (Config, Config) {
    let path = temp_file(name, yaml);
    let file_only = load(Some(&path), &Overrides::default()).expect("load");
    let c = cli(&flag).expect("parse");
    let flagged = load(Some(&path), &c.settings().overrides).expect("load");
    (file_only, flagged)
}

#[test]
fn the_sidecar_takes_the_arguments_the_operator_writes() {
    use kubegrace_sidecar_api::cli::flag;
    use kubegrace_sidecar_api::pod;
    let config = pod::config_path();
    let c = cli(&[
        flag::CONFIG,
        &config,
        flag::LISTEN,
        "0.0.0.0:15181",
        flag::UPSTREAM,
        "127.0.0.1:8080",
        flag::ADMIN,
        "0.0.0.0:15180",
        flag::DRAIN_TOKEN,
        "t0k3n",
    ])
    .expect("parse");
    assert_eq!(c.config.as_deref(), Some(std::path::Path::new(&config)));
    assert_eq!(c.drain_token.as_deref(), Some("t0k3n"));
}

#[test]
fn every_flag_has_its_kubegrace_environment_twin() {
    use clap::CommandFactory;
    for arg in Cli::command().get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") {
            continue;
        }
        let want = format!("KUBEGRACE_{}", long.replace('-', "_").to_ascii_uppercase());
        let env = arg.get_env().and_then(|e| e.to_str());
        assert_eq!(env, Some(want.as_str()), "--{long}");
    }
}

#[test]
fn flags_win_over_the_file_and_the_file_over_defaults() {
    let path = temp_file(
        "precedence",
        "drain: {minDelay: 3s, quiet: 2s}\nupstream: 127.0.0.1:9000\n",
    );
    let c = cli(&[
        "--config",
        path.to_str().expect("utf8"),
        "--drain-min-delay",
        "300ms",
    ])
    .expect("parse");
    let s = c.settings();
    let config = load(s.config_file.as_deref(), &s.overrides).expect("load");
    assert_eq!(
        config.drain.min_delay.get(),
        Duration::from_millis(300),
        "flag wins"
    );
    assert_eq!(
        config.drain.quiet.get(),
        Duration::from_secs(2),
        "file wins over default"
    );
    assert_eq!(config.upstream.to_string(), "127.0.0.1:9000");
    assert_eq!(
        config.drain.timeout.get(),
        Duration::from_secs(30),
        "default"
    );
}

#[test]
fn flags_can_fix_a_relation_the_file_alone_breaks() {
    // The file alone would fail (minDelay 20s > maxDelay 15s default).
    let path = temp_file("relation", "drain: {minDelay: 20s}\n");
    let c = cli(&[
        "--config",
        path.to_str().expect("utf8"),
        "--drain-max-delay",
        "30s",
    ])
    .expect("parse");
    let s = c.settings();
    assert!(load(s.config_file.as_deref(), &s.overrides).is_ok());
}

#[test]
fn bad_values_name_the_flag() {
    let err = cli(&["--drain-quiet", "3 parsecs"]).expect_err("invalid");
    assert!(err.to_string().contains("--drain-quiet"), "{err}");
    let err = cli(&["--protocol", "gopher"]).expect_err("invalid");
    assert!(err.to_string().contains("--protocol"), "{err}");
    let err = cli(&["--upstream", "localhost"]).expect_err("invalid");
    assert!(err.to_string().contains("--upstream"), "{err}");
}

#[test]
fn relation_errors_name_key_and_flag() {
    let c = cli(&["--drain-min-delay", "20s", "--drain-max-delay", "5s"]).expect("parse");
    let s = c.settings();
    let err = load(None, &s.overrides).expect_err("invalid");
    let text = err.to_string();
    assert!(
        text.contains("drain.minDelay (--drain-min-delay)"),
        "{text}"
    );
    assert_eq!(err.exit_code(), EXIT_USAGE);
}

#[test]
fn file_errors_name_the_file_and_position() {
    let path = temp_file("bad", "drain: {minDelay: soon}\n");
    let err = load(Some(&path), &Overrides::default()).expect_err("invalid");
    let text = err.to_string();
    assert!(text.contains("config.yaml"), "{text}");
    assert!(text.contains("soon"), "{text}");
    assert_eq!(err.exit_code(), EXIT_USAGE);
    let err = load(
        Some(&path.with_file_name("missing.yaml")),
        &Overrides::default(),
    )
    .expect_err("missing");
    assert_eq!(err.exit_code(), EXIT_USAGE);
}

#[test]
fn repeated_upstreams_become_the_list_and_upstream_its_first() {
    let c = cli(&[
        "--upstream",
        "127.0.0.1:9001",
        "--upstream",
        "unix:/run/app/green.sock",
    ])
    .expect("parse");
    let config = load(None, &c.settings().overrides).expect("load");
    assert_eq!(config.upstream.to_string(), "127.0.0.1:9001");
    assert_eq!(config.upstreams.len(), 2);
    assert_eq!(config.upstream_endpoints(), config.upstreams);

    let path = temp_file("list", "upstreams: [127.0.0.1:9001, 127.0.0.1:9002]\n");
    let config = load(Some(&path), &Overrides::default()).expect("load");
    assert_eq!(config.upstream.to_string(), "127.0.0.1:9001");

    let path = temp_file(
        "conflict",
        "upstream: 127.0.0.1:9000\nupstreams: [127.0.0.1:9001, 127.0.0.1:9002]\n",
    );
    let err = load(Some(&path), &Overrides::default()).expect_err("not in the list");
    assert!(err.to_string().contains("not one of upstreams"), "{err}");
}

#[test]
fn workers_and_listen_mode_are_checked() {
    let c = cli(&["--workers", "0"]).expect("parse");
    let err = load(None, &c.settings().overrides).expect_err("0 workers");
    assert!(err.to_string().contains("workers (--workers)"), "{err}");
    let c = cli(&["--listen-mode", "0660"]).expect("parse");
    let err = load(None, &c.settings().overrides).expect_err("tcp listen");
    assert!(
        err.to_string().contains("listenMode (--listen-mode)"),
        "{err}"
    );
    assert!(cli(&["--listen-mode", "rw-rw----"]).is_err());
    let c = cli(&["--listen", "unix:/tmp/x.sock", "--listen-mode", "660"]).expect("parse");
    let config = load(None, &c.settings().overrides).expect("load");
    assert_eq!(
        config.listen_mode.map(|m| m.to_string()).as_deref(),
        Some("0660")
    );
}

#[test]
fn a_missing_file_at_start_runs_on_flags_an_invalid_one_does_not() {
    let path = temp_file("gone", "drain: {quiet: 2s}\n").with_file_name("absent.yaml");
    let c = cli(&["--drain-quiet", "300ms"]).expect("parse");
    let start = load_at_start(Some(&path), &c.settings().overrides).expect("starts");
    assert_eq!(start.config_file, ConfigFile::Missing);
    assert_eq!(start.config.drain.quiet.get(), Duration::from_millis(300));
    let bad = temp_file("invalid", "drain: {quiet: soon}\n");
    let err = load_at_start(Some(&bad), &Overrides::default()).expect_err("invalid");
    assert_eq!(err.exit_code(), EXIT_USAGE);
}

#[test]
fn drain_readiness_comes_from_the_flag_over_the_file() {
    assert_eq!(
        cli(&["--drain-readiness", "stayServing"])
            .expect("parse")
            .drain_readiness,
        Some(DrainReadiness::StayServing)
    );
    let err = cli(&["--drain-readiness", "lazy"]).expect_err("invalid");
    assert!(err.to_string().contains("--drain-readiness"), "{err}");
    let (file_only, flagged) = file_then_flag(
        "readiness",
        "drain: {readiness: stayServing}\n",
        ["--drain-readiness", "failFast"],
    );
    assert_eq!(file_only.drain.readiness, DrainReadiness::StayServing);
    assert_eq!(
        flagged.drain.readiness,
        DrainReadiness::FailFast,
        "flag wins"
    );
}

#[test]
fn grpc_health_comes_from_the_flag_over_the_file() {
    let err = cli(&["--drain-grpc-health", "off"]).expect_err("invalid");
    assert!(err.to_string().contains("notServing or app"), "{err}");
    let (file_only, flagged) = file_then_flag(
        "grpc-health",
        "drain: {grpcHealth: app}\n",
        ["--drain-grpc-health", "notServing"],
    );
    assert_eq!(file_only.drain.grpc_health, DrainGrpcHealth::App);
    assert_eq!(
        flagged.drain.grpc_health,
        DrainGrpcHealth::NotServing,
        "flag wins"
    );
}

#[test]
fn protocols_parse() {
    assert_eq!(
        cli(&["--protocol", "tcp"]).expect("parse").protocol,
        Some(Protocol::Tcp)
    );
    assert_eq!(
        cli(&["--protocol", "HTTP2"]).expect("parse").protocol,
        Some(Protocol::Http2)
    );
}

#[test]
fn the_http1_fast_path_is_on_unless_switched_off() {
    assert!(
        load(None, &Overrides::default())
            .expect("load")
            .proxy
            .http1_fast_path
    );
    let (file_off, flag_on) = file_then_flag(
        "fastpath",
        "proxy: {http1FastPath: false}\n",
        ["--http1-fast-path", "true"],
    );
    assert!(!file_off.proxy.http1_fast_path);
    assert!(flag_on.proxy.http1_fast_path, "flag wins");
}

#[test]
fn deferred_accept_is_on_unless_switched_off() {
    let defaults = load(None, &Overrides::default()).expect("load");
    assert!(defaults.proxy.defer_accept);
    let (file_off, flag_on) = file_then_flag(
        "defer",
        "proxy: {deferAccept: false}\n",
        ["--defer-accept", "true"],
    );
    assert!(!file_off.proxy.defer_accept);
    assert!(
        file_off.proxy.http1_fast_path,
        "the other proxy key keeps its default"
    );
    assert!(flag_on.proxy.defer_accept, "flag wins");
}

#[test]
fn version_names_the_program_crate_version_and_revision() {
    let program = "kubegrace-sidecar";
    let want = kubegrace_sidecar_api::build::version_text(program, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        <Cli as clap::CommandFactory>::command().render_version(),
        want
    );
}

/// Flags and their environment twins go through the file's bounds: past
/// one, the error names the key, the flag and the allowed range.
#[test]
fn flags_past_a_bound_are_refused_naming_key_and_flag() {
    for (args, key, flag) in [
        (
            ["--drain-quiet", "5124095576030431h"],
            "drain.quiet",
            "--drain-quiet",
        ),
        (
            ["--drain-timeout", "1h1s"],
            "drain.timeout",
            "--drain-timeout",
        ),
        (
            ["--write-timeout", "25h"],
            "limits.writeTimeout",
            "--write-timeout",
        ),
        (
            ["--max-connections", "1000001"],
            "limits.maxConnections",
            "--max-connections",
        ),
        (
            ["--trusted-hops", "65"],
            "forwarded.trustedHops",
            "--trusted-hops",
        ),
        (
            ["--upstream-hold-timeout", "2h"],
            "upstreamPool.holdTimeout",
            "--upstream-hold-timeout",
        ),
    ] {
        let c = cli(&args).expect("parse");
        let err = load(None, &c.settings().overrides).expect_err(args[1]);
        let Error::Config(e) = err else {
            panic!("{args:?}: {err}");
        };
        assert_eq!(e.key, format!("{key} ({flag})"), "{e}");
        assert!(e.message.contains(" to "), "the range is named: {e}");
    }
    // At the bound it loads.
    let c = cli(&["--drain-timeout", "1h", "--drain-quiet", "1h"]).expect("parse");
    let config = load(None, &c.settings().overrides).expect("at the bound");
    assert_eq!(config.drain.timeout.get(), Duration::from_secs(3_600));
}
