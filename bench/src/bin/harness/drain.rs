//! The drain tests: a fresh proxy per round, idle keep-alive connections or
//! slow requests held open, the project's documented graceful stop, and the
//! time from that command to the process exit.

use std::io::{BufRead as _, BufReader, Write as _};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kubegrace_bench::peers::{DrainTimers, Peer};
use kubegrace_bench::proc::spawn_piped;
use kubegrace_bench::report::DrainResult;
use kubegrace_bench::stats::Spread;

use super::Harness;

/// Every drain test on every live peer that has one.
pub(crate) fn run(h: &Harness, live: &[Peer]) -> Vec<DrainResult> {
    let mut drain = Vec::new();
    let mut subjects: Vec<(Peer, DrainTimers, String)> = Vec::new();
    for &peer in live {
        match peer {
            Peer::Kubegrace => {
                subjects.push((
                    peer,
                    DrainTimers::Zero,
                    "kubegrace (drain timers 0s)".into(),
                ));
                subjects.push((
                    peer,
                    DrainTimers::Defaults,
                    "kubegrace (default drain timers)".into(),
                ));
            }
            Peer::Nginx | Peer::Haproxy | Peer::Caddy => {
                subjects.push((peer, DrainTimers::Defaults, peer.name().into()));
            }
            // The same nginx but for accepting: its drain is nginx's.
            Peer::Direct | Peer::KubegraceCb | Peer::NginxDeferred => {}
        }
    }
    for idle in [true, false] {
        let test = if idle {
            format!("{} idle keep-alive", h.args.drain_idle)
        } else {
            format!("{} slow in flight", h.args.drain_slow)
        };
        for (peer, timers, label) in &subjects {
            let mut rounds = Vec::new();
            for round in 0..h.args.rounds {
                match h.drain_round(*peer, *timers, label, idle) {
                    Ok(r) => {
                        h.progress(&format!(
                            "drain {}/{} {test:<22} {label:<34} exit {}  closed {} ok {} failed {}",
                            round + 1,
                            h.args.rounds,
                            r.exit_ms
                                .map_or("did not exit".into(), |m| format!("{m:.0} ms")),
                            r.closed_by_proxy,
                            r.ok,
                            r.failed
                        ));
                        rounds.push(r);
                    }
                    Err(e) => h.progress(&format!("drain {test} {label}: failed: {e:#}")),
                }
            }
            if rounds.is_empty() {
                continue;
            }
            let how = format!("{:?}", h.env.graceful_stop(*peer, 0))
                .replace('"', "")
                .replace(&h.env.dir.display().to_string(), "$TMP");
            let how = match peer {
                Peer::Nginx => "nginx -s quit".to_string(),
                Peer::Haproxy => "kill -USR1 (soft stop)".to_string(),
                _ if how.contains("TERM") => "kill -TERM".to_string(),
                _ => how,
            };
            drain.push(DrainResult {
                test: test.clone(),
                peer: label.clone(),
                how,
                exit_ms: Spread::of(&rounds.iter().filter_map(|r| r.exit_ms).collect::<Vec<_>>()),
                timed_out: rounds.iter().filter(|r| r.exit_ms.is_none()).count() as u32,
                rounds: rounds.len() as u32,
                closed_by_proxy: kubegrace_bench::stats::median_u32(
                    rounds.iter().map(|r| r.closed_by_proxy).collect(),
                ),
                ok: kubegrace_bench::stats::median_u32(rounds.iter().map(|r| r.ok).collect()),
                failed: kubegrace_bench::stats::median_u32(
                    rounds.iter().map(|r| r.failed).collect(),
                ),
                connections: rounds.first().map_or(0, |r| r.connections),
            });
        }
    }
    drain
}

impl Harness {
    /// One drain round: a fresh proxy, connections or slow requests held
    /// open, the documented stop command, time to exit.
    fn drain_round(
        &self,
        peer: Peer,
        timers: DrainTimers,
        label: &str,
        idle: bool,
    ) -> anyhow::Result<DrainRound> {
        let mut proc = self.start_peer(peer, timers, label)?;
        let port = self.env.port(peer);
        let mut client = self.pinned_load(self.bin("bench-client"));
        client
            .args(["drain", "--target", &format!("127.0.0.1:{port}")])
            .args([
                "--timeout-seconds",
                &self.args.drain_bound_seconds.to_string(),
            ]);
        if idle {
            client.args(["--idle", &self.args.drain_idle.to_string()]);
        } else {
            client
                .args(["--slow", &self.args.drain_slow.to_string()])
                .args(["--slow-ms", &self.args.drain_slow_ms.to_string()]);
        }
        let mut client = spawn_piped(&mut client)?;
        let mut lines = BufReader::new(client.stdout.take().context("stdout")?).lines();
        let ready = lines.next().transpose()?.unwrap_or_default();
        if ready.trim() != "ready" {
            let _ = client.kill();
            let _ = client.wait();
            bail!("drain client did not get ready: {ready:?}");
        }
        let mut stop = self.env.graceful_stop(peer, proc.pid());
        let start = Instant::now();
        let status = stop.status().context("running the stop command")?;
        if let Some(stdin) = client.stdin.as_mut() {
            let _ = writeln!(stdin, "go");
        }
        if !status.success() {
            bail!("stop command {stop:?} failed: {status}");
        }
        let bound = Duration::from_secs(self.args.drain_bound_seconds);
        let exit = proc
            .wait_exit(bound.saturating_sub(start.elapsed()))
            .map(|_| start.elapsed());
        drop(proc);
        let report = lines.next().transpose()?.unwrap_or_default();
        let _ = client.wait();
        let v: serde_json::Value = serde_json::from_str(report.trim())
            .with_context(|| format!("drain client said {report:?}"))?;
        let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0) as u32;
        Ok(DrainRound {
            exit_ms: exit.map(|d| d.as_secs_f64() * 1000.0),
            closed_by_proxy: n("closed_by_proxy"),
            ok: n("ok"),
            failed: n("failed"),
            connections: n("connections"),
        })
    }
}

struct DrainRound {
    exit_ms: Option<f64>,
    closed_by_proxy: u32,
    ok: u32,
    failed: u32,
    connections: u32,
}
