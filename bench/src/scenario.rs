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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    pub id: &'static str,
    pub title: &'static str,
    pub load: Load,
}

impl Scenario {
    /// Whether the proxy's HTTP/2 port is used.
    pub fn is_h2(&self) -> bool {
        matches!(self.load, Load::H2load { .. })
    }

    /// Saturation scenarios measure throughput; the rate one measures latency.
    pub fn is_saturation(&self) -> bool {
        !matches!(self.load, Load::Rate { .. })
    }
}

pub const KEEPALIVE_64: &str = "h1-keepalive-64";
pub const KEEPALIVE_256: &str = "h1-keepalive-256";
pub const NEW_CONNECTION: &str = "h1-new-connection";
pub const FIXED_RATE: &str = "h1-fixed-rate";

pub const SCENARIOS: [Scenario; 5] = [
    Scenario {
        id: KEEPALIVE_64,
        title: "HTTP/1.1 keep-alive, 64 connections",
        load: Load::Wrk {
            connections: 64,
            close: false,
        },
    },
    Scenario {
        id: KEEPALIVE_256,
        title: "HTTP/1.1 keep-alive, 256 connections",
        load: Load::Wrk {
            connections: 256,
            close: false,
        },
    },
    Scenario {
        id: NEW_CONNECTION,
        title: "HTTP/1.1, new connection per request (64 clients)",
        load: Load::Wrk {
            connections: 64,
            close: true,
        },
    },
    Scenario {
        id: "h2-multiplexed",
        title: "HTTP/2 (h2c), 8 connections x 32 streams",
        load: Load::H2load {
            clients: 8,
            streams: 32,
        },
    },
    Scenario {
        id: FIXED_RATE,
        title: "HTTP/1.1 at a fixed rate, 32 connections",
        load: Load::Rate { connections: 32 },
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
        let unknown = select("h2c").err().unwrap_or_default();
        assert!(unknown.contains("h2-multiplexed"), "{unknown}");
        Ok(())
    }
}
