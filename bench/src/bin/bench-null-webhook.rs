//! A mutating webhook that admits every pod unchanged, as fast as it can:
//! the baseline `make bench-scale` puts beside the operator's webhook.
//!
//! On a machine where the API server, etcd, kwok, the control plane and the
//! operator share two cores, a webhook call costs the API server far more
//! than the handler's own time (the operator answers in about a millisecond
//! at p50; the API server timed the same calls at a mean of 145 ms in a
//! 20,000-pod storm). This webhook does the least any webhook must do
//! (TLS, HTTP/2 or HTTP/1.1, read the review, answer its uid), built in
//! release like the operator, so the difference between the two is what
//! kubegrace itself adds, and what is left is what any webhook costs here.
//!
//! Prints one JSON line on stdout, `{"port": N, "ca_pem": "..."}` (a CA made
//! for this run; the serving certificate is for 127.0.0.1), then serves until
//! killed.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kubegrace_bench::null_webhook::answer;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The API server's own limit on an admission review's size.
const MAX_BODY: usize = 3 * 1024 * 1024;

#[derive(Parser, Debug)]
#[command(about = "a webhook that admits every pod unchanged: the bench's baseline")]
struct Args {
    /// Where to listen (port 0: any free port, printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

/// A CA and a serving certificate for 127.0.0.1 it signed: (CA PEM, TLS
/// config).
fn tls() -> anyhow::Result<(String, rustls::ServerConfig)> {
    // Distinct names: a leaf whose issuer equals its subject reads as
    // self-signed, and TLS clients then refuse it.
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "kubegrace-bench-null-webhook-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])?;
    leaf.distinguished_name
        .push(DnType::CommonName, "kubegrace-bench-null-webhook");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &ca)?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(cert.der().to_vec())],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )?;
    // As the operator's server: HTTP/2 where the API server offers it.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((ca.pem(), config))
}

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let (status, body) = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(body) => answer(&body.to_bytes()),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Bytes::from(format!("reading the body: {e}")),
        ),
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (ca_pem, config) = tls()?;
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let port = listener.local_addr()?.port();
    println!("{}", serde_json::json!({"port": port, "ca_pem": ca_pem}));
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("accept: {e}");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(handle);
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}
