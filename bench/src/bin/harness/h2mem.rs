//! The HTTP/2 memory test: per idle h2c connection and per open HTTP/2
//! stream, on fresh instances of kubegrace, nginx (its h2c port) and
//! HAProxy, with `bench-client h2-hold` holding them (bench/README.md,
//! "HTTP/2 memory").

use std::collections::BTreeMap;

use kubegrace_bench::memtest;
use kubegrace_bench::peers::{DrainTimers, Peer};
use kubegrace_bench::report::{H2Memory, Held};

use super::Harness;

/// Every part of the test on every peer it applies to; a part that fails
/// is reported and left out.
pub(crate) fn run(h: &Harness, live: &[Peer]) -> BTreeMap<String, H2Memory> {
    let (connections, streams) = (h.args.h2_memory_connections, h.args.h2_memory_streams);
    let stream_connections = h.args.h2_memory_stream_connections;
    let limit = memtest::raise_open_files();
    // The proxy takes a descriptor per client connection and, for nginx
    // and HAProxy, one per stream's upstream request; some headroom.
    if limit < u64::from(connections.max(streams)) + 1024 {
        h.progress(&format!(
            "HTTP/2 memory test skipped: it needs more than the open-files limit ({limit})"
        ));
        return BTreeMap::new();
    }
    let mut out = BTreeMap::new();
    for &peer in live {
        if !matches!(peer, Peer::Kubegrace | Peer::Nginx | Peer::Haproxy) {
            continue;
        }
        let mut m = H2Memory::default();
        if connections > 0 {
            m.idle_connections = part(h, peer, connections, 0, 0);
        }
        if streams > 0 {
            m.open_streams = part(h, peer, 0, streams, stream_connections);
        }
        if m != H2Memory::default() {
            out.insert(peer.name().to_string(), m);
        }
    }
    out
}

/// One part on a fresh instance: `connections` idle connections, or
/// `streams` open streams over `on` connections.
fn part(h: &Harness, peer: Peer, connections: u32, streams: u32, on: u32) -> Option<Held> {
    let what = if streams > 0 {
        format!("{streams} open streams on {on} connections")
    } else {
        format!("{connections} idle h2c connections")
    };
    let label = format!("{} (h2 memory)", peer.name());
    let proc = match h.start_peer(peer, DrainTimers::Defaults, &label) {
        Ok(proc) => proc,
        Err(e) => {
            h.progress(&format!("h2 memory {}: not started: {e:#}", peer.name()));
            return None;
        }
    };
    let mut client = h.pinned_load(h.bin("bench-client"));
    client
        .args(["h2-hold", "--target"])
        .arg(format!("127.0.0.1:{}", h.env.h2_port(peer)))
        .args(["--connections", &connections.to_string()])
        .args(["--streams", &streams.to_string()])
        .args(["--stream-connections", &on.to_string()])
        // Longer than the hold: the upstream must not answer while the
        // memory is read; the client is killed right after.
        .args(["--slow-ms", "60000"])
        .args(["--timeout-seconds", "50", "--hold-seconds", "60"]);
    match memtest::idle_and_held(proc.pid(), client, &what) {
        Ok((idle, held)) => {
            let x = Held::new(idle, held, connections + streams, connections + on);
            h.progress(&format!(
                "h2 memory {:<10} idle {idle} KiB, {what} {held} KiB ({:.2} KiB each)",
                peer.name(),
                x.per_item_kib
            ));
            Some(x)
        }
        Err(e) => {
            h.progress(&format!("h2 memory {} {what}: failed: {e:#}", peer.name()));
            None
        }
    }
}
