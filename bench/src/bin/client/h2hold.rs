//! `bench-client h2-hold`: what idle HTTP/2 connections and open HTTP/2
//! streams cost a proxy (bench/README.md, "HTTP/2 memory").
//!
//! Opens `connections` h2c prior-knowledge connections, each with its
//! SETTINGS exchange and `requests` requests answered (one by default),
//! then idle; and `streams` requests to the upstream's `/slow/<ms>`,
//! spread evenly over `stream_connections` more connections, left waiting
//! for their answers.
//! Prints `ready` once the proxy has read every frame (a PING answered
//! after them on each connection), then holds everything open until stdin
//! closes or `hold_seconds` pass, and exits.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use hyper::Request;
use tokio::io::AsyncBufReadExt as _;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// Bounds on what one client may be asked to open: far above what the
/// bench asks (2,000 connections, 1,000 streams) and below what one process
/// can hold open under the machine's open-files limit.
pub const MAX_CONNECTIONS: u32 = 20_000;
pub const MAX_STREAMS: u32 = 100_000;
/// Requests an idle connection makes before it goes quiet.
pub const MAX_REQUESTS: u32 = 10_000;
/// Connections are opened this many at a time: thousands of SYNs at once
/// overflow small accept backlogs and turn into one-second SYN retries.
const OPEN_BATCH: u32 = 50;

/// What `h2-hold` is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub target: SocketAddr,
    pub connections: u32,
    /// Requests each idle connection makes, one after another.
    pub requests: u32,
    pub streams: u32,
    pub stream_connections: u32,
    pub slow_ms: u64,
    /// The longest opening everything may take.
    pub open_timeout: Duration,
    /// The longest everything is held once `ready` is printed.
    pub hold: Duration,
}

impl Plan {
    /// Refuses a plan past the bounds, so a mistyped count cannot exhaust
    /// the machine's descriptors.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.connections > MAX_CONNECTIONS || self.stream_connections > MAX_CONNECTIONS {
            bail!("at most {MAX_CONNECTIONS} connections");
        }
        if self.requests == 0 || self.requests > MAX_REQUESTS {
            bail!("an idle connection makes 1 to {MAX_REQUESTS} requests");
        }
        if self.streams > MAX_STREAMS {
            bail!("at most {MAX_STREAMS} streams");
        }
        if self.streams > 0 && self.stream_connections == 0 {
            bail!("streams need at least one connection to run on");
        }
        Ok(())
    }

    /// The connections to open for the streams: none without streams (an
    /// empty one would be one more idle connection, and count as one).
    pub fn connections_for_streams(&self) -> u32 {
        if self.streams == 0 {
            0
        } else {
            self.stream_connections
        }
    }

    /// How many of the `streams` connection `i` carries: an even split,
    /// the first ones taking one more when it does not divide.
    pub fn streams_on(&self, i: u32) -> u32 {
        if self.stream_connections == 0 {
            return 0;
        }
        let (each, extra) = (
            self.streams / self.stream_connections,
            self.streams % self.stream_connections,
        );
        each + u32::from(i < extra)
    }
}

/// One open connection and what must stay alive to keep it and its
/// streams open (dropping a response future resets its stream).
struct Held {
    _send: SendRequest<Bytes>,
    _waiting: Vec<ResponseFuture>,
    _conn: tokio::task::JoinHandle<()>,
}

pub async fn run(plan: Plan) -> anyhow::Result<()> {
    plan.check()?;
    let opening = async {
        let mut held = open_all(&plan, plan.connections, |_| 0).await?;
        let carrying = plan.connections_for_streams();
        held.extend(open_all(&plan, carrying, |i| plan.streams_on(i)).await?);
        anyhow::Ok(held)
    };
    let held = tokio::time::timeout(plan.open_timeout, opening)
        .await
        .with_context(|| {
            format!(
                "not everything opened within {:?} (does the proxy allow {} streams per connection?)",
                plan.open_timeout,
                plan.streams_on(0)
            )
        })??;
    println!("ready");
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    tokio::select! {
        _ = stdin.next_line() => {}
        () = tokio::time::sleep(plan.hold) => {}
    }
    drop(held);
    Ok(())
}

