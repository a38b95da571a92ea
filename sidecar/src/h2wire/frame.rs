//! HTTP/2 frames (RFC 9113 §4, §6): the 9-octet header, every frame type
//! parsed from its payload without copying, and written back.
//!
//! Checks are split by when they can run. [`FrameHeader::check`] needs
//! only the header: the length against SETTINGS_MAX_FRAME_SIZE, the
//! stream-id rules of each type and the fixed lengths (PING 8, ...), so a
//! frame that would be refused is refused before its payload is buffered.
//! [`parse`] then checks what needs the payload: padding, settings values,
//! a zero window increment. Each refusal is a [`FrameError`] naming the
//! code to send and whether it ends the connection or one stream.
//!
//! What needs connection state is the connection layer's: stream states,
//! HEADERS/CONTINUATION sequencing, flow-control windows, and whether a
//! SETTINGS_ENABLE_PUSH of 1 came from a server (§6.5.2).

use super::ErrorCode;

pub(crate) const HEADER_LEN: usize = 9;
/// SETTINGS_MAX_FRAME_SIZE's initial value and its lowest legal one.
pub(crate) const DEFAULT_MAX_FRAME_SIZE: u32 = 1 << 14;
/// The highest legal SETTINGS_MAX_FRAME_SIZE (the length field's range).
pub(crate) const MAX_FRAME_SIZE_LIMIT: u32 = (1 << 24) - 1;
/// The largest flow-control window (§6.9.1).
pub(crate) const MAX_WINDOW: u32 = (1 << 31) - 1;
const STREAM_ID_MASK: u32 = MAX_WINDOW;

pub(crate) const DATA: u8 = 0x0;
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const PRIORITY: u8 = 0x2;
pub(crate) const RST_STREAM: u8 = 0x3;
pub(crate) const SETTINGS: u8 = 0x4;
pub(crate) const PUSH_PROMISE: u8 = 0x5;
pub(crate) const PING: u8 = 0x6;
pub(crate) const GOAWAY: u8 = 0x7;
pub(crate) const WINDOW_UPDATE: u8 = 0x8;
pub(crate) const CONTINUATION: u8 = 0x9;

pub(crate) const FLAG_END_STREAM: u8 = 0x1;
pub(crate) const FLAG_ACK: u8 = 0x1;
pub(crate) const FLAG_END_HEADERS: u8 = 0x4;
pub(crate) const FLAG_PADDED: u8 = 0x8;
pub(crate) const FLAG_PRIORITY: u8 = 0x20;

/// Setting identifiers (§6.5.2; RFC 8441 §3; RFC 9218 §2.1).
pub(crate) const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub(crate) const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub(crate) const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub(crate) const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub(crate) const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub(crate) const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;
pub(crate) const SETTINGS_ENABLE_CONNECT_PROTOCOL: u16 = 0x8;
pub(crate) const SETTINGS_NO_RFC7540_PRIORITIES: u16 = 0x9;

/// Whom a violation ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// GOAWAY with the code, then close (§5.4.1).
    Connection,
    /// RST_STREAM with the code on this stream (§5.4.2).
    Stream(u32),
}

/// A frame this endpoint refuses, and what to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameError {
    pub(crate) code: ErrorCode,
    pub(crate) scope: Scope,
    /// For the log and the GOAWAY's debug data.
    pub(crate) reason: &'static str,
}

