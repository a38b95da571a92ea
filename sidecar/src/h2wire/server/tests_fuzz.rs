//! Arbitrary frames after a valid handshake, some of them real requests:
//! the connection and the handles answer or refuse, never panic.

use std::future::poll_fn;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::super::frame::{self, Frame, FrameHeader, Settings};
use super::super::hpack::{Encoder, EncoderOptions, FieldRef};
use super::conn::PREFACE;
use super::tests::GET;
use super::tests_interop::echo;
use super::{Connection, ServerSettings};

/// One frame of the sequence: a request's HEADERS (valid block) or any
/// type, flags, small stream id and payload.
#[derive(Debug, Clone)]
enum Step {
    Request {
        stream: u32,
        end_stream: bool,
    },
    Raw {
        kind: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
    },
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    let request = (0u32..8, any::<bool>()).prop_map(|(s, end_stream)| Step::Request {
        stream: 2 * s + 1,
        end_stream,
    });
    let payload = proptest::collection::vec(any::<u8>(), 0..40);
    let raw = (0u8..11, any::<u8>(), 0u32..16, payload, any::<bool>()).prop_map(
        |(kind, flags, stream, payload, shaped)| {
            if shaped {
                well_shaped(kind, flags, stream, payload)
            } else {
                Step::Raw {
                    kind,
                    flags,
                    stream,
                    payload,
                }
            }
        },
    );
    prop_oneof![request, raw]
}

/// The length and stream id the frame type requires (§6), so the frame
/// gets past the shape checks to the state machine.
fn well_shaped(kind: u8, flags: u8, stream: u32, mut payload: Vec<u8>) -> Step {
    let (len, on_stream) = match kind {
        frame::PRIORITY => (Some(5), true),
        frame::RST_STREAM => (Some(4), true),
        frame::SETTINGS => (Some(payload.len() / 6 * 6), false),
        frame::PING => (Some(8), false),
        frame::GOAWAY => (Some(payload.len().max(8)), false),
        frame::WINDOW_UPDATE => (Some(4), stream % 2 == 1),
        _ => (None, true),
    };
    if let Some(len) = len {
        payload.resize(len, 0);
    }
    // No padding or priority flags: their fields would be random bytes.
    let flags = flags & !(frame::FLAG_PADDED | frame::FLAG_PRIORITY);
    let stream = if on_stream { stream | 1 } else { 0 };
    Step::Raw {
        kind,
        flags,
        stream,
        payload,
    }
}

fn wire(steps: &[Step]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    Frame::Settings {
        ack: false,
        settings: Settings::default(),
    }
    .write(&mut out);
    let mut enc = Encoder::new(4096, EncoderOptions::default());
    for s in steps {
        match s {
            Step::Request { stream, end_stream } => {
                let mut block = Vec::new();
                enc.encode(
                    GET.iter()
                        .map(|(n, v)| FieldRef::new(n.as_bytes(), v.as_bytes())),
                    &mut block,
                );
                frame::write_header_block(*stream, *end_stream, &block, 16 << 10, &mut out);
            }
            Step::Raw {
                kind,
                flags,
                stream,
                payload,
            } => {
                let len = payload.len() as u32;
                FrameHeader {
                    len,
                    kind: *kind,
                    flags: *flags,
                    stream: *stream,
                }
                .write(&mut out);
                out.extend_from_slice(payload);
            }
        }
    }
    out
}

/// Serves `bytes` to the end; panics if the connection or a handler did.
fn run(bytes: Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let (client, server_io) = tokio::io::duplex(64 << 10);
        let server = tokio::spawn(async move {
            let mut conn = Connection::new(server_io, ServerSettings::default());
            let mut handlers = Vec::new();
            while let Some(Ok((req, respond))) = poll_fn(|cx| conn.poll_accept(cx)).await {
                handlers.push(tokio::spawn(echo(req, respond)));
                let _ = conn.heap_bytes() + usize::from(conn.all_ends_written());
            }
            for h in handlers {
                assert!(!h.await.is_err_and(|e| e.is_panic()), "a handler panicked");
            }
        });
        let (mut rd, mut wr) = tokio::io::split(client);
        let writer = async {
            // The server may stop reading (a connection error): then the
            // rest is not taken, which is fine.
            let _ = tokio::time::timeout(Duration::from_secs(2), wr.write_all(&bytes)).await;
            let _ = wr.shutdown().await;
        };
        let reader = async {
            let mut sink = vec![0u8; 16 << 10];
            let quiet = Duration::from_millis(300);
            while let Ok(Ok(n)) = tokio::time::timeout(quiet, rd.read(&mut sink)).await {
                if n == 0 {
                    break;
                }
            }
        };
        tokio::join!(writer, reader);
        drop((rd, wr));
        let ended = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("server ends");
        assert!(
            !ended.is_err_and(|e| e.is_panic()),
            "the connection panicked"
        );
    });
}

proptest::proptest! {
    #![proptest_config(crate::testing::fuzz_config(256))]

    #[test]
    fn arbitrary_frames_never_panic(steps in proptest::collection::vec(step(), 0..24)) {
        run(wire(&steps));
    }
}
