//! The gRPC scenarios' load: ghz (github.com/bojand/ghz, built from the Go
//! module proxy by bench/run) calling bench/grpc/bench.proto's service on
//! bench-upstream, directly or through a proxy.

use std::path::Path;

use crate::scenario::GrpcCall;

/// The fully qualified method ghz calls (`package.Service.Method`).
pub fn method(call: GrpcCall) -> &'static str {
    match call {
        GrpcCall::Unary => "kubegrace.bench.Bench.Unary",
        GrpcCall::ServerStreaming => "kubegrace.bench.Bench.Stream",
    }
}

/// How one ghz run is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub call: GrpcCall,
    pub connections: u32,
    pub concurrency: u32,
    /// Calls per second; `None` runs closed-loop (as fast as answers come).
    pub rate: Option<u32>,
    /// Length of the run, whole seconds.
    pub seconds: u32,
}

/// The arguments of one ghz run against `port` on loopback, printing its
/// JSON report. ghz takes one CPU (`--cpus 1`, GOMAXPROCS), like the other
/// load tools' one thread: it shares its core with the upstream.
pub fn ghz_args(run: &Run, proto: &Path, port: u16) -> Vec<String> {
    let mut args = vec![
        "--insecure".to_string(),
        "--proto".to_string(),
        proto.display().to_string(),
        "--call".to_string(),
        method(run.call).to_string(),
        // The request: a short payload (base64 of "kubegrace"); the
        // upstream answers whatever it holds.
        "-d".to_string(),
        r#"{"payload":"a3ViZWdyYWNl"}"#.to_string(),
        format!("--connections={}", run.connections.max(1)),
        // ghz needs at least as many workers as connections.
        format!(
            "--concurrency={}",
            run.concurrency.max(run.connections).max(1)
        ),
        format!("--duration={}s", run.seconds.max(1)),
        "--cpus=1".to_string(),
        "--format=json".to_string(),
    ];
    if let Some(rate) = run.rate {
        args.push(format!("--rps={}", rate.max(1)));
    }
    args.push(format!("127.0.0.1:{port}"));
    args
}

/// The arguments of a short unary run (20 calls, one at a time) that must
/// all succeed, to tell whether a peer proxies gRPC at all before its
/// scenarios run.
pub fn probe_args(proto: &Path, port: u16) -> Vec<String> {
    vec![
        "--insecure".to_string(),
        "--proto".to_string(),
        proto.display().to_string(),
        "--call".to_string(),
        method(GrpcCall::Unary).to_string(),
        "-d".to_string(),
        r#"{"payload":"cHJvYmU="}"#.to_string(),
        "--total=20".to_string(),
        "--concurrency=1".to_string(),
        "--cpus=1".to_string(),
        "--timeout=2s".to_string(),
        "--format=json".to_string(),
        format!("127.0.0.1:{port}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ghz_runs_are_bounded_and_shaped() {
        let run = Run {
            call: GrpcCall::ServerStreaming,
            connections: 8,
            concurrency: 4,
            rate: None,
            seconds: 0,
        };
        let args = ghz_args(&run, Path::new("bench/grpc/bench.proto"), 27112);
        assert!(args.contains(&"kubegrace.bench.Bench.Stream".to_string()));
        assert!(
            args.contains(&"--duration=1s".to_string()),
            "never unbounded"
        );
        assert!(args.contains(&"--concurrency=8".to_string()), "{args:?}");
        assert!(!args.iter().any(|a| a.starts_with("--rps")));
        assert_eq!(args.last().map(String::as_str), Some("127.0.0.1:27112"));
        let rated = Run {
            rate: Some(1000),
            ..run
        };
        assert!(ghz_args(&rated, Path::new("p"), 1).contains(&"--rps=1000".to_string()));
    }
}