const fn conn(code: ErrorCode, reason: &'static str) -> FrameError {
    FrameError {
        code,
        scope: Scope::Connection,
        reason,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    /// Payload length, 24 bits.
    pub(crate) len: u32,
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    /// 31 bits; the reserved bit is dropped on receipt (§4.1).
    pub(crate) stream: u32,
}

impl FrameHeader {
    pub(crate) fn parse(b: &[u8; HEADER_LEN]) -> Self {
        Self {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & STREAM_ID_MASK,
        }
    }

    /// Appends the 9 octets. `len` above 24 bits is the writer's bug: the
    /// frame writers below never produce one.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        debug_assert!(
            self.len <= MAX_FRAME_SIZE_LIMIT,
            "frame payload over 2^24-1"
        );
        let len = self.len.to_be_bytes();
        out.extend_from_slice(&[len[1], len[2], len[3], self.kind, self.flags]);
        out.extend_from_slice(&(self.stream & STREAM_ID_MASK).to_be_bytes());
    }

    fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// What the header alone can tell (§4.2 and §6): run it before
    /// reading the payload. `max_frame_size` is the SETTINGS_MAX_FRAME_SIZE
    /// we advertised.
    pub(crate) fn check(&self, max_frame_size: u32) -> Result<(), FrameError> {
        // §4.2 lets a size error on a frame that changes no connection
        // state be a stream error; refusing all oversize frames with the
        // connection is simpler and a conforming peer never sends one.
        if self.len > max_frame_size {
            return Err(conn(
                ErrorCode::FRAME_SIZE_ERROR,
                "frame longer than SETTINGS_MAX_FRAME_SIZE",
            ));
        }
        self.check_shape()
    }

    /// Stream-id rules and fixed lengths of each type.
    fn check_shape(&self) -> Result<(), FrameError> {
        let on_stream = matches!(
            self.kind,
            DATA | HEADERS | PRIORITY | RST_STREAM | PUSH_PROMISE | CONTINUATION
        );
        if on_stream && self.stream == 0 {
            return Err(conn(ErrorCode::PROTOCOL_ERROR, "stream frame on stream 0"));
        }
        if matches!(self.kind, SETTINGS | PING | GOAWAY) && self.stream != 0 {
            return Err(conn(
                ErrorCode::PROTOCOL_ERROR,
                "connection frame on a stream",
            ));
        }
        let size_error = |reason| Err(conn(ErrorCode::FRAME_SIZE_ERROR, reason));
        match self.kind {
            // §8.4: a client never pushes; as a client we send
            // SETTINGS_ENABLE_PUSH 0, so a server's push is an error
            // too (§6.6).
            PUSH_PROMISE => Err(conn(ErrorCode::PROTOCOL_ERROR, "PUSH_PROMISE refused")),
            PRIORITY if self.len != 5 => Err(FrameError {
                code: ErrorCode::FRAME_SIZE_ERROR,
                scope: Scope::Stream(self.stream),
                reason: "PRIORITY length is not 5",
            }),
            RST_STREAM if self.len != 4 => size_error("RST_STREAM length is not 4"),
            SETTINGS if self.has(FLAG_ACK) && self.len != 0 => {
                size_error("SETTINGS ack with a payload")
            }
            SETTINGS if !self.len.is_multiple_of(6) => {
                size_error("SETTINGS length not a multiple of 6")
            }
            PING if self.len != 8 => size_error("PING length is not 8"),
            GOAWAY if self.len < 8 => size_error("GOAWAY shorter than 8"),
            WINDOW_UPDATE if self.len != 4 => size_error("WINDOW_UPDATE length is not 4"),
            _ => Ok(()),
        }
    }
}

/// A stream's priority as RFC 7540 carried it (§5.3.2 of RFC 9113 keeps
/// the fields; their meaning is deprecated and a proxy ignores it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Priority {
    pub(crate) exclusive: bool,
    pub(crate) dependency: u32,
    /// As on the wire: weight minus one.
    pub(crate) weight: u8,
}

impl Priority {
    fn parse(b: &[u8]) -> Self {
        let word = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        Self {
            exclusive: word & !STREAM_ID_MASK != 0,
            dependency: word & STREAM_ID_MASK,
            weight: b[4],
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        let word =
            (self.dependency & STREAM_ID_MASK) | if self.exclusive { !STREAM_ID_MASK } else { 0 };
        out.extend_from_slice(&word.to_be_bytes());
        out.push(self.weight);
    }
}

/// The settings of one SETTINGS frame, in the order of §6.5.2; a setting
/// named twice keeps the later value (§6.5.3: processed in order).
/// Unknown identifiers are ignored, as §6.5.2 requires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) header_table_size: Option<u32>,
    pub(crate) enable_push: Option<bool>,
    pub(crate) max_concurrent_streams: Option<u32>,
    pub(crate) initial_window_size: Option<u32>,
    pub(crate) max_frame_size: Option<u32>,
    pub(crate) max_header_list_size: Option<u32>,
    pub(crate) enable_connect_protocol: Option<bool>,
    pub(crate) no_rfc7540_priorities: Option<bool>,
}

