//! The webhook's HTTPS server against a real TLS client on loopback: the
//! limits of `kubegrace_operator::server` hold (oversized body 413,
//! malformed review 400 with a message, slow body 408, slow head and idle
//! connections closed, connection cap), and the server keeps answering
//! afterwards. No cluster: nothing here reaches the API (the client points
//! at a closed loopback port), which is the point: a refused request never
//! gets as far as a lookup.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kubegrace_operator::admin::Metrics;
use kubegrace_operator::certs::{self, CertResolver};
use kubegrace_operator::server::{self, Limits};
use kubegrace_operator::webhook::{self, SidecarSettings, Webhook};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

struct Server {
    addr: std::net::SocketAddr,
    connector: TlsConnector,
    metrics: Arc<Metrics>,
    _stop: tokio::sync::watch::Sender<bool>,
}

async fn start(limits: Limits) -> Server {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sans = certs::service_sans("kubegrace-webhook", "t", &["127.0.0.1".into()]);
    let now = time::OffsetDateTime::now_utc();
    let (ca, ca_key, ca_after) = certs::new_ca(&sans, now).expect("ca");
    let (cert, key, _) = certs::issue_leaf(&sans, &ca, &ca_key, ca_after, now).expect("leaf");
    let resolver = Arc::new(CertResolver::default());
    resolver.set(certs::certified_key(cert.as_bytes(), key.as_bytes()).expect("key"));

    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.expect("pem")).expect("root");
    }
    let mut tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = TlsConnector::from(Arc::new(tls));

    // A client for a port nothing listens on: any API call would fail.
    let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
    let client = kube::Client::try_from(config).expect("client");
    let metrics = Arc::new(Metrics::default());
    let hook = Arc::new(Webhook {
        client,
        metrics: metrics.clone(),
        settings: SidecarSettings {
            image: "sidecar:test".into(),
            pull_policy: "IfNotPresent".into(),
            resources: webhook::resources("", "", "", ""),
            log_level: None,
            run_as_user: Some(65532),
            native: true,
            ports: kubegrace_operator::inject::Ports::default(),
        },
        cache: Default::default(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(server::serve_on(listener, resolver, hook, limits, rx));
    Server {
        addr,
        connector,
        metrics,
        _stop: tx,
    }
}

fn limits() -> Limits {
    Limits {
        max_connections: 4,
        max_in_flight: 4,
        read_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(2),
        max_body: server::MAX_BODY,
        watch_namespaces: vec!["shop".into()],
    }
}

impl Server {
    async fn connect(&self) -> TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.addr).await.expect("connect");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        self.connector
            .connect(name, tcp)
            .await
            .expect("TLS handshake verifies against the name-constrained CA")
    }

    fn rejected(&self, reason: &str) -> u64 {
        let text = self.metrics.render();
        let line = format!("kubegrace_operator_webhook_rejected_total{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {line} in\n{text}"))
    }
}

/// Reads until the server closes or `limit` passes; returns what came.
async fn read_all(s: &mut TlsStream<TcpStream>, limit: Duration) -> (String, bool) {
    let mut buf = Vec::new();
    // Ok: the read ended (EOF or reset) within the limit, i.e. the server closed.
    let closed = tokio::time::timeout(limit, s.read_to_end(&mut buf))
        .await
        .is_ok();
    (String::from_utf8_lossy(&buf).into_owned(), closed)
}

fn status(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn review(ns: &str) -> String {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": ns,
            "operation": "CREATE",
            "userInfo": {"username": "someone"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "p", "namespace": ns},
                       "spec": {"containers": [{"name": "a", "image": "a"}]}}
        }
    })
    .to_string()
}

async fn post(s: &Server, path: &str, body: &str) -> String {
    let mut c = s.connect().await;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.expect("write");
    read_all(&mut c, Duration::from_secs(10)).await.0
}

