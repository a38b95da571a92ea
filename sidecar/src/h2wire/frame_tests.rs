//! Frames: every type written and parsed back, and each RFC 9113 §4 and
//! §6 violation answered with its code and scope.

use super::ErrorCode;
use super::frame::*;

fn raw(len: u32, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    FrameHeader {
        len,
        kind,
        flags,
        stream,
    }
    .write(&mut out);
    out.extend_from_slice(payload);
    out
}

/// Checks the header against the default frame size, then parses.
fn read(wire: &[u8]) -> Result<Frame<'_>, FrameError> {
    let head: &[u8; HEADER_LEN] = wire[..HEADER_LEN].try_into().expect("9 octets");
    let header = FrameHeader::parse(head);
    header.check(DEFAULT_MAX_FRAME_SIZE)?;
    parse(header, &wire[HEADER_LEN..])
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    raw(payload.len() as u32, kind, flags, stream, payload)
}

fn err(wire: &[u8]) -> (ErrorCode, Scope) {
    let e = read(wire).expect_err("refused");
    (e.code, e.scope)
}

const CONN: Scope = Scope::Connection;

#[test]
fn every_frame_round_trips() {
    let priority = Priority {
        exclusive: true,
        dependency: 3,
        weight: 255,
    };
    let settings = Settings {
        header_table_size: Some(0),
        enable_push: Some(false),
        max_concurrent_streams: Some(100),
        initial_window_size: Some(MAX_WINDOW),
        max_frame_size: Some(MAX_FRAME_SIZE_LIMIT),
        max_header_list_size: Some(16 << 10),
        enable_connect_protocol: Some(true),
        no_rfc7540_priorities: Some(true),
    };
    let frames = [
        Frame::Data {
            stream: 1,
            end_stream: true,
            data: b"hello",
            flow_len: 5,
        },
        Frame::Data {
            stream: MAX_WINDOW,
            end_stream: false,
            data: b"",
            flow_len: 0,
        },
        Frame::Headers {
            stream: 5,
            end_stream: false,
            end_headers: true,
            priority: Some(priority),
            block: b"\x82\x86",
        },
        Frame::Headers {
            stream: 7,
            end_stream: true,
            end_headers: false,
            priority: None,
            block: b"",
        },
        Frame::Priority {
            stream: 9,
            priority,
        },
        Frame::RstStream {
            stream: 1,
            code: ErrorCode::CANCEL,
        },
        Frame::Settings {
            ack: false,
            settings,
        },
        Frame::Settings {
            ack: true,
            settings: Settings::default(),
        },
        Frame::Ping {
            ack: true,
            data: *b"12345678",
        },
        Frame::GoAway {
            last_stream: 41,
            code: ErrorCode(0xdead),
            debug: b"draining",
        },
        Frame::WindowUpdate {
            stream: 0,
            increment: MAX_WINDOW,
        },
        Frame::Continuation {
            stream: 5,
            end_headers: true,
            block: b"\x84",
        },
        Frame::Unknown {
            kind: 0xfa,
            stream: 3,
        },
    ];
    for f in frames {
        let mut wire = Vec::new();
        f.write(&mut wire);
        assert_eq!(read(&wire), Ok(f), "{wire:02x?}");
    }
}

#[test]
fn the_header_drops_the_reserved_bit_and_keeps_24_bit_lengths() {
    let wire = [0xff, 0xff, 0xff, 0x0, 0x1, 0x80, 0x0, 0x0, 0x3];
    let h = FrameHeader::parse(&wire);
    assert_eq!(
        (h.len, h.kind, h.flags, h.stream),
        (MAX_FRAME_SIZE_LIMIT, DATA, 1, 3)
    );
    let mut out = Vec::new();
    h.write(&mut out);
    assert_eq!(out, [0xff, 0xff, 0xff, 0x0, 0x1, 0x0, 0x0, 0x0, 0x3]);
}

#[test]
fn frame_size_is_checked_against_our_setting_at_the_limit_and_past_it() {
    let at = FrameHeader {
        len: DEFAULT_MAX_FRAME_SIZE,
        kind: DATA,
        flags: 0,
        stream: 1,
    };
    assert_eq!(at.check(DEFAULT_MAX_FRAME_SIZE), Ok(()));
    let past = FrameHeader {
        len: DEFAULT_MAX_FRAME_SIZE + 1,
        ..at
    };
    let e = past.check(DEFAULT_MAX_FRAME_SIZE).expect_err("too long");
    assert_eq!((e.code, e.scope), (ErrorCode::FRAME_SIZE_ERROR, CONN));
    assert_eq!(past.check(DEFAULT_MAX_FRAME_SIZE + 1), Ok(()));
    // A payload that is not what the header announced.
    let e = parse(at, &[0; 10]).expect_err("short");
    assert_eq!(e.code, ErrorCode::FRAME_SIZE_ERROR);
}

