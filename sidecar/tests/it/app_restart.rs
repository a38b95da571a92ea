//! An app container restart inside a pod that stays must
//! not take the pod down for good, and loses nothing that can be saved.
//!
//! kubelet restarts an app container after a failed livenessProbe (running
//! its preStop, the injected `/drain?wait=true`, first), after a crash or
//! an OOM kill (no preStop). No SIGTERM reaches the sidecar in any of them.
//! Here the real sidecar binary fronts a real app that stops and starts
//! again on the same port:
//!
//! - preStop-style drain, app gone, app back: the sidecar serves again on the
//!   same address (two `SO_REUSEPORT` workers), `/ready` 200 within about a
//!   second of the app listening, the resume logged and counted;
//! - the same restart under keep-alive load through a lagging balancer with
//!   two pods: 0 failed requests; the same restart of a bare app: > 0;
//! - a crash (no preStop): requests that arrive while the app is down are
//!   held and answered once it is back, while `/ready` says 503; sent
//!   straight to the app's port they are refused (baseline);
//! - a hold that runs out: 503 with `Retry-After`, never a reset;
//! - `/drain` with the app staying up (maintenance): stays drained;
//! - SIGTERM wins: after a resume it still drains in-flight work and exits 0,
//!   and a SIGTERM that came before the app returned is never undone;
//! - `/ready` never waits for an app that is starting; the background
//!   connect (every 50 ms while it is down) turns it 200 within a blink;
//! - the sidecar's own restart (kubelet restarting a native
//!   sidecar): a new process on the same ports comes back ready and serves,
//!   after a SIGKILL with connections open and after a clean SIGTERM exit.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::balancer::Balancer;
use crate::kit::http::{finished_ok, spawn_get};
use crate::kit::http::{get, request};
use crate::kit::load::{Load, LoadSpec};
use crate::kit::pod::{Pod, pre_stop};
use crate::kit::sidecar::drain_flags;
use crate::kit::sidecar::{BIN, Sidecar, SidecarSpec};
use crate::kit::{free_port, wait_for, within};
use anyhow::{Context, Result, bail, ensure};
use http::{Method, StatusCode};

/// How long the app's port stays closed between the old process and the
/// new one. kubelet takes a second or more; shorter is the harder case.
const RESTART_GAP: Duration = Duration::from_millis(400);

const DRAIN: &[&str] = &drain_flags("300ms", "200ms", "3s", "5s");

/// The app process dies (its listener and every connection go at once) and,
/// `gap` later, a new one listens on the same port.
async fn restart_app(app: &mut TestApp, gap: Duration) -> Result<Instant> {
    let (name, addr) = (app.name.clone(), app.addr);
    app.kill().await;
    tokio::time::sleep(gap).await;
    *app = TestApp::start_on(&name, addr).await?;
    Ok(Instant::now())
}

