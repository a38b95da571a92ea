//! The load scenarios, in the order the report shows them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "tool")]
pub enum Load {
    /// wrk, closed loop: each connection sends as soon as it has an answer.
    Wrk { connections: u32, close: bool },
    /// h2load over h2c prior knowledge: `clients` connections with up to
    /// `streams` concurrent streams each.
    H2load { clients: u32, streams: u32 },
    /// bench-client at a fixed rate (set per run).
    Rate { connections: u32 },
    /// ghz (a gRPC load tool nobody here wrote) over h2c: `concurrency`
    /// workers on `connections` connections calling `call`; at the run's
    /// fixed rate when `rate`, else as fast as answers come (closed loop).
    Ghz {
        call: GrpcCall,
        connections: u32,
        concurrency: u32,
        rate: bool,
    },
}

/// The gRPC method a ghz scenario calls (bench/grpc/bench.proto).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrpcCall {
    /// One request, one reply.
    Unary,
    /// One request, `GRPC_STREAM_MESSAGES` replies.
    ServerStreaming,
}

/// Where the upstream app runs during a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cores {
    /// The proxy alone on the proxy CPUs; the app shares the load
    /// generator's: measures the proxy on a core of its own.
    ProxyAlone,
    /// The proxy and the app together on the proxy CPUs (a pod with one
    /// CPU), the load generator alone on its own: the figure is the pair's
    /// throughput, and a proxy that costs less leaves the app more.
    SharedWithApp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    pub id: &'static str,
    pub title: &'static str,
    pub load: Load,
    pub cores: Cores,
}

impl Scenario {
    /// Whether the proxy's HTTP/2 port is used.
    pub fn is_h2(&self) -> bool {
        matches!(self.load, Load::H2load { .. })
    }

    pub fn is_grpc(&self) -> bool {
        matches!(self.load, Load::Ghz { .. })
    }

    /// Saturation scenarios measure throughput; the rate ones latency.
    pub fn is_saturation(&self) -> bool {
        !matches!(self.load, Load::Rate { .. } | Load::Ghz { rate: true, .. })
    }
}

pub const KEEPALIVE_64: &str = "h1-keepalive-64";
pub const KEEPALIVE_256: &str = "h1-keepalive-256";
pub const NEW_CONNECTION: &str = "h1-new-connection";
pub const FIXED_RATE: &str = "h1-fixed-rate";
pub const SHARED_KEEPALIVE: &str = "shared-h1-keepalive-64";
pub const SHARED_NEW_CONNECTION: &str = "shared-h1-new-connection";
pub const GRPC_UNARY: &str = "grpc-unary";
pub const GRPC_STREAMING: &str = "grpc-server-streaming";
pub const GRPC_UNARY_RATE: &str = "grpc-unary-fixed-rate";

/// The proxy-and-app-on-one-core family (issue #39, item 2).
pub const SHARED_CORE: [&str; 2] = [SHARED_KEEPALIVE, SHARED_NEW_CONNECTION];

/// Replies per server-streaming call: bench-upstream sends this many.
pub const GRPC_STREAM_MESSAGES: u32 = 10;

