//! Both binaries' `/metrics` as Prometheus reads them, on loopback: the
//! sidecar (the library's server, in-process, in front of the demo app) and
//! the operator's admin server (in-process; it needs no cluster).
//!
//! - the Content-Type Prometheus 3 requires;
//! - the text passes `promtool check metrics` (Debian's `prometheus`
//!   package: the real exposition parser, plus its naming lint);
//! - no metric family appears only after its first event: the families of a
//!   fresh process are all the families it shows after traffic, a drain, a
//!   reconcile, a webhook call and a pod drain;
//! - every metric the chart's Grafana dashboard queries is a family one of
//!   the two binaries really exports, so is every metric the chart's
//!   PrometheusRule alerts on, and the metric reference (docs/metrics.md)
//!   names every family.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

const T: Duration = Duration::from_secs(10);
use kubegrace_e2e::local_app::LocalApp;
use kubegrace_sidecar_api::exposition::CONTENT_TYPE;
const METRICS_DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../charts/kubegrace/templates/prometheusrule.yaml"
);
const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../charts/kubegrace/dashboards/kubegrace.json"
);

/// One HTTP/1.1 exchange on a fresh connection: (head, body).
async fn http(addr: SocketAddr, method: &str, path: &str) -> Result<(String, String)> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(
            // The admin port refuses a Host that is not an address (DNS rebinding).
            format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(T, exchange)
        .await
        .with_context(|| format!("{method} {path} on {addr} took over {T:?}"))??;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .with_context(|| format!("no end of head in {answer:?}"))?;
    Ok((head.to_string(), body.to_string()))
}

/// `/metrics`, checked for its Content-Type; the body (identity: both
/// servers answer a `Connection: close` request with a plain body).
async fn scrape(admin: SocketAddr) -> Result<String> {
    let (head, body) = http(admin, "GET", "/metrics").await?;
    ensure!(
        head.starts_with("HTTP/1.1 200"),
        "/metrics on {admin}: {head}"
    );
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .with_context(|| format!("no Content-Type from {admin}: {head}"))?;
    ensure!(
        content_type == CONTENT_TYPE,
        "Content-Type {content_type:?} from {admin}"
    );
    Ok(body)
}

/// `promtool check metrics`: parses the exposition text and lints the names.
async fn promtool_check(what: &str, text: &str) -> Result<()> {
    // The same search as charts/kubegrace/hack/lint: $PROMTOOL, the copy make deps
    // caches beside the cluster tools, then PATH.
    let cached = "/var/cache/kubegrace/bin/promtool";
    let promtool = std::env::var("PROMTOOL").unwrap_or_else(|_| {
        if std::path::Path::new(cached).exists() {
            cached.into()
        } else {
            "promtool".into()
        }
    });
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| {
            format!("running {promtool} (make deps fetches it; Debian package prometheus; or set PROMTOOL)")
        })?;
    let mut stdin = child.stdin.take().context("promtool stdin")?;
    stdin.write_all(text.as_bytes()).await?;
    drop(stdin);
    let out = tokio::time::timeout(T, child.wait_with_output())
        .await
        .context("promtool took too long")??;
    ensure!(
        out.status.success(),
        "promtool check metrics refused the {what}'s /metrics:\n{}{}\n--- text:\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// (name, type) of every family the text declares.
fn families(text: &str) -> BTreeSet<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect()
}

fn names(families: &BTreeSet<(String, String)>) -> BTreeSet<String> {
    families.iter().map(|(n, _)| n.clone()).collect()
}

/// Every family of `used` (a scrape after one of each event) must already be in `fresh`
/// (the scrape before any): a family that appears only with its first event leaves
/// dashboards and alerts blind until then. `who` names the binary.
fn ensure_none_late(who: &str, fresh: &str, used: &str) -> Result<()> {
    let late: Vec<_> = names(&families(used))
        .difference(&names(&families(fresh)))
        .cloned()
        .collect();
    ensure!(
        late.is_empty(),
        "{who} families that appeared only after their first event: {late:?}"
    );
    Ok(())
}

