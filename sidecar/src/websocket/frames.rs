//! Frame boundaries in one direction of a relayed WebSocket (RFC 6455
//! §5.2), found from the frame headers alone: the payload is counted,
//! never read, so compressed (permessage-deflate, RSV1) and masked
//! payloads pass as they are.
//!
//! Why boundaries: the drain injects a Close frame into each direction, and
//! bytes of an injected frame inside another frame's payload would corrupt
//! both. Every frame boundary is a valid injection point, also between the
//! fragments of a message: §5.4 lets control frames (Close is one) be
//! injected in the middle of a fragmented message, and §5.5.1 lets an
//! endpoint send Close without finishing the message it was sending.

/// Opcode of a Close frame.
pub(crate) const OPCODE_CLOSE: u8 = 0x8;
/// 1001 Going Away: "an endpoint is going away, such as a server going
/// down" (§7.4.1).
pub(crate) const GOING_AWAY: u16 = 1001;

/// What a frame header says, as far as the relay needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHead {
    pub fin: bool,
    pub opcode: u8,
    pub masked: bool,
    pub payload_len: u64,
}

impl FrameHead {
    pub(crate) fn is_close(&self) -> bool {
        self.opcode == OPCODE_CLOSE
    }
}

/// The longest header: 2 bytes, a 64-bit length, a 4-byte mask key.
const MAX_HEAD: usize = 14;

#[derive(Debug, Clone, Copy)]
enum State {
    /// Between frames or inside a header: the header bytes seen so far.
    Head { buf: [u8; MAX_HEAD], have: usize },
    /// Inside a payload.
    Payload { head: FrameHead, left: u64 },
    /// A header no WebSocket peer sends (a 64-bit length with its top bit
    /// set, a fragmented or oversized control frame): no boundary can be
    /// trusted after it, so none is ever reported again.
    Lost,
}

/// Follows the frames of one direction, fed with the bytes as they pass.
#[derive(Debug, Clone)]
pub(crate) struct FrameTracker {
    state: State,
}

impl Default for FrameTracker {
    fn default() -> Self {
        Self::new()
    }
}

/// What one [`FrameTracker::step`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    /// Bytes of the input consumed.
    pub consumed: usize,
    /// The frame that ended exactly after `consumed` bytes, if one did.
    pub ended: Option<FrameHead>,
}

impl FrameTracker {
    pub(crate) fn new() -> Self {
        Self {
            state: State::Head {
                buf: [0; MAX_HEAD],
                have: 0,
            },
        }
    }

    /// Whether the bytes fed so far end exactly at a frame boundary.
    pub(crate) fn at_boundary(&self) -> bool {
        matches!(self.state, State::Head { have: 0, .. })
    }

    /// Whether the stream stopped looking like WebSocket frames.
    #[cfg(test)]
    pub(crate) fn is_lost(&self) -> bool {
        matches!(self.state, State::Lost)
    }

    /// Consumes `bytes` up to the end of the current frame (or all of them
    /// if it does not end within them). Call again with the rest.
    pub(crate) fn step(&mut self, bytes: &[u8]) -> Step {
        let mut consumed = 0;
        loop {
            match &mut self.state {
                State::Lost => {
                    return Step {
                        consumed: bytes.len(),
                        ended: None,
                    };
                }
                State::Payload { head, left } => {
                    let rest = (bytes.len() - consumed) as u64;
                    if rest < *left {
                        *left -= rest;
                        return Step {
                            consumed: bytes.len(),
                            ended: None,
                        };
                    }
                    // `left` is at most `rest` here, which is a usize.
                    consumed += *left as usize;
                    let head = *head;
                    *self = Self::new();
                    return Step {
                        consumed,
                        ended: Some(head),
                    };
                }
                State::Head { buf, have } => {
                    let Some(&byte) = bytes.get(consumed) else {
                        return Step {
                            consumed,
                            ended: None,
                        };
                    };
                    buf[*have] = byte;
                    *have += 1;
                    consumed += 1;
                    match parse_head(&buf[..*have]) {
                        Parsed::NeedMore => {}
                        Parsed::Invalid => self.state = State::Lost,
                        Parsed::Head(head) if head.payload_len == 0 => {
                            *self = Self::new();
                            return Step {
                                consumed,
                                ended: Some(head),
                            };
                        }
                        Parsed::Head(head) => {
                            self.state = State::Payload {
                                head,
                                left: head.payload_len,
                            };
                        }
                    }
                }
            }
        }
    }
}

enum Parsed {
    NeedMore,
    Invalid,
    Head(FrameHead),
}

