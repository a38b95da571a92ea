//! Against an implementation we did not write: the h2 crate (hyper's
//! HTTP/2) as the client and our frames and HPACK as the server, over an
//! in-memory pipe. Its encoder makes its own choices (what it indexes,
//! Huffman, never-indexed values, CONTINUATION at 16 KiB), and its decoder
//! must follow our dynamic table across responses, so this catches what
//! the RFC's examples cannot.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::frame::{self, DEFAULT_MAX_FRAME_SIZE, Frame, FrameHeader, HEADER_LEN, Settings};
use super::hpack::{Decoder, Encoder, EncoderOptions, FieldRef, HeaderBlock, Limits};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A header larger than one frame, so that blocks need CONTINUATION.
const BIG: usize = 20_000;
const LIST_LIMIT: u32 = 64 << 10;

/// One decoded request: (name, value, sensitive) per field.
type Fields = Vec<(String, String, bool)>;

/// Reads one frame, which must pass our checks.
async fn next_frame(io: &mut DuplexStream) -> Option<(FrameHeader, Vec<u8>)> {
    let mut head = [0u8; HEADER_LEN];
    io.read_exact(&mut head).await.ok()?;
    let header = FrameHeader::parse(&head);
    header
        .check(DEFAULT_MAX_FRAME_SIZE)
        .expect("h2's frame passes our checks");
    let mut payload = vec![0; header.len as usize];
    io.read_exact(&mut payload).await.expect("payload");
    Some((header, payload))
}

/// Our server: answers each request with a response of ours, the third
/// one with a header as large as the request's; returns the requests as
/// it decoded them, and how many came in more than one frame.
async fn serve(mut io: DuplexStream) -> (Vec<Fields>, usize) {
    let mut preface = [0u8; 24];
    io.read_exact(&mut preface).await.expect("preface");
    assert_eq!(preface, PREFACE);
    let mut out = Vec::new();
    let settings = Settings {
        max_header_list_size: Some(LIST_LIMIT),
        ..Settings::default()
    };
    Frame::Settings {
        ack: false,
        settings,
    }
    .write(&mut out);
    io.write_all(&out).await.expect("write");
    let limits = Limits {
        max_string_len: BIG,
        max_list_size: LIST_LIMIT as usize,
    };
    let mut decoder = Decoder::new(4096, limits);
    let mut encoder = Encoder::new(4096, EncoderOptions::default());
    let mut block = HeaderBlock::default();
    let mut requests = Vec::new();
    let mut continued = 0;
    while let Some((header, payload)) = next_frame(&mut io).await {
        let (stream, mut joined, mut end_headers) =
            match frame::parse(header, &payload).expect("parses") {
                Frame::Settings {
                    ack: false,
                    settings,
                } => {
                    if let Some(size) = settings.header_table_size {
                        encoder.set_peer_settings_size(size as usize);
                    }
                    out.clear();
                    Frame::Settings {
                        ack: true,
                        settings: Settings::default(),
                    }
                    .write(&mut out);
                    io.write_all(&out).await.expect("write");
                    continue;
                }
                Frame::Headers {
                    stream,
                    block,
                    end_headers,
                    ..
                } => (stream, block.to_vec(), end_headers),
                Frame::GoAway { .. } => break,
                _ => continue,
            };
        // §6.10: CONTINUATIONs of the same stream, nothing in between.
        continued += usize::from(!end_headers);
        while !end_headers {
            let (header, payload) = next_frame(&mut io).await.expect("continuation");
            match frame::parse(header, &payload).expect("parses") {
                Frame::Continuation {
                    stream: s,
                    end_headers: end,
                    block,
                } if s == stream => {
                    joined.extend_from_slice(block);
                    end_headers = end;
                }
                other => panic!("{other:?} inside a header block"),
            }
        }
        decoder
            .decode(&joined, &mut block)
            .expect("decodes h2's block");
        let fields: Fields = block
            .iter()
            .map(|f| (text(f.name), text(f.value), f.sensitive))
            .collect();
        // '~' has a 13-bit code: sent raw, so the block needs CONTINUATION.
        let big = vec![b'~'; if requests.len() == 2 { BIG } else { 10 }];
        let response = [
            FieldRef::new(b":status", b"200"),
            FieldRef::new(b"content-type", b"text/plain"),
            FieldRef::new(b"server", b"kubegrace-h2wire"),
            FieldRef::new(b"x-big", &big),
        ];
        let mut encoded = Vec::new();
        encoder.encode(response, &mut encoded);
        out.clear();
        frame::write_header_block(stream, false, &encoded, DEFAULT_MAX_FRAME_SIZE, &mut out);
        let body = format!("ok {}", requests.len());
        Frame::Data {
            stream,
            end_stream: true,
            data: body.as_bytes(),
            flow_len: 0,
        }
        .write(&mut out);
        io.write_all(&out).await.expect("write");
        requests.push(fields);
    }
    (requests, continued)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn h2_client_requests_decode_and_our_responses_reach_it() {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(serve(server_io));
    let (mut send, connection) = h2::client::handshake(client_io).await.expect("handshake");
    let connection = tokio::spawn(async move { connection.await.is_ok() });
    let big = "q".repeat(BIG);
    for n in 0..3 {
        let mut token = http::HeaderValue::from_static("Bearer secret-token");
        token.set_sensitive(true);
        let mut request = http::Request::builder()
            .method("POST")
            .uri("http://greeter.default.svc:50051/helloworld.Greeter/SayHello")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("x-n", n.to_string())
            .header("authorization", token);
        if n == 2 {
            request = request.header("x-big", big.as_str());
        }
        let request = request.body(()).expect("request");
        send = send.ready().await.expect("ready");
        let (response, _) = send.send_request(request, true).expect("send");
        let response = tokio::time::timeout(Duration::from_secs(5), response)
            .await
            .expect("answered in time")
            .expect("response");
        assert_eq!(response.status(), 200);
        let headers = response.headers();
        assert_eq!(headers["content-type"], "text/plain");
        assert_eq!(headers["server"], "kubegrace-h2wire");
        assert_eq!(headers["x-big"].len(), if n == 2 { BIG } else { 10 });
        let mut body = response.into_body();
        let data = body.data().await.expect("a data frame").expect("data");
        assert_eq!(&data[..], format!("ok {n}").as_bytes());
    }
    drop(send);
    let (requests, continued) = tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the client closed")
        .expect("server task");
    assert_eq!((requests.len(), continued), (3, 1));
    for (n, fields) in requests.iter().enumerate() {
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _, _)| k == name)
                .map(|(_, v, s)| (v.as_str(), *s))
        };
        assert_eq!(get(":method"), Some(("POST", false)));
        assert_eq!(get(":scheme"), Some(("http", false)));
        assert_eq!(
            get(":authority"),
            Some(("greeter.default.svc:50051", false))
        );
        assert_eq!(get(":path"), Some(("/helloworld.Greeter/SayHello", false)));
        assert_eq!(get("content-type"), Some(("application/grpc", false)));
        assert_eq!(get("te"), Some(("trailers", false)));
        assert_eq!(get("x-n"), Some((n.to_string().as_str(), false)));
        assert_eq!(get("authorization"), Some(("Bearer secret-token", true)));
        assert_eq!(get("x-big").map(|(v, _)| v.len()), (n == 2).then_some(BIG));
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), connection).await;
}