/// The demo app on a free loopback port, named metrics-0; killed when dropped.
async fn demo_app() -> Result<(LocalApp, SocketAddr)> {
    let app = LocalApp::start(env!("CARGO_BIN_EXE_kubegrace-demo-app"), "metrics-0", &[]).await?;
    let addr = app
        .addr
        .parse()
        .with_context(|| format!("the app's address {}", app.addr))?;
    Ok((app, addr))
}

/// A sidecar in front of the demo app, with one route that has a breaker (so
/// the per-route families are there); its admin address and the library's
/// handle.
async fn sidecar(app: SocketAddr, dir: &std::path::Path) -> Result<kubegrace_sidecar::Sidecar> {
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "routes:\n- name: api\n  match: {pathPrefix: /api}\n  circuitBreaker: {maxConcurrent: 8}\n",
    )?;
    let cli = kubegrace_sidecar::cli::Cli::try_parse_from([
        "kubegrace-sidecar",
        "--config",
        &config.display().to_string(),
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &app.to_string(),
        "--admin",
        "127.0.0.1:0",
    ])?;
    let settings = cli.settings();
    let startup = kubegrace_sidecar::cli::load_at_start(
        settings.config_file.as_deref(),
        &settings.overrides,
    )?;
    let options = kubegrace_sidecar::StartOptions {
        config_file: startup.config_file,
        ..Default::default()
    };
    Ok(kubegrace_sidecar::Sidecar::start(startup.config, settings, options).await?)
}

/// The operator's admin server on a free loopback port.
async fn operator_admin(
    metrics: Arc<kubegrace_operator::admin::Metrics>,
) -> Result<(SocketAddr, tokio::sync::oneshot::Sender<()>)> {
    let probe = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = probe.local_addr()?;
    drop(probe);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(kubegrace_operator::admin::serve(addr, metrics, async {
        let _ = stopped.await;
    }));
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok((addr, stop));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("the operator's admin port {addr} never listened")
}

/// Every `kubegrace_*` name in the dashboard's queries (panel targets and
/// template variables).
fn dashboard_metrics() -> Result<BTreeSet<String>> {
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(DASHBOARD).with_context(|| format!("reading {DASHBOARD}"))?,
    )
    .context("the dashboard is not JSON")?;
    let mut queries = Vec::new();
    collect_queries(&json, &mut queries);
    Ok(metric_names(queries.iter().map(String::as_str)))
}

/// Every `kubegrace_*` name in the `expr:` lines of the chart's
/// PrometheusRule template (plain PromQL: Helm templates only its labels).
fn alert_metrics() -> Result<BTreeSet<String>> {
    let template = std::fs::read_to_string(RULES).with_context(|| format!("reading {RULES}"))?;
    Ok(metric_names(
        template
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("expr:")),
    ))
}

fn metric_names<'a>(queries: impl Iterator<Item = &'a str>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for q in queries {
        let mut rest = q;
        while let Some(at) = rest.find("kubegrace_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            found.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    found
}

fn collect_queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "query", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => collect_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(list) => list.iter().for_each(|v| collect_queries(v, out)),
        _ => {}
    }
}

/// The metric names of `used` (a dashboard's, the alerts') that no family
/// of `exported` provides.
fn not_exported<'a>(
    used: &'a BTreeSet<String>,
    exported: &BTreeSet<(String, String)>,
) -> Vec<&'a String> {
    used.iter()
        .filter(|m| family_of(m, exported).is_none())
        .collect()
}

/// The metrics `file` (the dashboard, the alert rules) queries are at least `min` (fewer:
/// the file was not read as meant) and each one is exported.
fn ensure_only_exported(
    file: &str,
    queried: &BTreeSet<String>,
    min: usize,
    exported: &BTreeSet<(String, String)>,
) -> Result<()> {
    ensure!(
        queried.len() >= min,
        "{file} names only {queried:?}: is it the right file?"
    );
    let unknown = not_exported(queried, exported);
    ensure!(
        unknown.is_empty(),
        "{file} queries metrics no binary exports: {unknown:?}\nexported: {:?}",
        names(exported)
    );
    Ok(())
}

