//! A real load balancer in front of the demo app ([`Balancer`]): HAProxy (Debian's, a host
//! process) finds the pods through DNS SRV records of a headless Service, answered by
//! CoreDNS (built from the Go module proxy by `e2e/balancer/build-coredns`, a host process
//! with its `kubernetes` plugin on the local cluster), and sends to the pod IPs directly,
//! as ingress controllers and cloud balancers in IP-target mode do. It learns of a
//! terminating pod only when its record has been gone from the answers for `hold obsolete`
//! (`e2e/balancer/haproxy.cfg.in`): the lag kubegrace's grace phase must cover.
//!
//! Both processes listen on loopback ports only and are killed when the [`Balancer`] is
//! dropped; their configs and logs stay in `target/e2e-balancer/<namespace>/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use tokio::process::{Child, Command};

use super::status::short;
use super::{Patience, Progress, RunResult, Scenario};
use crate::load::{self, Summary};
use crate::{free_ports, http_get, kubeconfig_path, repo_path};

/// How long HAProxy keeps sending to a pod after its SRV record left CoreDNS's answers
/// (`hold obsolete`): the balancer's lag. The route's `maxDelay` must outlast it
/// ([`BALANCER_MAX_DELAY_S`]), or the grace phase ends while the balancer still sends.
pub const HOLD_OBSOLETE_S: u64 = 10;

/// The route's `drain.maxDelay` behind the balancer: the lag ([`HOLD_OBSOLETE_S`]) plus
/// HAProxy's query interval (1s) plus room for a busy node's EndpointSlice update, so the
/// evidence (no new connection for `quiet`) ends the grace phase, not this ceiling.
pub const BALANCER_MAX_DELAY_S: u64 = 30;

const _: () = assert!(BALANCER_MAX_DELAY_S >= 2 * HOLD_OBSOLETE_S);

/// Bound of a cold CoreDNS build (module downloads included; measured at about two
/// minutes on two cores).
const BUILD_TIMEOUT: Duration = Duration::from_secs(900);

/// The headless Service in front of Deployment `name` (the balancer's discovery source).
pub fn headless_name(name: &str) -> String {
    format!("{name}-pods")
}

/// Headless Service `<name>-pods` on Deployment `name`'s pods, port `http` targeting the
/// pods' port `http` (the sidecar's, where the webhook injected one), so its SRV records
/// carry the port a balancer must send to.
pub fn headless_service(name: &str) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": headless_name(name)},
        "spec": {"clusterIP": "None", "selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))?)
}

/// HAProxy and CoreDNS, running, with a frontend a Deployment.
pub struct Balancer {
    /// `127.0.0.1:<port>` of the frontend of each Deployment the balancer fronts.
    frontends: BTreeMap<String, String>,
    /// Configs and logs of both processes.
    pub dir: PathBuf,
    // Killed on drop (`kill_on_drop`); held for that.
    _coredns: Child,
    haproxy: Child,
}