#[tokio::test]
async fn malformed_reviews_get_400_with_a_reason_and_never_reach_the_api() {
    let s = start(limits()).await;
    for (path, body, want) in [
        ("/mutate", "{not json", "not an AdmissionReview"),
        (
            "/mutate",
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            "no usable request",
        ),
        ("/validate", &review("shop"), "reviews graceroutes"),
        // Another namespace's workloads are not the caller's to ask about.
        ("/mutate", &review("bank"), "not served"),
    ] {
        let answer = post(&s, path, body).await;
        assert_eq!(status(&answer), 400, "{path} {body}: {answer}");
        assert!(answer.contains(want), "{want:?} not in {answer}");
    }
    // A review with the wrong content type is refused too.
    let mut c = s.connect().await;
    let body = review("shop");
    c.write_all(
        format!(
            "POST /mutate HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let (answer, _) = read_all(&mut c, Duration::from_secs(10)).await;
    assert_eq!(status(&answer), 400, "{answer}");
    assert_eq!(s.rejected("malformed"), 5);
    // The well-formed review for the served namespace gets through the
    // checks: it is answered 200 (the lookup fails, the pod is admitted
    // unchanged with a warning), proving the checks above were the refusal.
    let answer = post(&s, "/mutate", &review("shop")).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(answer.contains("\"allowed\":true"), "{answer}");
}

#[tokio::test]
async fn an_oversized_body_is_refused_declared_or_streamed() {
    let s = start(limits()).await;
    // Declared: refused before a byte of the body is read.
    let mut c = s.connect().await;
    c.write_all(
        format!(
            "POST /mutate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            server::MAX_BODY + 1
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let (answer, _) = read_all(&mut c, Duration::from_secs(5)).await;
    assert_eq!(status(&answer), 413, "{answer}");
    // Chunked, no length: cut once the limit is passed.
    let mut c = s.connect().await;
    c.write_all(
        b"POST /mutate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .await
    .expect("write");
    let chunk = vec![b'x'; 256 * 1024];
    let mut sent = 0;
    let started = Instant::now();
    while sent <= server::MAX_BODY + chunk.len() && started.elapsed() < Duration::from_secs(20) {
        let head = format!("{:x}\r\n", chunk.len());
        if c.write_all(head.as_bytes()).await.is_err()
            || c.write_all(&chunk).await.is_err()
            || c.write_all(b"\r\n").await.is_err()
        {
            break; // the server stopped reading: fine, look at the answer
        }
        sent += chunk.len();
    }
    let (answer, _) = read_all(&mut c, Duration::from_secs(5)).await;
    assert_eq!(status(&answer), 413, "after {sent} bytes: {answer}");
    assert_eq!(s.rejected("too_large"), 2);
}

#[tokio::test]
async fn a_slow_body_gets_408_and_a_slow_or_idle_connection_is_closed() {
    let s = start(limits()).await;
    // Body trickled one byte every 300 ms: 408 after the 1 s read timeout.
    let mut c = s.connect().await;
    c.write_all(
        b"POST /mutate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
    )
    .await
    .expect("write");
    let started = Instant::now();
    let (mut rd, mut wr) = tokio::io::split(c);
    let trickle = tokio::spawn(async move {
        for _ in 0..30 {
            if wr.write_all(b"x").await.is_err() || wr.flush().await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(8), rd.read(&mut buf))
        .await
        .expect("answered before the trickle ended")
        .expect("read");
    let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert_eq!(status(&answer), 408, "{answer}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "not before the read timeout"
    );
    trickle.abort();
    assert_eq!(s.rejected("read_timeout"), 1);

    // A head that never completes: closed (hyper's header read timeout).
    let mut c = s.connect().await;
    c.write_all(b"POST /mutate HTTP/1.1\r\nHost: t\r\n")
        .await
        .expect("write");
    let started = Instant::now();
    let (_, closed) = read_all(&mut c, Duration::from_secs(8)).await;
    assert!(closed, "a half-sent head must be cut");
    assert!(started.elapsed() >= Duration::from_millis(900));

    // A connection that sends nothing after the handshake: closed too.
    let mut c = s.connect().await;
    let (_, closed) = read_all(&mut c, Duration::from_secs(8)).await;
    assert!(closed, "an idle connection must be cut");
}

#[tokio::test]
async fn past_the_connection_cap_new_connections_are_closed_at_once_and_served_again_later() {
    let s = start(limits()).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(s.connect().await);
    }
    // Give the accept loop time to take the permits.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let tcp = TcpStream::connect(s.addr)
        .await
        .expect("tcp connect still works");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let refused = tokio::time::timeout(Duration::from_secs(5), s.connector.connect(name, tcp))
        .await
        .expect("refused quickly, not left hanging");
    assert!(refused.is_err(), "the fifth connection must be closed");
    assert_eq!(s.rejected("connection_cap"), 1);
    drop(held);
    // Slots come back once those connections are gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let tcp = TcpStream::connect(s.addr).await.expect("connect");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        if s.connector.connect(name, tcp).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "slots never freed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