#[test]
fn stream_ids_follow_each_type() {
    for kind in [DATA, HEADERS, PRIORITY, RST_STREAM, CONTINUATION] {
        let len = match kind {
            PRIORITY => 5,
            RST_STREAM => 4,
            _ => 0,
        };
        let wire = raw(len, kind, 0, 0, &vec![0; len as usize]);
        assert_eq!(
            err(&wire),
            (ErrorCode::PROTOCOL_ERROR, CONN),
            "type {kind} on stream 0"
        );
    }
    assert_eq!(
        err(&frame(SETTINGS, 0, 1, &[])),
        (ErrorCode::PROTOCOL_ERROR, CONN)
    );
    assert_eq!(
        err(&frame(PING, 0, 1, &[0; 8])),
        (ErrorCode::PROTOCOL_ERROR, CONN)
    );
    assert_eq!(
        err(&frame(GOAWAY, 0, 1, &[0; 8])),
        (ErrorCode::PROTOCOL_ERROR, CONN)
    );
    // WINDOW_UPDATE and unknown types go on either.
    assert!(read(&frame(WINDOW_UPDATE, 0, 0, &[0, 0, 0, 1])).is_ok());
    assert!(read(&frame(WINDOW_UPDATE, 0, 1, &[0, 0, 0, 1])).is_ok());
    assert!(read(&frame(0x20, 0xff, 0, b"anything")).is_ok());
}

#[test]
fn push_promise_is_refused() {
    let wire = frame(PUSH_PROMISE, FLAG_END_HEADERS, 1, &[0, 0, 0, 2, 0x82]);
    assert_eq!(err(&wire), (ErrorCode::PROTOCOL_ERROR, CONN));
}

#[test]
fn padding_may_fill_the_payload_but_not_exceed_it() {
    // Pad length 3, 2 octets of data, 3 of padding.
    let wire = frame(DATA, FLAG_PADDED, 1, &[3, b'h', b'i', 0, 0, 0]);
    let f = read(&wire).expect("padded");
    assert_eq!(
        f,
        Frame::Data {
            stream: 1,
            end_stream: false,
            data: b"hi",
            flow_len: 6,
        }
    );
    // All padding: legal, empty data, the whole payload still counted.
    let wire = frame(DATA, FLAG_PADDED, 1, &[3, 0, 0, 0]);
    let f = read(&wire).expect("all padding");
    assert!(matches!(
        f,
        Frame::Data {
            data: b"",
            flow_len: 4,
            ..
        }
    ));
    // Padding as long as the payload.
    assert_eq!(
        err(&frame(DATA, FLAG_PADDED, 1, &[4, 0, 0, 0])),
        (ErrorCode::PROTOCOL_ERROR, CONN)
    );
    assert_eq!(
        err(&frame(DATA, FLAG_PADDED, 1, &[])),
        (ErrorCode::FRAME_SIZE_ERROR, CONN)
    );
    // HEADERS: padding and priority together; the padding may not eat
    // into the priority fields.
    let payload = [2, 0, 0, 0, 3, 15, 0x82, 0, 0];
    let wire = frame(HEADERS, FLAG_PADDED | FLAG_PRIORITY, 1, &payload);
    let f = read(&wire).expect("headers");
    let want_priority = Priority {
        exclusive: false,
        dependency: 3,
        weight: 15,
    };
    assert!(
        matches!(f, Frame::Headers { block: b"\x82", priority: Some(p), .. } if p == want_priority)
    );
    let payload = [2, 0, 0, 0, 3, 15, 0, 0];
    assert!(read(&frame(HEADERS, FLAG_PADDED | FLAG_PRIORITY, 1, &payload)).is_ok());
    let payload = [3, 0, 0, 0, 3, 15, 0, 0];
    assert_eq!(
        err(&frame(HEADERS, FLAG_PADDED | FLAG_PRIORITY, 1, &payload)),
        (ErrorCode::PROTOCOL_ERROR, CONN)
    );
    assert_eq!(
        err(&frame(
            HEADERS,
            FLAG_PADDED | FLAG_PRIORITY,
            1,
            &[0, 0, 0, 3]
        )),
        (ErrorCode::FRAME_SIZE_ERROR, CONN)
    );
    assert_eq!(
        err(&frame(HEADERS, FLAG_PADDED, 1, &[2, 0])),
        (ErrorCode::PROTOCOL_ERROR, CONN)
    );
}