impl Balancer {
    /// Builds CoreDNS if it is not cached, creates the headless Services of `with` and
    /// `without` in `sc`'s namespace, starts CoreDNS and HAProxy on loopback and returns
    /// once CoreDNS has synced. Fronts nothing reachable until [`Balancer::wait_serving`].
    pub async fn start(sc: &Scenario, with: &str, without: &str, p: &Progress) -> Result<Self> {
        let coredns_bin = build_coredns(p).await?;
        let services: Api<Service> = Api::namespaced(sc.client.clone(), &sc.namespace);
        for name in [with, without] {
            services
                .create(&PostParams::default(), &headless_service(name)?)
                .await
                .with_context(|| format!("creating Service {}", headless_name(name)))?;
        }
        p.step(format!(
            "headless Services {} and {}",
            headless_name(with),
            headless_name(without)
        ));
        let dir = repo_path(&format!("target/e2e-balancer/{}", sc.namespace));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let kubeconfig = kubeconfig_path().context("no kubeconfig for CoreDNS")?;
        let [dns_port, ready_port, with_port, without_port] = free_ports::<4>()?;

        let corefile = render(
            "Corefile.in",
            &[
                ("DNS_PORT", dns_port.to_string()),
                ("READY_PORT", ready_port.to_string()),
                ("KUBECONFIG", kubeconfig.display().to_string()),
            ],
        )?;
        let corefile_path = dir.join("Corefile");
        std::fs::write(&corefile_path, corefile)?;
        let mut coredns = spawn(
            Command::new(&coredns_bin)
                .arg("-conf")
                .arg(&corefile_path)
                .current_dir(&dir),
            &dir,
            "coredns",
        )?;
        p.step(format!(
            "CoreDNS on 127.0.0.1:{dns_port} (zone cluster.local, ready on :{ready_port})"
        ));
        let ready = format!("127.0.0.1:{ready_port}");
        wait_alive(
            &mut coredns,
            &dir.join("coredns.log"),
            "CoreDNS: kubernetes plugin synced (/ready 200)",
            Patience::new(Duration::from_secs(60), Duration::from_millis(250)),
            p,
            || async {
                match http_get(&ready, "/ready", Duration::from_secs(2)).await {
                    Ok((200, _)) => Ok(()),
                    Ok((status, body)) => Err(format!("{status} {}", body.trim())),
                    Err(e) => Err(format!("{e:#}")),
                }
            },
        )
        .await?;

        let srv = |name: &str| {
            format!(
                "_http._tcp.{}.{}.svc.cluster.local",
                headless_name(name),
                sc.namespace
            )
        };
        let cfg = render(
            "haproxy.cfg.in",
            &[
                ("DNS_PORT", dns_port.to_string()),
                ("HOLD_OBSOLETE", format!("{HOLD_OBSOLETE_S}s")),
                ("WITH_PORT", with_port.to_string()),
                ("WITH_SRV", srv(with)),
                ("WITHOUT_PORT", without_port.to_string()),
                ("WITHOUT_SRV", srv(without)),
            ],
        )?;
        let cfg_path = dir.join("haproxy.cfg");
        std::fs::write(&cfg_path, cfg)?;
        let check = Command::new(haproxy_bin())
            .arg("-c")
            .arg("-f")
            .arg(&cfg_path)
            .output()
            .await
            .context("running haproxy -c")?;
        ensure!(
            check.status.success(),
            "haproxy -c -f {}: {}",
            cfg_path.display(),
            String::from_utf8_lossy(&check.stderr)
        );
        // -db: foreground, one process, so the kill on drop ends it.
        let haproxy = spawn(
            Command::new(haproxy_bin())
                .arg("-db")
                .arg("-f")
                .arg(&cfg_path),
            &dir,
            "haproxy",
        )?;
        p.step(format!(
            "HAProxy: {with} on 127.0.0.1:{with_port}, {without} on 127.0.0.1:{without_port} \
             (SRV discovery, hold obsolete {HOLD_OBSOLETE_S}s; {})",
            dir.display()
        ));
        let frontends = BTreeMap::from([
            (with.to_owned(), format!("127.0.0.1:{with_port}")),
            (without.to_owned(), format!("127.0.0.1:{without_port}")),
        ]);
        Ok(Balancer {
            frontends,
            dir,
            _coredns: coredns,
            haproxy,
        })
    }

    /// The frontend (`127.0.0.1:<port>`) of Deployment `name`.
    pub fn frontend(&self, name: &str) -> Result<&str> {
        self.frontends
            .get(name)
            .map(String::as_str)
            .with_context(|| format!("the balancer does not front {name}"))
    }

    /// Waits until HAProxy's answers for `name` come from every live pod of it and from no
    /// other: HAProxy has resolved the current endpoints and checked them up.
    pub async fn wait_serving(&mut self, sc: &Scenario, name: &str, p: &Progress) -> Result<()> {
        let addr = self.frontend(name)?.to_owned();
        let log = self.dir.join("haproxy.log");
        wait_alive(
            &mut self.haproxy,
            &log,
            &format!("HAProxy: answers for {name} from each of its pods"),
            Patience::new(Duration::from_secs(90), Duration::from_millis(500)),
            p,
            || async {
                let want: BTreeSet<String> = sc
                    .pod_names(name)
                    .await
                    .map_err(|e| format!("{e:#}"))?
                    .into_iter()
                    .filter(|(_, terminating)| !terminating)
                    .map(|(pod, _)| pod)
                    .collect();
                let mut seen = BTreeSet::new();
                // Round robin: twice the pods' number of answers reaches each of them.
                for _ in 0..want.len() * 2 {
                    match http_get(&addr, "/", Duration::from_secs(2)).await {
                        Ok((200, body)) => {
                            if let Some(pod) = body.strip_prefix("pod=") {
                                seen.insert(pod.split_whitespace().next().unwrap_or("").to_owned());
                            }
                        }
                        Ok((status, body)) => return Err(format!("{status} {}", body.trim())),
                        Err(e) => return Err(format!("{e:#}")),
                    }
                }
                if seen == want {
                    Ok(())
                } else {
                    Err(format!("answers from {seen:?}, pods {want:?}"))
                }
            },
        )
        .await
    }
}