impl Settings {
    fn parse(payload: &[u8]) -> Result<Self, FrameError> {
        let mut s = Self::default();
        let flag = |value: u32, reason| match value {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(conn(ErrorCode::PROTOCOL_ERROR, reason)),
        };
        for entry in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([entry[0], entry[1]]);
            let value = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
            match id {
                SETTINGS_HEADER_TABLE_SIZE => s.header_table_size = Some(value),
                SETTINGS_ENABLE_PUSH => {
                    s.enable_push = Some(flag(value, "SETTINGS_ENABLE_PUSH not 0 or 1")?)
                }
                SETTINGS_MAX_CONCURRENT_STREAMS => s.max_concurrent_streams = Some(value),
                SETTINGS_INITIAL_WINDOW_SIZE if value > MAX_WINDOW => {
                    return Err(conn(
                        ErrorCode::FLOW_CONTROL_ERROR,
                        "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1",
                    ));
                }
                SETTINGS_INITIAL_WINDOW_SIZE => s.initial_window_size = Some(value),
                SETTINGS_MAX_FRAME_SIZE
                    if !(DEFAULT_MAX_FRAME_SIZE..=MAX_FRAME_SIZE_LIMIT).contains(&value) =>
                {
                    return Err(conn(
                        ErrorCode::PROTOCOL_ERROR,
                        "SETTINGS_MAX_FRAME_SIZE out of range",
                    ));
                }
                SETTINGS_MAX_FRAME_SIZE => s.max_frame_size = Some(value),
                SETTINGS_MAX_HEADER_LIST_SIZE => s.max_header_list_size = Some(value),
                SETTINGS_ENABLE_CONNECT_PROTOCOL => {
                    s.enable_connect_protocol =
                        Some(flag(value, "SETTINGS_ENABLE_CONNECT_PROTOCOL not 0 or 1")?);
                }
                SETTINGS_NO_RFC7540_PRIORITIES => {
                    s.no_rfc7540_priorities =
                        Some(flag(value, "SETTINGS_NO_RFC7540_PRIORITIES not 0 or 1")?);
                }
                _ => {}
            }
        }
        Ok(s)
    }

    fn entries(&self) -> impl Iterator<Item = (u16, u32)> {
        [
            (SETTINGS_HEADER_TABLE_SIZE, self.header_table_size),
            (SETTINGS_ENABLE_PUSH, self.enable_push.map(u32::from)),
            (SETTINGS_MAX_CONCURRENT_STREAMS, self.max_concurrent_streams),
            (SETTINGS_INITIAL_WINDOW_SIZE, self.initial_window_size),
            (SETTINGS_MAX_FRAME_SIZE, self.max_frame_size),
            (SETTINGS_MAX_HEADER_LIST_SIZE, self.max_header_list_size),
            (
                SETTINGS_ENABLE_CONNECT_PROTOCOL,
                self.enable_connect_protocol.map(u32::from),
            ),
            (
                SETTINGS_NO_RFC7540_PRIORITIES,
                self.no_rfc7540_priorities.map(u32::from),
            ),
        ]
        .into_iter()
        .filter_map(|(id, value)| value.map(|v| (id, v)))
    }
}

/// One frame, its slices borrowed from the payload it was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Frame<'a> {
    Data {
        stream: u32,
        end_stream: bool,
        data: &'a [u8],
        /// The whole payload, padding included: what flow control counts
        /// (§6.1).
        flow_len: u32,
    },
    Headers {
        stream: u32,
        end_stream: bool,
        end_headers: bool,
        priority: Option<Priority>,
        /// The field block fragment, padding removed.
        block: &'a [u8],
    },
    Priority {
        stream: u32,
        priority: Priority,
    },
    RstStream {
        stream: u32,
        code: ErrorCode,
    },
    Settings {
        ack: bool,
        settings: Settings,
    },
    Ping {
        ack: bool,
        data: [u8; 8],
    },
    GoAway {
        last_stream: u32,
        code: ErrorCode,
        debug: &'a [u8],
    },
    WindowUpdate {
        stream: u32,
        increment: u32,
    },
    Continuation {
        stream: u32,
        end_headers: bool,
        block: &'a [u8],
    },
    /// A type this endpoint does not know: ignored (§4.1, §5.5).
    Unknown {
        kind: u8,
        stream: u32,
    },
}

