//! The admin port defends itself: an exposed admin address needs a drain
//! token (or the explicit flag) or the start is refused, a tokenless admin
//! refuses what a browser can send, the preStop drain with the token gets
//! past the admin connection cap, and a socket hand-off that names one fd
//! twice is refused.

use std::time::Duration;

use anyhow::{Result, ensure};
use http::{Method, StatusCode};
use tokio::net::TcpStream;

use crate::kit::http::request;
use crate::kit::sidecar::{InProcess, Sidecar, run_env, run_to_exit};
use crate::kit::{WAIT, wait_for};

/// Exit status for anything the user must fix (BSD EX_USAGE).
const EX_USAGE: i32 = 64;

/// Starts the binary until its ready line, then kills it: did it start?
async fn starts(args: &[&str]) -> Result<String> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut sidecar = Sidecar::spawn_args(&args, &[])?;
    sidecar.wait_log("kubegrace-sidecar ready", WAIT).await
}

#[tokio::test]
async fn an_exposed_admin_port_needs_a_token_or_the_explicit_flag() -> Result<()> {
    let base = ["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"];
    let mut args = base.to_vec();
    args.extend(["--admin", "0.0.0.0:0"]);
    let (status, output) = run_env(&args, &[], WAIT).await?;
    let code = status.code();
    ensure!(
        code == Some(EX_USAGE),
        "exposed admin without a token: exit {code:?}\n{output}"
    );
    ensure!(
        output.contains("admin")
            && output.contains("--drain-token")
            && output.contains("--admin-insecure"),
        "the message does not say what to fix:\n{output}"
    );
    // The environment twin of the admin address is refused the same way.
    let (status, output) = run_env(&base, &[("KUBEGRACE_ADMIN", "0.0.0.0:0")], WAIT).await?;
    let code = status.code();
    ensure!(
        code == Some(EX_USAGE),
        "KUBEGRACE_ADMIN exposed: exit {code:?}\n{output}"
    );

    let mut with_token = args.clone();
    with_token.extend(["--drain-token", "t0ken"]);
    starts(&with_token).await?;
    let mut insecure = args.clone();
    insecure.push("--admin-insecure");
    starts(&insecure).await?;
    // The default admin address is loopback (the config in force shows it).
    let (code, output) = run_to_exit(&["--help"], WAIT).await?;
    ensure!(
        code.success() && output.contains("127.0.0.1:15180"),
        "{output}"
    );
    Ok(())
}

#[tokio::test]
async fn tokenless_admin_refuses_browsers_and_upgrades() -> Result<()> {
    let (_app, sidecar) = InProcess::with_app(&[]).await?;
    let limit = Duration::from_secs(10);
    let resp = request(sidecar.admin, Method::POST, "/upgrade", &[], limit).await?;
    resp.expect(StatusCode::FORBIDDEN, "tokenless /upgrade")?;
    ensure!(resp.text().contains("--drain-token"), "{}", resp.text());
    for headers in [
        &[
            ("Sec-Fetch-Site", "cross-site"),
            ("Sec-Fetch-Mode", "no-cors"),
        ][..],
        &[("Origin", "https://evil.example")][..],
        &[("Host", "rebound.evil.example:15020")][..],
    ] {
        for method in [Method::GET, Method::POST] {
            let resp = request(sidecar.admin, method.clone(), "/drain", headers, limit).await?;
            ensure!(
                resp.status == StatusCode::FORBIDDEN,
                "{method} /drain with {headers:?}: {}",
                resp.status
            );
        }
    }
    sidecar
        .expect_ready(StatusCode::OK, "a browser-made request drained the sidecar")
        .await?;
    // A plain client on loopback (curl, a script) still drains.
    let resp = request(sidecar.admin, Method::GET, "/drain", &[], limit).await?;
    resp.expect(StatusCode::ACCEPTED, "plain GET /drain")?;
    Ok(())
}

#[tokio::test]
async fn the_prestop_drain_with_the_token_works_past_the_admin_cap() -> Result<()> {
    let (_app, sidecar) =
        InProcess::with_app(&["--drain-token", "pod-token", "--admin-max-connections", "1"])
            .await?;
    let _idle_admin = TcpStream::connect(sidecar.admin).await?;
    let limit = Duration::from_secs(10);
    wait_for("the admin cap to be reached", WAIT, || async {
        let resp = request(sidecar.admin, Method::GET, "/config", &[], limit)
            .await
            .ok()?;
        (resp.status == StatusCode::SERVICE_UNAVAILABLE).then_some(())
    })
    .await?;
    // Without the token the preStop path is not let through...
    let resp = request(sidecar.admin, Method::GET, "/drain", &[], limit).await?;
    resp.expect(
        StatusCode::SERVICE_UNAVAILABLE,
        "tokenless /drain past the cap",
    )?;
    // ... with it, it is (the kubelet's preStop GET with the injected header).
    let resp = sidecar.drain_with_token(Method::GET, "pod-token").await?;
    resp.expect(StatusCode::ACCEPTED, "preStop /drain past the cap")?;
    ensure!(sidecar.ready_status().await == Some(StatusCode::SERVICE_UNAVAILABLE));
    Ok(())
}

#[tokio::test]
async fn server_starter_port_naming_one_fd_twice_is_refused() -> Result<()> {
    let args = ["--upstream", "127.0.0.1:9", "--admin", "127.0.0.1:0"];
    let (status, output) = run_env(
        &args,
        &[("SERVER_STARTER_PORT", "127.0.0.1:8080=7;127.0.0.1:15020=7")],
        WAIT,
    )
    .await?;
    let code = status.code();
    ensure!(code == Some(EX_USAGE), "exit {code:?}\n{output}");
    ensure!(output.contains("names fd 7 twice"), "{output}");
    Ok(())
}