/// How long after its deletion started a replaced pod still answered through the balancer.
#[derive(Clone, Debug, PartialEq)]
pub struct LateServing {
    /// Requests sent after the pod was seen terminating that it answered.
    pub requests: u64,
    /// From the pod seen terminating to the last request it answered, in seconds (the
    /// balancer's lag as the load saw it; 0 when it answered none).
    pub last_s: f64,
}

/// What a rollout through the balancer measured: the run, and per replaced pod how long the
/// balancer kept it in use.
#[derive(Clone, Debug)]
pub struct BalancedRun {
    pub run: RunResult,
    pub late: BTreeMap<String, LateServing>,
}

impl BalancedRun {
    /// The most requests and the longest time a replaced pod answered after its deletion.
    pub fn late_max(&self) -> (u64, f64) {
        self.late.values().fold((0, 0.0_f64), |(n, s), l| {
            (n.max(l.requests), s.max(l.last_s))
        })
    }
}

impl Scenario {
    /// Runs the load on `balancer`'s frontend of `name` from this process (bounded by
    /// `opts.load`), restarts the Deployment's pod template after the lead-in, waits until
    /// it is rolled out and the old pods are gone, then stops the load.
    pub async fn roll_through_balancer(
        &self,
        balancer: &Balancer,
        name: &str,
        p: &Progress,
    ) -> Result<BalancedRun> {
        let before = self.pod_names(name).await?;
        let addr = balancer.frontend(name)?;
        let cfg = self.load_config(format!("http://{addr}"));
        p.step(self.load_line(name, &format!("HAProxy {addr}")));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            load::run_outcomes_until(&cfg, async {
                let _ = stop_rx.await;
            })
            .await
        });
        let acted = self
            .act_and_wait(name, super::Action::Restart, &before, p)
            .await;
        let _ = stop_tx.send(());
        let (outcomes, summary): (Vec<load::Outcome>, Summary) =
            task.await.context("load task")?.context("load generator")?;
        let acted = acted?;
        let mut late = BTreeMap::new();
        for pod in before.keys() {
            let label = format!("{} terminating", short(pod));
            let Some(at) = acted
                .events
                .iter()
                .find(|(_, l)| *l == label)
                .map(|(at, _)| *at)
            else {
                continue;
            };
            late.insert(pod.clone(), late_serving(&outcomes, &summary, pod, at));
        }
        let run = RunResult {
            summary,
            rollout_s: acted.rollout_s,
            rollout_at_unix_s: acted.at_unix_s,
            events: acted.events,
            load_from: format!("this host through HAProxy {addr}"),
            operator_pods_killed: acted.killed,
        };
        p.step(format!("{name}: {}", run.describe()));
        Ok(BalancedRun { run, late })
    }
}

/// The requests pod `pod` answered that were sent after `terminating_at` (UNIX seconds).
fn late_serving(
    outcomes: &[load::Outcome],
    summary: &Summary,
    pod: &str,
    terminating_at: f64,
) -> LateServing {
    let since_ms = (terminating_at - summary.started_at_unix_s) * 1000.0;
    let late: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.reason == load::Reason::Ok && o.pod.as_deref() == Some(pod))
        .filter(|o| o.t_ms >= since_ms)
        .map(|o| o.t_ms)
        .collect();
    LateServing {
        requests: late.len() as u64,
        last_s: late
            .iter()
            .fold(0.0_f64, |m, t| m.max((t - since_ms) / 1000.0)),
    }
}

fn haproxy_bin() -> PathBuf {
    std::env::var_os("KUBEGRACE_HAPROXY")
        .map_or_else(|| PathBuf::from("/usr/sbin/haproxy"), PathBuf::from)
}

/// `e2e/balancer/<template>` with each `@NAME@` replaced; fails when one is left.
fn render(template: &str, values: &[(&str, String)]) -> Result<String> {
    let path = repo_path(&format!("e2e/balancer/{template}"));
    let mut text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    for (name, value) in values {
        text = text.replace(&format!("@{name}@"), value);
    }
    if let Some(left) = unfilled(&text) {
        bail!("{template}: placeholder @{left}@ left unfilled");
    }
    Ok(text)
}