pub const SCENARIOS: [Scenario; 10] = [
    Scenario {
        id: KEEPALIVE_64,
        title: "HTTP/1.1 keep-alive, 64 connections",
        load: Load::Wrk {
            connections: 64,
            close: false,
        },
        cores: Cores::ProxyAlone,
    },
    Scenario {
        id: KEEPALIVE_256,
        title: "HTTP/1.1 keep-alive, 256 connections",
        load: Load::Wrk {
            connections: 256,
            close: false,
        },
        cores: Cores::ProxyAlone,
    },
    Scenario {
        id: NEW_CONNECTION,
        title: "HTTP/1.1, new connection per request (64 clients)",
        load: Load::Wrk {
            connections: 64,
            close: true,
        },
        cores: Cores::ProxyAlone,
    },
    Scenario {
        id: "h2-multiplexed",
        title: "HTTP/2 (h2c), 8 connections x 32 streams",
        load: Load::H2load {
            clients: 8,
            streams: 32,
        },
        cores: Cores::ProxyAlone,
    },
    Scenario {
        id: FIXED_RATE,
        title: "HTTP/1.1 at a fixed rate, 32 connections",
        load: Load::Rate { connections: 32 },
        cores: Cores::ProxyAlone,
    },
    Scenario {
        id: SHARED_KEEPALIVE,
        title: "Proxy and app on one core: HTTP/1.1 keep-alive, 64 connections",
        load: Load::Wrk {
            connections: 64,
            close: false,
        },
        cores: Cores::SharedWithApp,
    },
    Scenario {
        id: SHARED_NEW_CONNECTION,
        title: "Proxy and app on one core: HTTP/1.1, new connection per request (64 clients)",
        load: Load::Wrk {
            connections: 64,
            close: true,
        },
        cores: Cores::SharedWithApp,
    },
    // gRPC: several connections, as a gRPC client pool opens them, and
    // enough workers to keep each connection's streams busy.
    Scenario {
        id: GRPC_UNARY,
        title: "gRPC unary (ghz), 8 connections x 8 workers",
        load: Load::Ghz {
            call: GrpcCall::Unary,
            connections: 8,
            concurrency: 64,
            rate: false,
        },
        cores: Cores::ProxyAlone,
    },
    Scenario {
        id: GRPC_STREAMING,
        title: "gRPC server-streaming, 10 replies a call (ghz), 8 connections x 8 workers",
        load: Load::Ghz {
            call: GrpcCall::ServerStreaming,
            connections: 8,
            concurrency: 64,
            rate: false,
        },
        cores: Cores::ProxyAlone,
    },
    Scenario {
        id: GRPC_UNARY_RATE,
        title: "gRPC unary at a fixed rate (ghz), 4 connections x 4 workers",
        load: Load::Ghz {
            call: GrpcCall::Unary,
            connections: 4,
            concurrency: 16,
            rate: true,
        },
        cores: Cores::ProxyAlone,
    },
];

/// The scenarios named in `ids` (comma separated), in report order; all of
/// them when `ids` is empty. An unknown id is an error naming the known ones.
pub fn select(ids: &str) -> Result<Vec<Scenario>, String> {
    let wanted: Vec<&str> = ids
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(unknown) = wanted
        .iter()
        .find(|id| !SCENARIOS.iter().any(|s| s.id == **id))
    {
        let known: Vec<&str> = SCENARIOS.iter().map(|s| s.id).collect();
        return Err(format!(
            "unknown scenario {unknown:?} in BENCH_SCENARIOS; known: {}",
            known.join(", ")
        ));
    }
    Ok(SCENARIOS
        .iter()
        .filter(|s| wanted.is_empty() || wanted.contains(&s.id))
        .copied()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_are_picked_by_id() -> Result<(), String> {
        assert_eq!(select("")?.len(), SCENARIOS.len());
        let picked = select(" h2-multiplexed ,h1-keepalive-64")?;
        let ids: Vec<&str> = picked.iter().map(|s| s.id).collect();
        assert_eq!(ids, ["h1-keepalive-64", "h2-multiplexed"], "report order");
        let shared: Vec<Scenario> = select(&SHARED_CORE.join(","))?;
        assert_eq!(shared.len(), 2);
        assert!(shared.iter().all(|s| s.cores == Cores::SharedWithApp));
        assert!(
            SCENARIOS
                .iter()
                .filter(|s| s.cores == Cores::SharedWithApp)
                .all(|s| SHARED_CORE.contains(&s.id)),
            "the report's shared-core tables list every such scenario"
        );
        let rate = select(GRPC_UNARY_RATE)?;
        assert!(rate[0].is_grpc() && !rate[0].is_saturation());
        let unknown = select("h2c").err().unwrap_or_default();
        assert!(unknown.contains("h2-multiplexed"), "{unknown}");
        Ok(())
    }
}
