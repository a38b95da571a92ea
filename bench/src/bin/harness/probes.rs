//! Whether each peer speaks the protocols of the HTTP/2 and gRPC scenarios
//! at all, tried once before the rounds: a peer that does not is skipped in
//! those scenarios with a line saying so, rather than failing every round.

use std::time::Duration;

use kubegrace_bench::grpc;
use kubegrace_bench::parse;
use kubegrace_bench::peers::Peer;
use kubegrace_bench::proc::run_bounded;

use super::Harness;

/// The peers h2c prior knowledge does not work through (20 requests).
pub(crate) fn no_h2(h: &Harness, live: &[Peer]) -> Vec<Peer> {
    let mut failed = Vec::new();
    for &peer in live {
        let mut probe = h.pinned_load("h2load");
        probe
            .args(["-n20", "-c1", "-m1"])
            .arg(format!("http://127.0.0.1:{}/", h.env.h2_port(peer)));
        let ok = run_bounded(probe, Duration::from_secs(10), || {})
            .ok()
            .and_then(|(out, _)| parse::h2load_summary(&out).ok())
            .is_some_and(|r| r.requests == 20 && r.errors == 0);
        if !ok {
            h.progress(&format!(
                "{}: h2c prior knowledge does not work; HTTP/2 scenario skipped",
                peer.name()
            ));
            failed.push(peer);
        }
    }
    failed
}

/// The peers gRPC does not work through (20 unary calls with ghz); all of
/// them when ghz does not run.
pub(crate) fn no_grpc(h: &Harness, live: &[Peer]) -> Vec<Peer> {
    let mut failed = Vec::new();
    for &peer in live {
        let mut probe = h.pinned_load(&h.args.ghz);
        let port = h.env.grpc_port(peer);
        probe.args(grpc::probe_args(&h.args.grpc_proto, port));
        let outcome = run_bounded(probe, Duration::from_secs(20), || {})
            .map_err(|e| format!("{e:#}"))
            .and_then(|(out, err)| {
                parse::ghz(&out).map_err(|e| format!("{e:#}: {}", first_error(&out, &err)))
            });
        match outcome {
            Ok(r) if r.requests == 20 && r.errors == 0 => {}
            Ok(r) => {
                h.progress(&format!(
                    "{}: {} of 20 gRPC calls failed; gRPC scenarios skipped",
                    peer.name(),
                    r.errors
                ));
                failed.push(peer);
            }
            Err(e) => {
                h.progress(&format!(
                    "{}: gRPC does not work ({e}); gRPC scenarios skipped",
                    peer.name()
                ));
                failed.push(peer);
            }
        }
    }
    failed
}

/// What ghz said went wrong, short: the first failure of its JSON report,
/// else the start of what it printed.
fn first_error(out: &str, err: &str) -> String {
    serde_json::from_str::<serde_json::Value>(out.trim())
        .ok()
        .and_then(|v| {
            v.get("errorDistribution")?
                .as_object()?
                .keys()
                .next()
                .cloned()
        })
        .unwrap_or_else(|| format!("{out}{err}").chars().take(300).collect())
}