/// The first `@NAME@` (capitals and underscores) in `text`.
fn unfilled(text: &str) -> Option<&str> {
    text.split('@')
        .skip(1)
        .step_by(2)
        .find(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
}

/// Starts `cmd` with its output in `<dir>/<name>.log`, killed when the [`Child`] drops.
fn spawn(cmd: &mut Command, dir: &Path, name: &str) -> Result<Child> {
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {name}"))
}

/// [`Progress::wait`] on `probe`, failing at once (with the log's tail) when `child` exits.
async fn wait_alive<Fut>(
    child: &mut Child,
    log: &Path,
    what: &str,
    patience: Patience,
    p: &Progress,
    mut probe: impl FnMut() -> Fut,
) -> Result<()>
where
    Fut: std::future::Future<Output = std::result::Result<(), String>>,
{
    let exited = std::cell::Cell::new(None);
    let waited = p
        .wait(what, patience, || {
            let status = child.try_wait().ok().flatten();
            let fut = probe();
            let exited = &exited;
            async move {
                if let Some(s) = status {
                    // The wait stops here; the exit is reported below.
                    exited.set(Some(s));
                    return Ok(());
                }
                fut.await
            }
        })
        .await;
    if let Some(status) = exited.get() {
        bail!("{what}: the process exited ({status}); {}", log_tail(log));
    }
    waited.with_context(|| log_tail(log))
}

/// The last lines of a log, for an error message.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(15)..].join("\n");
    format!("last lines of {}:\n{tail}", log.display())
}

/// `e2e/balancer/build-coredns` (a no-op when the binary is cached): the binary's path.
async fn build_coredns(p: &Progress) -> Result<PathBuf> {
    let script = repo_path("e2e/balancer/build-coredns");
    p.step(format!(
        "{} (cached after the first build)",
        script.display()
    ));
    let out = tokio::time::timeout(
        BUILD_TIMEOUT,
        Command::new(&script)
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("{} took longer than {BUILD_TIMEOUT:?}", script.display()))?
    .with_context(|| format!("running {}", script.display()))?;
    ensure!(out.status.success(), "{} failed", script.display());
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    ensure!(!path.is_empty(), "{} printed no path", script.display());
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_with_every_placeholder_filled() -> Result<()> {
        let owned = |pairs: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
            pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
        };
        let core_values = owned(&[
            ("DNS_PORT", "1053"),
            ("READY_PORT", "1054"),
            ("KUBECONFIG", "/k"),
        ]);
        let core = render("Corefile.in", &core_values)?;
        assert!(core.contains("cluster.local:1053 {"), "{core}");
        assert!(core.contains("bind 127.0.0.1"), "{core}");
        let cfg = render(
            "haproxy.cfg.in",
            &[
                ("DNS_PORT", "1053".into()),
                ("HOLD_OBSOLETE", "10s".into()),
                ("WITH_PORT", "1".into()),
                ("WITH_SRV", "_http._tcp.a".into()),
                ("WITHOUT_PORT", "2".into()),
                ("WITHOUT_SRV", "_http._tcp.b".into()),
            ],
        )?;
        assert!(cfg.contains("hold obsolete 10s"), "{cfg}");
        assert!(cfg.contains("server-template pod 10 _http._tcp.b"), "{cfg}");
        // Every listener on loopback.
        for bind in cfg.lines().filter(|l| l.trim_start().starts_with("bind ")) {
            assert!(bind.contains("127.0.0.1:"), "{bind}");
        }
        Ok(())
    }

    #[test]
    fn a_missing_value_is_an_error() {
        match render("Corefile.in", &[("DNS_PORT", "1053".into())]) {
            Ok(text) => panic!("rendered with placeholders left: {text}"),
            Err(e) => assert!(e.to_string().contains("@READY_PORT@"), "{e}"),
        }
    }

    #[test]
    fn late_serving_counts_answers_after_the_deletion() {
        let at = |t_ms: f64, pod: &str, reason: load::Reason| load::Outcome {
            seq: 0,
            kind: "http1".into(),
            t_ms,
            latency_ms: 1.0,
            reason,
            detail: String::new(),
            pod: Some(pod.into()),
        };
        let summary = Summary {
            started_at_unix_s: 100.0,
            ..Summary::default()
        };
        let outcomes = [
            at(500.0, "a", load::Reason::Ok),
            at(2500.0, "a", load::Reason::Ok),
            at(4000.0, "a", load::Reason::Ok),
            at(4500.0, "a", load::Reason::Reset),
            at(4800.0, "b", load::Reason::Ok),
        ];
        // Terminating at 102.0: 2,000 ms into the run.
        let late = late_serving(&outcomes, &summary, "a", 102.0);
        assert_eq!(late.requests, 2);
        assert!((late.last_s - 2.0).abs() < 1e-9, "{late:?}");
        let none = late_serving(&outcomes, &summary, "c", 102.0);
        assert_eq!(
            none,
            LateServing {
                requests: 0,
                last_s: 0.0
            }
        );
    }
}