/// Parses the frame `header` announced from its `payload` (exactly
/// `header.len` octets). Runs the header's shape checks again, so a caller
/// that skipped [`FrameHeader::check`] is still safe; the size limit is
/// the caller's, checked before it buffered the payload.
pub(crate) fn parse(header: FrameHeader, payload: &[u8]) -> Result<Frame<'_>, FrameError> {
    if payload.len() != header.len as usize {
        return Err(conn(
            ErrorCode::FRAME_SIZE_ERROR,
            "payload length differs from the header's",
        ));
    }
    header.check_shape()?;
    let stream = header.stream;
    let word = |at: usize| {
        u32::from_be_bytes([
            payload[at],
            payload[at + 1],
            payload[at + 2],
            payload[at + 3],
        ])
    };
    Ok(match header.kind {
        DATA => Frame::Data {
            stream,
            end_stream: header.has(FLAG_END_STREAM),
            data: unpad(header, payload, 0)?.1,
            flow_len: header.len,
        },
        HEADERS => {
            let fixed = if header.has(FLAG_PRIORITY) { 5 } else { 0 };
            let (fields, block) = unpad(header, payload, fixed)?;
            let priority = (fixed > 0).then(|| Priority::parse(fields));
            // §5.3.1 makes this a stream error; it ends the connection
            // here because the block it carries would still have to be
            // decoded to keep HPACK in step, and no conforming client
            // sends it.
            if priority.is_some_and(|p| p.dependency == stream) {
                return Err(conn(
                    ErrorCode::PROTOCOL_ERROR,
                    "HEADERS stream depends on itself",
                ));
            }
            Frame::Headers {
                stream,
                end_stream: header.has(FLAG_END_STREAM),
                end_headers: header.has(FLAG_END_HEADERS),
                priority,
                block,
            }
        }
        PRIORITY => {
            let priority = Priority::parse(payload);
            if priority.dependency == stream {
                return Err(FrameError {
                    code: ErrorCode::PROTOCOL_ERROR,
                    scope: Scope::Stream(stream),
                    reason: "PRIORITY stream depends on itself",
                });
            }
            Frame::Priority { stream, priority }
        }
        RST_STREAM => Frame::RstStream {
            stream,
            code: ErrorCode(word(0)),
        },
        SETTINGS => Frame::Settings {
            ack: header.has(FLAG_ACK),
            settings: Settings::parse(payload)?,
        },
        PING => {
            let mut data = [0; 8];
            data.copy_from_slice(payload);
            Frame::Ping {
                ack: header.has(FLAG_ACK),
                data,
            }
        }
        GOAWAY => Frame::GoAway {
            last_stream: word(0) & STREAM_ID_MASK,
            code: ErrorCode(word(4)),
            debug: &payload[8..],
        },
        WINDOW_UPDATE => {
            let increment = word(0) & STREAM_ID_MASK;
            if increment == 0 {
                let scope = if stream == 0 {
                    Scope::Connection
                } else {
                    Scope::Stream(stream)
                };
                return Err(FrameError {
                    code: ErrorCode::PROTOCOL_ERROR,
                    scope,
                    reason: "WINDOW_UPDATE increment 0",
                });
            }
            Frame::WindowUpdate { stream, increment }
        }
        CONTINUATION => Frame::Continuation {
            stream,
            end_headers: header.has(FLAG_END_HEADERS),
            block: payload,
        },
        kind => Frame::Unknown { kind, stream },
    })
}

/// Splits a DATA or HEADERS payload (§6.1, §6.2) into the `fixed` octets
/// after the pad length (HEADERS' priority fields) and the content without
/// its padding.
fn unpad(header: FrameHeader, payload: &[u8], fixed: usize) -> Result<(&[u8], &[u8]), FrameError> {
    let (pad, rest) = if header.has(FLAG_PADDED) {
        let Some((&pad, rest)) = payload.split_first() else {
            return Err(conn(
                ErrorCode::FRAME_SIZE_ERROR,
                "padded frame without a pad length",
            ));
        };
        (usize::from(pad), rest)
    } else {
        (0, payload)
    };
    if rest.len() < fixed {
        return Err(conn(
            ErrorCode::FRAME_SIZE_ERROR,
            "HEADERS too short for its priority",
        ));
    }
    let (fields, content) = rest.split_at(fixed);
    // Padding may take all that is left ("the length of the frame payload
    // or greater" counts the pad-length octet), but not more.
    let keep = content.len().checked_sub(pad).ok_or(conn(
        ErrorCode::PROTOCOL_ERROR,
        "padding longer than the payload",
    ))?;
    Ok((fields, &content[..keep]))
}