/// The family a sample name belongs to (`x_bucket` of histogram `x` is `x`).
fn family_of(name: &str, exported: &BTreeSet<(String, String)>) -> Option<String> {
    if exported.iter().any(|(n, _)| n == name) {
        return Some(name.to_string());
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        exported
            .iter()
            .any(|(n, t)| n == base && (t == "histogram" || t == "summary"))
            .then(|| base.to_string())
    })
}

#[tokio::test]
async fn both_binaries_metrics_parse_exist_from_the_start_and_feed_the_dashboard() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("kubegrace-metrics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;

    // The sidecar, fresh, then after a request through it and a drain.
    let (_app, app_addr) = demo_app().await?;
    let side = sidecar(app_addr, &dir).await?;
    let fresh = scrape(side.admin_addr()).await?;
    promtool_check("fresh sidecar", &fresh).await?;
    let (head, _) = http(side.listen_addr(), "GET", "/api/hello").await?;
    ensure!(
        head.starts_with("HTTP/1.1 200"),
        "through the sidecar: {head}"
    );
    let (head, _) = http(side.admin_addr(), "POST", "/drain").await?;
    ensure!(head.starts_with("HTTP/1.1 202"), "/drain: {head}");
    let used = scrape(side.admin_addr()).await?;
    promtool_check("sidecar after traffic and a drain", &used).await?;
    ensure!(
        // /api/hello matches the test config's route `api`.
        used.contains("kubegrace_requests_total{route=\"api\",code_class=\"2xx\"} 1\n"),
        "the request is not counted on its route:\n{used}"
    );
    ensure_none_late("sidecar", &fresh, &used)?;

    // The operator, fresh, then after one of each event it counts.
    let metrics = Arc::new(kubegrace_operator::admin::Metrics::default());
    let (op_admin, stop) = operator_admin(metrics.clone()).await?;
    let op_fresh = scrape(op_admin).await?;
    promtool_check("fresh operator", &op_fresh).await?;
    metrics.reconciled(Duration::from_millis(3), Some("kube"));
    metrics.webhook(Duration::from_millis(1), "injected");
    metrics.route_validation(Duration::from_millis(1), "allowed");
    metrics.webhook_rejected("busy");
    metrics.route_seen("shop/web");
    metrics.pod_drained("shop/web", false, 2);
    metrics.pods_not_injected("shop/web", 1);
    let op_used = scrape(op_admin).await?;
    promtool_check("operator after events", &op_used).await?;
    ensure!(
        op_used.contains(
            "kubegrace_operator_pod_drains_total{route=\"shop/web\",outcome=\"force_closed\"} 1\n"
        ) && op_used.contains("kubegrace_operator_requests_cut_total{route=\"shop/web\"} 2\n"),
        "the pod drain is not counted:\n{op_used}"
    );
    ensure_none_late("operator", &op_fresh, &op_used)?;
    let _ = stop.send(());

    // The dashboard asks only for what the two binaries export.
    let exported: BTreeSet<(String, String)> = families(&used)
        .union(&families(&op_used))
        .cloned()
        .collect();
    ensure_only_exported(DASHBOARD, &dashboard_metrics()?, 10, &exported)?;
    // The alerts, too.
    ensure_only_exported(RULES, &alert_metrics()?, 5, &exported)?;

    // The metric reference names every family the binaries export.
    let reference =
        std::fs::read_to_string(METRICS_DOC).with_context(|| format!("reading {METRICS_DOC}"))?;
    let undocumented: Vec<_> = names(&exported)
        .into_iter()
        .filter(|n| {
            !reference.contains(&format!("`{n}`")) && !reference.contains(&format!("`{n}{{"))
        })
        .collect();
    ensure!(
        undocumented.is_empty(),
        "exported families {METRICS_DOC} does not name: {undocumented:?}"
    );

    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
