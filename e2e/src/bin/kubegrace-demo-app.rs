//! kubegrace-demo-app: a small, deliberately naive HTTP/1.1 app for the e2e tests and the demo.
//!
//! Endpoints:
//! - `GET /`                   200, `pod=<name>` (pod name from `POD_NAME`, else the host name)
//! - `GET /delay?ms=N`         answers after N milliseconds
//! - `GET /prestop[?hold_ms=N]` records that the preStop hook ran, answers after N ms
//! - `GET /prestop-seen`       200 `true` once `/prestop` was called, else 200 `false`
//! - `GET /healthz`            200
//!
//! Like a naive app it exits at once on SIGTERM (in-flight requests are cut), unless
//! `--on-sigterm ignore` is given, in which case only the grace-period SIGKILL stops it.
//! Lifecycle events are logged to stdout (`prestop hook ran`, `SIGTERM received`).
//!
//! `kubegrace-demo-app get http://IP:PORT/PATH` is a one-shot client for probes from inside
//! a cluster (the image has no shell or curl): it retries until a 2xx answer or `--timeout`,
//! prints the body and exits 0, else exits 1.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, Subcommand, ValueEnum};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OnSigterm {
    /// Exit immediately (status 0), like most apps that do nothing special.
    Exit,
    /// Log the signal and keep serving until SIGKILL.
    Ignore,
}

#[derive(Debug, Parser)]
#[command(version, about = "Naive demo HTTP app for kubegrace tests")]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "KUBEGRACE_DEMO_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// What to do on SIGTERM.
    #[arg(
        long,
        env = "KUBEGRACE_DEMO_ON_SIGTERM",
        value_enum,
        default_value = "exit"
    )]
    on_sigterm: OnSigterm,
    /// Name reported by `GET /` (defaults to the host name, which is the pod name).
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One-shot HTTP/1.1 GET (plain http, IP or /etc/hosts name): retry until 2xx, print the body.
    Get {
        /// e.g. http://10.96.0.12:80/
        url: hyper::Uri,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
}

struct State {
    pod_name: String,
    prestop_seen: AtomicBool,
}

const MAX_DELAY_MS: u64 = 600_000;

fn query_ms(req: &Request<Incoming>, key: &str) -> Result<u64, String> {
    let Some(query) = req.uri().query() else {
        return Ok(0);
    };
    for pair in query.split('&') {
        if let Some(value) = pair
            .strip_prefix(key)
            .and_then(|rest| rest.strip_prefix('='))
        {
            let ms: u64 = value
                .parse()
                .map_err(|_| format!("{key} must be a number of milliseconds"))?;
            return Ok(ms.min(MAX_DELAY_MS));
        }
    }
    Ok(0)
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n"));
    }
    let resp = match req.uri().path() {
        "/" => text(StatusCode::OK, format!("pod={}\n", state.pod_name)),
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/delay" => match query_ms(&req, "ms") {
            Ok(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                text(
                    StatusCode::OK,
                    format!("pod={} delayed_ms={ms}\n", state.pod_name),
                )
            }
            Err(e) => text(StatusCode::BAD_REQUEST, e + "\n"),
        },
        "/prestop" => match query_ms(&req, "hold_ms") {
            Ok(ms) => {
                state.prestop_seen.store(true, Ordering::SeqCst);
                println!("prestop hook ran (holding {ms} ms)");
                tokio::time::sleep(Duration::from_millis(ms)).await;
                text(StatusCode::OK, "prestop recorded\n")
            }
            Err(e) => text(StatusCode::BAD_REQUEST, e + "\n"),
        },
        "/prestop-seen" => text(
            StatusCode::OK,
            format!("{}\n", state.prestop_seen.load(Ordering::SeqCst)),
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    };
    Ok(resp)
}

async fn serve(listener: TcpListener, state: Arc<State>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                eprintln!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(state.clone(), req));
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                eprintln!("connection error: {e}");
            }
        });
    }
}

async fn get_once(url: &hyper::Uri) -> anyhow::Result<(StatusCode, Bytes)> {
    let authority = url
        .authority()
        .ok_or_else(|| anyhow::anyhow!("URL needs host:port"))?;
    anyhow::ensure!(url.scheme_str() == Some("http"), "only http:// URLs");
    let addr = format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(80)
    );
    let stream = tokio::net::TcpStream::connect(&addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let path = url.path_and_query().map_or("/", |p| p.as_str());
    let req = Request::get(path)
        .header(hyper::header::HOST, authority.as_str())
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    Ok((status, resp.into_body().collect().await?.to_bytes()))
}

async fn get(url: hyper::Uri, timeout: u64) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    loop {
        let attempt = tokio::time::timeout(Duration::from_secs(5), get_once(&url)).await;
        let failure = match attempt {
            Ok(Ok((status, body))) if status.is_success() => {
                print!("{}", String::from_utf8_lossy(&body));
                return Ok(());
            }
            Ok(Ok((status, _))) => format!("status {status}"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 5s".to_owned(),
        };
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("GET {url} failed for {timeout}s, last: {failure}");
        }
        eprintln!("GET {url}: {failure}; retrying");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::Get { url, timeout }) = args.command {
        return get(url, timeout).await;
    }
    let pod_name = args
        .pod_name
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let state = Arc::new(State {
        pod_name,
        prestop_seen: AtomicBool::new(false),
    });
    let listener = TcpListener::bind(args.listen).await?;
    println!(
        "kubegrace-demo-app listening on {} as {}",
        listener.local_addr()?,
        state.pod_name
    );

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let server = tokio::spawn(serve(listener, state));
    loop {
        tokio::select! {
            _ = sigterm.recv() => {
                println!("SIGTERM received");
                if args.on_sigterm == OnSigterm::Exit {
                    break;
                }
                println!("ignoring SIGTERM (--on-sigterm ignore)");
            }
            _ = sigint.recv() => {
                println!("SIGINT received");
                break;
            }
        }
    }
    server.abort();
    println!("exiting");
    Ok(())
}