/// Opens `count` connections, `OPEN_BATCH` at a time; connection `i`
/// carries `streams(i)` slow requests, or, when that is 0, one request
/// answered and then nothing.
async fn open_all(
    plan: &Plan,
    count: u32,
    streams: impl Fn(u32) -> u32,
) -> anyhow::Result<Vec<Held>> {
    let mut held = Vec::with_capacity(count as usize);
    let mut next = 0;
    while next < count {
        let mut batch = JoinSet::new();
        for i in next..count.min(next.saturating_add(OPEN_BATCH)) {
            batch.spawn(open_one(*plan, streams(i)));
        }
        next = next.saturating_add(OPEN_BATCH);
        while let Some(opened) = batch.join_next().await {
            held.push(opened??);
        }
    }
    Ok(held)
}

async fn open_one(plan: Plan, streams: u32) -> anyhow::Result<Held> {
    let tcp = TcpStream::connect(plan.target)
        .await
        .with_context(|| format!("connecting to {}", plan.target))?;
    tcp.set_nodelay(true)?;
    let (send, mut conn) = h2::client::handshake(tcp).await?;
    let mut ping = conn.ping_pong().context("the connection's ping handle")?;
    let conn = tokio::spawn(async move {
        // Ends when the proxy or our exit closes the connection.
        let _ = conn.await;
    });
    let mut send = send.ready().await?;
    let mut waiting = Vec::new();
    if streams == 0 {
        // Whole exchanges: settings both ways, streams opened and closed.
        for _ in 0..plan.requests {
            send = send.ready().await?;
            let (response, _) = send.send_request(get(&plan, "/")?, true)?;
            let response = response.await?;
            if !response.status().is_success() {
                bail!("answered {}", response.status());
            }
            let mut body = response.into_body();
            while let Some(chunk) = body.data().await {
                let chunk = chunk?;
                let _ = body.flow_control().release_capacity(chunk.len());
            }
        }
    } else {
        let path = format!("/slow/{}", plan.slow_ms);
        for _ in 0..streams {
            // Waits while the proxy's concurrent-stream limit is reached.
            send = send.ready().await?;
            let (response, _) = send.send_request(get(&plan, &path)?, true)?;
            waiting.push(response);
        }
    }
    // Answered only after the proxy has read every frame sent before it.
    ping.ping(h2::Ping::opaque()).await?;
    Ok(Held {
        _send: send,
        _waiting: waiting,
        _conn: conn,
    })
}

fn get(plan: &Plan, path: &str) -> anyhow::Result<Request<()>> {
    Ok(Request::get(format!("http://{}{path}", plan.target)).body(())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(streams: u32, stream_connections: u32) -> Plan {
        Plan {
            target: SocketAddr::from(([127, 0, 0, 1], 1)),
            connections: 0,
            requests: 1,
            streams,
            stream_connections,
            slow_ms: 1000,
            open_timeout: Duration::from_secs(1),
            hold: Duration::from_secs(1),
        }
    }

    #[test]
    fn streams_are_split_evenly_and_bounded() {
        let p = plan(1003, 10);
        let split: Vec<u32> = (0..10).map(|i| p.streams_on(i)).collect();
        assert_eq!(split.iter().sum::<u32>(), 1003);
        assert_eq!(&split[..4], &[101, 101, 101, 100]);
        assert!(plan(MAX_STREAMS, 10).check().is_ok());
        assert!(plan(MAX_STREAMS + 1, 10).check().is_err());
        assert!(plan(10, 0).check().is_err(), "streams need a connection");
        assert!(plan(10, MAX_CONNECTIONS + 1).check().is_err());
        assert!(
            Plan {
                requests: 0,
                ..plan(0, 0)
            }
            .check()
            .is_err()
        );
        assert!(
            Plan {
                requests: MAX_REQUESTS + 1,
                ..plan(0, 0)
            }
            .check()
            .is_err()
        );
        assert_eq!(plan(10, 0).streams_on(0), 0);
        // Idle connections only: no connection opened for streams.
        assert_eq!(plan(0, 10).connections_for_streams(), 0);
        assert_eq!(plan(5, 10).connections_for_streams(), 10);
    }
}