#[test]
fn a_stream_cannot_depend_on_itself() {
    assert_eq!(
        err(&frame(PRIORITY, 0, 5, &[0, 0, 0, 5, 0])),
        (ErrorCode::PROTOCOL_ERROR, Scope::Stream(5))
    );
    assert_eq!(
        err(&frame(HEADERS, FLAG_PRIORITY, 5, &[0x80, 0, 0, 5, 0])),
        (ErrorCode::PROTOCOL_ERROR, CONN)
    );
}

#[test]
fn fixed_lengths_are_enforced() {
    assert_eq!(
        err(&frame(PRIORITY, 0, 5, &[0, 0, 0, 1])),
        (ErrorCode::FRAME_SIZE_ERROR, Scope::Stream(5))
    );
    let size = (ErrorCode::FRAME_SIZE_ERROR, CONN);
    assert_eq!(err(&frame(RST_STREAM, 0, 1, &[0, 0, 0])), size);
    assert_eq!(err(&frame(RST_STREAM, 0, 1, &[0, 0, 0, 0, 0])), size);
    assert_eq!(err(&frame(PING, 0, 0, &[0; 7])), size);
    assert_eq!(err(&frame(PING, 0, 0, &[0; 9])), size);
    assert_eq!(err(&frame(GOAWAY, 0, 0, &[0; 7])), size);
    assert!(read(&frame(GOAWAY, 0, 0, &[0; 8])).is_ok());
    assert_eq!(err(&frame(WINDOW_UPDATE, 0, 1, &[0, 0, 1])), size);
    assert_eq!(err(&frame(SETTINGS, 0, 0, &[0; 5])), size);
    assert_eq!(err(&frame(SETTINGS, FLAG_ACK, 0, &[0; 6])), size);
}

#[test]
fn a_zero_window_increment_fails_its_stream_or_the_connection() {
    assert_eq!(
        err(&frame(WINDOW_UPDATE, 0, 3, &[0, 0, 0, 0])),
        (ErrorCode::PROTOCOL_ERROR, Scope::Stream(3))
    );
    assert_eq!(
        err(&frame(WINDOW_UPDATE, 0, 0, &[0, 0, 0, 0])),
        (ErrorCode::PROTOCOL_ERROR, CONN)
    );
    // The reserved bit is not part of the increment.
    let e = read(&frame(WINDOW_UPDATE, 0, 0, &[0x80, 0, 0, 0])).expect_err("zero");
    assert_eq!(e.code, ErrorCode::PROTOCOL_ERROR);
}

fn setting(id: u16, value: u32) -> Vec<u8> {
    let mut p = id.to_be_bytes().to_vec();
    p.extend_from_slice(&value.to_be_bytes());
    frame(SETTINGS, 0, 0, &p)
}

#[test]
fn each_setting_is_checked_at_its_bounds() {
    let ok = |id, value| read(&setting(id, value)).is_ok();
    let code = |id, value| err(&setting(id, value)).0;
    assert!(ok(SETTINGS_ENABLE_PUSH, 0) && ok(SETTINGS_ENABLE_PUSH, 1));
    assert_eq!(code(SETTINGS_ENABLE_PUSH, 2), ErrorCode::PROTOCOL_ERROR);
    assert!(ok(SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW));
    assert_eq!(
        code(SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW + 1),
        ErrorCode::FLOW_CONTROL_ERROR
    );
    assert!(ok(SETTINGS_MAX_FRAME_SIZE, DEFAULT_MAX_FRAME_SIZE));
    assert!(ok(SETTINGS_MAX_FRAME_SIZE, MAX_FRAME_SIZE_LIMIT));
    assert_eq!(
        code(SETTINGS_MAX_FRAME_SIZE, DEFAULT_MAX_FRAME_SIZE - 1),
        ErrorCode::PROTOCOL_ERROR
    );
    assert_eq!(
        code(SETTINGS_MAX_FRAME_SIZE, MAX_FRAME_SIZE_LIMIT + 1),
        ErrorCode::PROTOCOL_ERROR
    );
    assert!(ok(SETTINGS_ENABLE_CONNECT_PROTOCOL, 1));
    assert_eq!(
        code(SETTINGS_ENABLE_CONNECT_PROTOCOL, 2),
        ErrorCode::PROTOCOL_ERROR
    );
    assert_eq!(
        code(SETTINGS_NO_RFC7540_PRIORITIES, 2),
        ErrorCode::PROTOCOL_ERROR
    );
    // No bound of its own: any u32.
    assert!(ok(SETTINGS_HEADER_TABLE_SIZE, u32::MAX));
    assert!(ok(SETTINGS_MAX_CONCURRENT_STREAMS, 0));
    assert!(ok(SETTINGS_MAX_HEADER_LIST_SIZE, u32::MAX));
    // Unknown identifiers are ignored, whatever their value.
    assert_eq!(
        read(&setting(0x99, u32::MAX)),
        Ok(Frame::Settings {
            ack: false,
            settings: Settings::default(),
        })
    );
}