/// Writes a header block as one HEADERS frame and as many CONTINUATIONs
/// as the peer's SETTINGS_MAX_FRAME_SIZE requires, back to back: §6.10
/// allows no other frame between them on the connection.
pub(crate) fn write_header_block(
    stream: u32,
    end_stream: bool,
    block: &[u8],
    max_frame_size: u32,
    out: &mut Vec<u8>,
) {
    let max = max_frame_size.clamp(DEFAULT_MAX_FRAME_SIZE, MAX_FRAME_SIZE_LIMIT) as usize;
    let (first, mut rest) = block.split_at(block.len().min(max));
    Frame::Headers {
        stream,
        end_stream,
        end_headers: rest.is_empty(),
        priority: None,
        block: first,
    }
    .write(out);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(max));
        rest = tail;
        Frame::Continuation {
            stream,
            end_headers: rest.is_empty(),
            block: chunk,
        }
        .write(out);
    }
}

impl Frame<'_> {
    /// Appends the frame, header included. DATA and HEADERS are written
    /// unpadded. The caller keeps payloads within the peer's
    /// SETTINGS_MAX_FRAME_SIZE (splitting blocks into CONTINUATIONs).
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let at = out.len();
        // The header's length is patched in once the payload is written.
        let (kind, flags, stream) = self.head();
        FrameHeader {
            len: 0,
            kind,
            flags,
            stream,
        }
        .write(out);
        match self {
            Self::Data { data, .. } => out.extend_from_slice(data),
            Self::Headers {
                priority, block, ..
            } => {
                if let Some(p) = priority {
                    p.write(out);
                }
                out.extend_from_slice(block);
            }
            Self::Priority { priority, .. } => priority.write(out),
            Self::RstStream { code, .. } => out.extend_from_slice(&code.0.to_be_bytes()),
            Self::Settings { settings, .. } => {
                for (id, value) in settings.entries() {
                    out.extend_from_slice(&id.to_be_bytes());
                    out.extend_from_slice(&value.to_be_bytes());
                }
            }
            Self::Ping { data, .. } => out.extend_from_slice(data),
            Self::GoAway {
                last_stream,
                code,
                debug,
            } => {
                out.extend_from_slice(&(last_stream & STREAM_ID_MASK).to_be_bytes());
                out.extend_from_slice(&code.0.to_be_bytes());
                out.extend_from_slice(debug);
            }
            Self::WindowUpdate { increment, .. } => {
                out.extend_from_slice(&(increment & STREAM_ID_MASK).to_be_bytes());
            }
            Self::Continuation { block, .. } => out.extend_from_slice(block),
            Self::Unknown { .. } => {}
        }
        let len = (out.len() - at - HEADER_LEN).to_be_bytes();
        let n = len.len();
        out[at..at + 3].copy_from_slice(&len[n - 3..]);
    }

    fn head(&self) -> (u8, u8, u32) {
        let flag = |on: bool, flag: u8| if on { flag } else { 0 };
        match *self {
            Self::Data {
                stream, end_stream, ..
            } => (DATA, flag(end_stream, FLAG_END_STREAM), stream),
            Self::Headers {
                stream,
                end_stream,
                end_headers,
                priority,
                ..
            } => (
                HEADERS,
                flag(end_stream, FLAG_END_STREAM)
                    | flag(end_headers, FLAG_END_HEADERS)
                    | flag(priority.is_some(), FLAG_PRIORITY),
                stream,
            ),
            Self::Priority { stream, .. } => (PRIORITY, 0, stream),
            Self::RstStream { stream, .. } => (RST_STREAM, 0, stream),
            Self::Settings { ack, .. } => (SETTINGS, flag(ack, FLAG_ACK), 0),
            Self::Ping { ack, .. } => (PING, flag(ack, FLAG_ACK), 0),
            Self::GoAway { .. } => (GOAWAY, 0, 0),
            Self::WindowUpdate { stream, .. } => (WINDOW_UPDATE, 0, stream),
            Self::Continuation {
                stream,
                end_headers,
                ..
            } => (CONTINUATION, flag(end_headers, FLAG_END_HEADERS), stream),
            Self::Unknown { kind, stream } => (kind, 0, stream),
        }
    }
}