async fn refused(addr: SocketAddr) -> bool {
    matches!(
        tokio::net::TcpStream::connect(addr).await,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// The kubelet's first readiness probe usually arrives before the app
/// listens. `/ready` gives the app a moment (under the probe's 1 s timeout)
/// instead of failing at once, which would cost every new pod a probe
/// period; an app that stays away still gets 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_turns_200_soon_after_an_app_starts_without_a_probe_waiting() -> Result<()> {
    let _serial = crate::kit::timing_sensitive().await;
    let addr = free_port()?;
    let sidecar = Sidecar::start_unready(SidecarSpec::new(addr)).await?;
    ensure!(
        sidecar.ready_status().await == Some(StatusCode::SERVICE_UNAVAILABLE),
        "no app listens: /ready must fail"
    );
    // /ready answers from state (admin.rs): it never waits for the app.
    // The background connect looks every 50 ms while the app is down, so
    // the pod turns ready within a blink of the app listening.
    let app = TestApp::start_on("a", addr).await?;
    sidecar.wait_ready_status(StatusCode::OK).await?;
    ensure!(
        get(sidecar.listen, "/work").await?.status == StatusCode::OK,
        "served through the sidecar"
    );
    drop(app);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prestop_drain_then_an_app_restart_serves_again_on_the_same_address() -> Result<()> {
    let _serial = crate::kit::timing_sensitive().await;
    let mut app = TestApp::start("a").await?;
    let mut args = DRAIN.to_vec();
    args.extend(["--workers", "2"]);
    let mut sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(&args)).await?;
    let listen = sidecar.listen;

    // kubelet kills the app for a failed liveness probe: preStop first.
    let hook = pre_stop(sidecar.admin, WAIT).await;
    ensure!(
        matches!(&hook, Ok(r) if r.status == StatusCode::OK),
        "preStop: {hook:?}"
    );
    ensure!(
        sidecar.ready_status().await == Some(StatusCode::SERVICE_UNAVAILABLE),
        "drained but ready"
    );
    ensure!(
        refused(listen).await,
        "drained: the listener must refuse, as after any drain"
    );
    // Then SIGTERM to the app, which exits, and kubelet starts it again.
    let back = restart_app(&mut app, RESTART_GAP).await?;
    let ready_after = wait_for("the sidecar ready again", WAIT, || async {
        (sidecar.ready_status().await == Some(StatusCode::OK)).then(|| back.elapsed())
    })
    .await
    .with_context(|| sidecar.logs_text())?;
    println!("app restart after preStop: ready again {ready_after:?} after the app listened");
    ensure!(
        ready_after < Duration::from_secs(2),
        "ready only {ready_after:?} after the app was back"
    );
    // The same address, every worker: a few fresh connections all served.
    for i in 0..8 {
        let r = get(listen, "/work")
            .await
            .with_context(|| format!("request {i}"))?;
        ensure!(r.status == StatusCode::OK, "request {i}: {}", r.status);
        ensure!(!r.connection_close(), "serving again, not draining");
    }
    ensure!(sidecar.metric_sum("kubegrace_drain_resumes_total").await? == 1.0);
    ensure!(sidecar.metric_sum("kubegrace_drain_phase").await? == 0.0);
    sidecar.wait_log("serving again", WAIT).await?;
    let upstreams = sidecar.admin_get("/upstreams").await?.text();
    ensure!(upstreams.contains("\"drainResumes\": 1"), "{upstreams}");
    Ok(())
}

/// Two pods behind a lagging balancer under keep-alive load; pod `a`'s app
/// restarts the way kubelet restarts it after a failed liveness probe
/// (preStop, then the process dies, then a new one). Returns (failed, sent).
async fn liveness_restart_under_load(sidecar: Option<&[&str]>) -> Result<(usize, u64, String)> {
    let balancer = Balancer::new(Duration::from_millis(300));
    let (mut a, b) = Pod::pair(&balancer, sidecar).await?;
    let load = Load::start(balancer.clone(), LoadSpec::churning(250, 10));
    load.wait_more(200, WAIT).await?;
    if let Some(s) = &a.sidecar {
        let hook = pre_stop(s.admin, WAIT).await;
        ensure!(
            matches!(&hook, Ok(r) if r.status == StatusCode::OK),
            "preStop: {hook:?}"
        );
    }
    restart_app(&mut a.app, RESTART_GAP).await?;
    // a serves again and takes its share.
    balancer.wait_routable("a", true, WAIT).await?;
    let served_before = a.app.served();
    load.wait_more(300, WAIT).await?;
    let report = load.stop().await?;
    ensure!(
        a.app.served() > served_before,
        "pod a never got traffic again after its restart: {}",
        report.summary()
    );
    let logs = a
        .sidecar
        .as_ref()
        .map(|s| s.logs_text())
        .unwrap_or_default();
    println!("{}", report.summary());
    if report.failed() > 0 {
        println!("{}", report.failure_details());
    }
    drop(b);
    Ok((report.failed(), report.sent, logs))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_restart_under_load_loses_nothing_and_a_bare_app_restart_does() -> Result<()> {
    let _serial = crate::kit::timing_sensitive().await;
    let (base_failed, base_sent, _) = liveness_restart_under_load(None).await?;
    let (failed, sent, logs) = liveness_restart_under_load(Some(DRAIN)).await?;
    println!(
        "app restart under load: without kubegrace {base_failed} of {base_sent} failed; with kubegrace {failed} of {sent}"
    );
    ensure!(
        base_failed > 0,
        "the baseline lost nothing, so this scenario proves nothing"
    );
    ensure!(
        failed == 0,
        "{failed} of {sent} requests failed across the app restart; sidecar logs:\n{logs}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_arriving_while_the_app_is_down_are_held_and_sent_when_it_is_back() -> Result<()> {
    let _serial = crate::kit::timing_sensitive().await;
    let mut app = TestApp::start("a").await?;
    let mut sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(DRAIN)).await?;
    let (listen, app_addr) = (sidecar.listen, app.addr);
    // Warm keep-alive pool, then the app crashes: no preStop, no drain.
    get(listen, "/work").await?;
    app.kill().await;

    // Baseline: the same requests straight to the app's port are refused.
    let mut bare_refused = 0;
    for _ in 0..5 {
        if request(app_addr, Method::GET, "/work", &[], Duration::from_secs(2))
            .await
            .is_err()
        {
            bare_refused += 1;
        }
    }
    ensure!(bare_refused == 5, "the app's own port answered while down");

    let sent: u32 = 12;
    let requests: Vec<_> = (0..sent)
        .map(|_| tokio::spawn(async move { get(listen, "/work").await }))
        .collect();
    wait_for("the sidecar to hold them", WAIT, || async {
        let held = sidecar
            .metrics()
            .await
            .ok()?
            .sum("kubegrace_held_requests")?;
        (held >= f64::from(sent)).then_some(())
    })
    .await
    .with_context(|| sidecar.logs_text())?;
    ensure!(
        sidecar.ready_status().await == Some(StatusCode::SERVICE_UNAVAILABLE),
        "the app is down: the pod must be unready so routers move away"
    );
    ensure!(sidecar.metric_sum("kubegrace_app_up").await? == 0.0);

    tokio::time::sleep(Duration::from_millis(600)).await;
    app = TestApp::start_on("a", app_addr).await?;
    for (i, r) in requests.into_iter().enumerate() {
        let r = within("a held request", WAIT, r).await???;
        ensure!(
            r.status == StatusCode::OK && r.text().starts_with("ok a"),
            "held request {i}: {} {}",
            r.status,
            r.text()
        );
    }
    ensure!(app.served() >= u64::from(sent));
    let m = sidecar.metrics().await?;
    let held_sent = m.counted_with("kubegrace_held_requests_total", "outcome=\"sent\"");
    ensure!(held_sent >= f64::from(sent), "held and sent: {held_sent}");
    ensure!(m.sum("kubegrace_held_requests") == Some(0.0));
    wait_for("ready again", WAIT, || async {
        (sidecar.ready_status().await == Some(StatusCode::OK)).then_some(())
    })
    .await?;
    ensure!(
        sidecar.metric_sum("kubegrace_drain_resumes_total").await? == 0.0,
        "no drain happened, nothing to resume"
    );
    sidecar.wait_log("requests were held for it", WAIT).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_that_runs_out_is_answered_503_with_retry_after() -> Result<()> {
    let app = TestApp::start("a").await?;
    let mut args = DRAIN.to_vec();
    args.extend(["--upstream-hold-timeout", "700ms"]);
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(&args)).await?;
    app.kill().await;
    let t0 = Instant::now();
    let r = get(sidecar.listen, "/work").await?;
    let waited = t0.elapsed();
    ensure!(
        r.status == StatusCode::SERVICE_UNAVAILABLE,
        "{} {}",
        r.status,
        r.text()
    );
    ensure!(
        r.headers.get(http::header::RETRY_AFTER).is_some(),
        "no Retry-After: {:?}",
        r.headers
    );
    ensure!(
        waited >= Duration::from_millis(700),
        "answered after {waited:?}"
    );
    let m = sidecar.metrics().await?;
    ensure!(
        m.with_label("kubegrace_held_requests_total", "outcome=\"expired\"") == Some(1.0),
        "{m:?}"
    );
    // The connection survived the 503: keep-alive, not a reset.
    ensure!(!r.connection_close());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_with_the_app_staying_up_stays_drained() -> Result<()> {
    let (app, sidecar) = Sidecar::with_app(DRAIN).await?;
    let hook = pre_stop(sidecar.admin, WAIT).await;
    ensure!(
        matches!(&hook, Ok(r) if r.status == StatusCode::OK),
        "{hook:?}"
    );
    // Long past every probe: the app was never gone, so nothing resumes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ensure!(sidecar.ready_status().await == Some(StatusCode::SERVICE_UNAVAILABLE));
    ensure!(
        refused(sidecar.listen).await,
        "a maintenance drain reopened"
    );
    ensure!(sidecar.metric_sum("kubegrace_drain_phase").await? == 3.0);
    ensure!(sidecar.metric_sum("kubegrace_drain_resumes_total").await? == 0.0);
    // The app really was reachable all along (the watch probed it).
    ensure!(sidecar.metric_sum("kubegrace_app_up").await? == 1.0);
    ensure!(get(app.addr, "/work").await?.status == StatusCode::OK);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_after_a_resume_still_drains_and_exits() -> Result<()> {
    let mut app = TestApp::start("a").await?;
    let mut sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(DRAIN)).await?;
    let listen = sidecar.listen;
    pre_stop(sidecar.admin, WAIT)
        .await
        .map_err(anyhow::Error::msg)?;
    restart_app(&mut app, RESTART_GAP).await?;
    wait_for("resumed", WAIT, || async {
        (sidecar.ready_status().await == Some(StatusCode::OK)).then_some(())
    })
    .await?;
    // Now the pod really goes: in-flight work finishes, the process exits 0.
    let work = spawn_get(listen, "/work?ms=1200", Duration::from_secs(10));
    wait_for("the work in flight", WAIT, || async {
        (app.inflight() >= 1).then_some(())
    })
    .await?;
    sidecar.signal("TERM")?;
    finished_ok(work).await?;
    sidecar.exits_cleanly().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_before_the_app_returns_is_never_undone() -> Result<()> {
    // Native sidecar, pod deleted: preStop, the app exits, then the sidecar's
    // SIGTERM. Even if something listens on the app port again, it exits.
    let mut app = TestApp::start("a").await?;
    let mut sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(DRAIN)).await?;
    pre_stop(sidecar.admin, WAIT)
        .await
        .map_err(anyhow::Error::msg)?;
    let addr = app.addr;
    app.kill().await;
    sidecar
        .wait_metric("kubegrace_app_up", WAIT, |v| v == 0.0)
        .await?;
    sidecar.signal("TERM")?;
    app = TestApp::start_on("a", addr).await?;
    sidecar.exits_cleanly().await?;
    ensure!(
        !sidecar.logs_text().contains("serving again"),
        "resumed after SIGTERM:\n{}",
        sidecar.logs_text()
    );
    drop(app);
    Ok(())
}

/// A sidecar process on fixed ports, the way kubelet restarts the container
/// (same args, same ports).
struct Fixed {
    child: tokio::process::Child,
    listen: SocketAddr,
    admin: SocketAddr,
}

impl Fixed {
    async fn start(upstream: SocketAddr, listen: SocketAddr, admin: SocketAddr) -> Result<Fixed> {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(["--listen", &listen.to_string()])
            .args(["--upstream", &upstream.to_string()])
            .args(["--admin", &admin.to_string()])
            .args(DRAIN)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        for (key, _) in std::env::vars() {
            if key.starts_with("KUBEGRACE_") {
                cmd.env_remove(key);
            }
        }
        let mut child = cmd.spawn().context("spawn the sidecar")?;
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("the restarted sidecar exited at start: {status}");
            }
            if let Ok(r) = request(admin, Method::GET, "/ready", &[], Duration::from_secs(2)).await
                && r.status == StatusCode::OK
            {
                return Ok(Fixed {
                    child,
                    listen,
                    admin,
                });
            }
            ensure!(
                Instant::now() < deadline,
                "the restarted sidecar never got ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecars_own_restart_comes_back_ready_and_serves() -> Result<()> {
    let app = TestApp::start("a").await?;
    let (listen, admin) = (free_port()?, free_port()?);

    // 1. Killed (SIGKILL: OOM, or a liveness failure past its grace) with
    // keep-alive clients connected.
    let mut first = Fixed::start(app.addr, listen, admin).await?;
    let mut clients = Vec::new();
    for _ in 0..4 {
        let tcp = tokio::net::TcpStream::connect(listen).await?;
        clients.push(tcp);
    }
    ensure!(get(listen, "/work").await?.status == StatusCode::OK);
    first.child.start_kill()?;
    first.child.wait().await?;
    drop(clients);
    let second = Fixed::start(app.addr, listen, admin).await?;
    let r = get(second.listen, "/work").await?;
    ensure!(r.status == StatusCode::OK, "after SIGKILL: {}", r.status);

    // 2. A clean exit (SIGTERM, drained) and a restart on the same ports,
    // with the server side of the closed connections in TIME_WAIT.
    let mut second = second;
    let status = std::process::Command::new("kill")
        .args(["-s", "TERM", &second.child.id().context("pid")?.to_string()])
        .status()?;
    ensure!(status.success());
    let exit = within("the drained exit", WAIT, second.child.wait()).await??;
    ensure!(exit.success(), "exit {exit}");
    let third = Fixed::start(app.addr, listen, admin).await?;
    let r = get(third.listen, "/work").await?;
    ensure!(r.status == StatusCode::OK, "after SIGTERM: {}", r.status);
    let ready = request(third.admin, Method::GET, "/ready", &[], WAIT).await?;
    ensure!(ready.status == StatusCode::OK);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_resume_the_pods_deletion_drains_and_exits_in_both_sidecar_modes() -> Result<()> {
    use crate::kit::pod::Termination;
    // An app restart is the same in both modes (only the app container
    // restarts); what differs is the pod's deletion afterwards: classic
    // sidecars get SIGTERM together with the app's preStop, native ones last.
    for how in [Termination::RegularContainers, Termination::NativeSidecar] {
        let mut pod = Pod::start("a", Some(DRAIN)).await?;
        let admin = pod.sidecar.as_ref().context("sidecar")?.admin;
        pre_stop(admin, WAIT).await.map_err(anyhow::Error::msg)?;
        restart_app(&mut pod.app, RESTART_GAP).await?;
        let sidecar = pod.sidecar.as_ref().context("sidecar")?;
        wait_for("resumed", WAIT, || async {
            (sidecar.ready_status().await == Some(StatusCode::OK)).then_some(())
        })
        .await
        .with_context(|| format!("{how:?}"))?;
        ensure!(get(sidecar.listen, "/work").await?.status == StatusCode::OK);
        let done = pod.terminate(how, WAIT, WAIT).await?;
        ensure!(done.pre_stop_ok(), "{how:?}: preStop {:?}", done.pre_stop);
        ensure!(
            done.sidecar_exit.is_some_and(|s| s.success()),
            "{how:?}: sidecar exit {:?}",
            done.sidecar_exit
        );
    }
    Ok(())
}
