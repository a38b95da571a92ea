//! The sidecar's integration tests, one binary: the real proxy against real
//! test apps and real clients on 127.0.0.1. Each module is one subject;
//! [`kit`] is the one harness they share.
//!
//! Tests run in-process (the library's `Sidecar`) unless the subject is
//! what only a process has: signals, exit codes, inherited file
//! descriptors, upgrades, logs.

mod kit;

mod admin_hardening;
mod app_readiness;
mod app_restart;
mod app_upgrade;
mod bad_input;
mod breaker_adaptive;
mod breaker_drain;
mod breaker_failover;
mod breaker_isolation;
mod breaker_overload;
mod breaker_reload;
mod config_missing;
mod config_unknown_keys;
mod drain_h2_grpc;
mod drain_h2_strict;
mod drain_idle;
mod drain_inflight_h1;
mod drain_keepalive_race;
mod drain_long_request;
mod drain_prestop;
mod drain_readiness;
mod drain_report_file;
mod drain_restart;
mod drain_rolling;
mod drain_tcp_mode;
mod drain_websocket;
mod drain_websocket_close;
mod fast_path;
mod grpc_health;
mod h2_head;
mod h2_http1_app;
mod h2_isolation;
mod h2_shared;
mod hardening;
mod header_rules;
mod local_answers;
mod malloc_tuned;
mod probes_never_wait;
mod proxy_basics;
mod requests_by_route;
mod retry;
mod route_paths;
mod sd_notify;
mod unix_listen;
mod upgrade_handover;
mod upstream_unix;
mod workers;