/// Parses a header from its first bytes; `NeedMore` until all of it is in.
fn parse_head(buf: &[u8]) -> Parsed {
    let [b0, b1, rest @ ..] = buf else {
        return Parsed::NeedMore;
    };
    let fin = b0 & 0x80 != 0;
    let opcode = b0 & 0x0f;
    let masked = b1 & 0x80 != 0;
    let len7 = b1 & 0x7f;
    let ext = match len7 {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if masked { 4 } else { 0 };
    if rest.len() < ext + mask {
        return Parsed::NeedMore;
    }
    let payload_len = match ext {
        2 => u64::from(u16::from_be_bytes([rest[0], rest[1]])),
        8 => {
            let mut be = [0u8; 8];
            be.copy_from_slice(&rest[..8]);
            u64::from_be_bytes(be)
        }
        _ => u64::from(len7),
    };
    let control = opcode & 0x8 != 0;
    // §5.2: the top bit of a 64-bit length is 0. §5.5: control frames are
    // never fragmented and carry at most 125 bytes.
    if payload_len >> 63 != 0 || (control && (!fin || payload_len > 125)) {
        return Parsed::Invalid;
    }
    Parsed::Head(FrameHead {
        fin,
        opcode,
        masked,
        payload_len,
    })
}

/// A Close frame carrying `code`. With a mask key it is a client's frame
/// (toward the app: §5.3 requires a fresh random key for each frame a
/// client sends), without one a server's (toward the client).
pub(crate) fn close_frame(code: u16, mask: Option<[u8; 4]>) -> Vec<u8> {
    let payload = code.to_be_bytes();
    let mut frame = Vec::with_capacity(8);
    frame.push(0x80 | OPCODE_CLOSE);
    match mask {
        Some(key) => {
            frame.push(0x80 | payload.len() as u8);
            frame.extend_from_slice(&key);
            frame.extend(payload.iter().zip(key.iter().cycle()).map(|(b, k)| b ^ k));
        }
        None => {
            frame.push(payload.len() as u8);
            frame.extend_from_slice(&payload);
        }
    }
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame as a peer would write it (payload bytes are filler).
    fn frame(fin: bool, rsv1: bool, opcode: u8, mask: Option<[u8; 4]>, len: usize) -> Vec<u8> {
        let mut f = vec![(u8::from(fin) << 7) | (u8::from(rsv1) << 6) | opcode];
        let m = if mask.is_some() { 0x80 } else { 0 };
        if len < 126 {
            f.push(m | len as u8);
        } else if len <= 0xffff {
            f.push(m | 126);
            f.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            f.push(m | 127);
            f.extend_from_slice(&(len as u64).to_be_bytes());
        }
        if let Some(key) = mask {
            f.extend_from_slice(&key);
        }
        f.extend((0..len).map(|i| (i % 251) as u8));
        f
    }

    /// Feeds `chunks` and returns the offset (in the whole stream) at which
    /// each frame ended, with its head.
    fn ends(tracker: &mut FrameTracker, chunks: &[&[u8]]) -> Vec<(usize, FrameHead)> {
        let mut out = Vec::new();
        let mut offset = 0;
        for chunk in chunks {
            let mut at = 0;
            while at < chunk.len() {
                let step = tracker.step(&chunk[at..]);
                at += step.consumed;
                if let Some(head) = step.ended {
                    out.push((offset + at, head));
                }
            }
            offset += chunk.len();
        }
        out
    }

    #[test]
    fn finds_the_end_of_7_16_and_64_bit_length_frames() {
        let small = frame(true, false, 0x1, None, 5);
        let medium = frame(true, false, 0x2, None, 300);
        let large = frame(true, false, 0x2, None, 70_000);
        let stream = [small.clone(), medium.clone(), large.clone()].concat();
        let mut t = FrameTracker::new();
        let found = ends(&mut t, &[&stream]);
        let offsets: Vec<usize> = found.iter().map(|(o, _)| *o).collect();
        assert_eq!(
            offsets,
            vec![
                small.len(),
                small.len() + medium.len(),
                small.len() + medium.len() + large.len()
            ]
        );
        assert_eq!(found[1].1.payload_len, 300);
        assert_eq!(found[2].1.payload_len, 70_000);
        assert!(t.at_boundary());
    }

    #[test]
    fn masked_frames_count_the_mask_key_in_the_header() {
        let f = frame(true, false, 0x1, Some([1, 2, 3, 4]), 200);
        let mut t = FrameTracker::new();
        let found = ends(&mut t, &[&f]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, f.len());
        assert!(found[0].1.masked);
    }

    #[test]
    fn a_header_split_at_every_byte_is_still_found() {
        // Headers of every shape, split at every point of the stream.
        let stream = [
            frame(true, false, 0x1, Some([9, 9, 9, 9]), 70_000),
            frame(true, false, 0x2, Some([7, 7, 7, 7]), 126),
            frame(true, false, 0x9, None, 0),
            frame(true, false, 0x1, None, 3),
        ]
        .concat();
        let whole = ends(&mut FrameTracker::new(), &[&stream]);
        assert_eq!(whole.len(), 4);
        for split in 0..stream.len() {
            let (a, b) = stream.split_at(split);
            let mut t = FrameTracker::new();
            assert_eq!(ends(&mut t, &[a, b]), whole, "split at {split}");
            assert!(t.at_boundary());
        }
        // And one byte at a time.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(ends(&mut FrameTracker::new(), &bytes), whole);
    }

    #[test]
    fn mid_frame_is_not_a_boundary() {
        let f = frame(true, false, 0x2, None, 1000);
        let mut t = FrameTracker::new();
        assert!(t.at_boundary());
        assert_eq!(t.step(&f[..1]).ended, None);
        assert!(!t.at_boundary(), "inside the header");
        assert_eq!(t.step(&f[1..500]).ended, None);
        assert!(!t.at_boundary(), "inside the payload");
        let step = t.step(&f[500..]);
        assert_eq!(step.consumed, f.len() - 500);
        assert!(step.ended.is_some());
        assert!(t.at_boundary());
    }

    #[test]
    fn step_stops_at_the_end_of_each_frame() {
        let a = frame(true, false, 0x1, None, 10);
        let b = frame(true, false, 0x1, None, 10);
        let stream = [a.clone(), b].concat();
        let mut t = FrameTracker::new();
        let step = t.step(&stream);
        assert_eq!(step.consumed, a.len(), "the rest belongs to the next frame");
        assert!(step.ended.is_some());
    }

    #[test]
    fn fragments_and_interleaved_control_frames_each_end_at_a_boundary() {
        // A text message in three fragments with a ping between the first
        // two: every fragment end is a boundary (§5.4).
        let parts = [
            frame(false, false, 0x1, None, 4),
            frame(true, false, 0x9, None, 2),
            frame(false, false, 0x0, None, 4),
            frame(true, false, 0x0, None, 4),
        ];
        let stream = parts.concat();
        let found = ends(&mut FrameTracker::new(), &[&stream]);
        let heads: Vec<(bool, u8)> = found.iter().map(|(_, h)| (h.fin, h.opcode)).collect();
        assert_eq!(heads, vec![(false, 1), (true, 9), (false, 0), (true, 0)]);
    }

    #[test]
    fn compressed_frames_are_counted_not_read() {
        // RSV1 (permessage-deflate) set: only the header matters.
        let f = frame(true, true, 0x1, None, 40);
        let found = ends(&mut FrameTracker::new(), &[&f]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, f.len());
    }

    #[test]
    fn a_header_no_peer_sends_loses_the_boundaries_for_good() {
        // A ping with 126 bytes (control frames carry at most 125).
        let bad = frame(true, false, 0x9, None, 126);
        let mut t = FrameTracker::new();
        let _ = ends(&mut t, &[&bad]);
        assert!(t.is_lost());
        assert!(!t.at_boundary());
        let after = frame(true, false, 0x1, None, 1);
        assert!(ends(&mut t, &[&after]).is_empty());
        // A fragmented control frame, and a 64-bit length with its top bit.
        let mut t = FrameTracker::new();
        let _ = ends(&mut t, &[&frame(false, false, 0x8, None, 2)]);
        assert!(t.is_lost());
        let mut t = FrameTracker::new();
        let _ = t.step(&[0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 0]);
        assert!(t.is_lost());
    }

    #[test]
    fn close_frames_toward_the_client_are_plain_and_toward_the_app_masked() {
        let plain = close_frame(GOING_AWAY, None);
        assert_eq!(plain, vec![0x88, 2, 0x03, 0xe9]);
        let key = [0xa1, 0xb2, 0xc3, 0xd4];
        let masked = close_frame(GOING_AWAY, Some(key));
        assert_eq!(&masked[..6], &[0x88, 0x82, 0xa1, 0xb2, 0xc3, 0xd4]);
        let code = [masked[6] ^ key[0], masked[7] ^ key[1]];
        assert_eq!(u16::from_be_bytes(code), GOING_AWAY);
        // Both parse as one Close frame.
        for f in [plain, masked] {
            let found = ends(&mut FrameTracker::new(), &[&f]);
            assert_eq!(found.len(), 1);
            assert!(found[0].1.is_close());
        }
    }
}