#[test]
fn a_setting_named_twice_keeps_the_later_value() {
    let mut p = Vec::new();
    for value in [100u32, 7] {
        p.extend_from_slice(&SETTINGS_MAX_CONCURRENT_STREAMS.to_be_bytes());
        p.extend_from_slice(&value.to_be_bytes());
    }
    let wire = frame(SETTINGS, 0, 0, &p);
    let f = read(&wire).expect("settings");
    assert!(
        matches!(f, Frame::Settings { settings, .. } if settings.max_concurrent_streams == Some(7))
    );
}

#[test]
fn goaway_and_rst_keep_unknown_codes_and_drop_the_reserved_bit() {
    let wire = frame(
        GOAWAY,
        0,
        0,
        &[0xff, 0xff, 0xff, 0xff, 0, 0, 0x12, 0x34, b'x'],
    );
    let f = read(&wire).expect("goaway");
    assert_eq!(
        f,
        Frame::GoAway {
            last_stream: MAX_WINDOW,
            code: ErrorCode(0x1234),
            debug: b"x",
        }
    );
    let wire = frame(RST_STREAM, 0, 1, &[0, 0, 0, 0xff]);
    let f = read(&wire).expect("rst");
    assert_eq!(
        f,
        Frame::RstStream {
            stream: 1,
            code: ErrorCode(0xff),
        }
    );
}

#[test]
fn a_large_header_block_is_split_into_continuations() {
    let block: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
    let mut wire = Vec::new();
    write_header_block(3, true, &block, DEFAULT_MAX_FRAME_SIZE, &mut wire);
    let mut rest = &wire[..];
    let mut joined = Vec::new();
    let mut frames = Vec::new();
    while !rest.is_empty() {
        let head: &[u8; HEADER_LEN] = rest[..HEADER_LEN].try_into().expect("9 octets");
        let header = FrameHeader::parse(head);
        let end = HEADER_LEN + header.len as usize;
        match parse(header, &rest[HEADER_LEN..end]).expect("valid") {
            Frame::Headers {
                stream: 3,
                end_stream: true,
                end_headers,
                block,
                ..
            } => frames.push((HEADERS, end_headers, block.len())),
            Frame::Continuation {
                stream: 3,
                end_headers,
                block,
            } => frames.push((CONTINUATION, end_headers, block.len())),
            other => panic!("unexpected {other:?}"),
        }
        joined.extend_from_slice(&rest[HEADER_LEN..end]);
        rest = &rest[end..];
    }
    assert_eq!(
        frames,
        [
            (HEADERS, false, 16_384),
            (CONTINUATION, false, 16_384),
            (CONTINUATION, true, 7_232)
        ]
    );
    assert_eq!(joined, block);
    // An empty block is one HEADERS frame that ends the block.
    wire.clear();
    write_header_block(3, false, &[], DEFAULT_MAX_FRAME_SIZE, &mut wire);
    assert_eq!(wire, [0, 0, 0, HEADERS, FLAG_END_HEADERS, 0, 0, 0, 3]);
}

proptest::proptest! {
    #![proptest_config(crate::testing::fuzz_config(256))]

    /// Any header and payload: refused or parsed, never a panic; and what
    /// parses, written again, parses to the same frame (padding aside).
    #[test]
    fn arbitrary_frames_parse_or_are_refused_and_write_back(
        kind in 0u8..12,
        flags in proptest::prelude::any::<u8>(),
        stream in proptest::prelude::any::<u32>(),
        payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48),
    ) {
        let wire = frame(kind, flags, stream, &payload);
        if let Ok(parsed) = read(&wire) {
            let want = match parsed {
                Frame::Data { stream, end_stream, data, .. } => Frame::Data {
                    stream,
                    end_stream,
                    data,
                    flow_len: data.len() as u32,
                },
                other => other,
            };
            let mut again = Vec::new();
            parsed.write(&mut again);
            proptest::prop_assert_eq!(read(&again), Ok(want));
        }
    }
}
