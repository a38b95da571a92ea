//! HTTP/2 frame headers, read out of a byte stream that may split them
//! anywhere.

pub(super) const FRAME_DATA: u8 = 0x0;
pub(super) const FRAME_HEADERS: u8 = 0x1;
pub(super) const FRAME_RST_STREAM: u8 = 0x3;
pub(super) const FRAME_SETTINGS: u8 = 0x4;
pub(super) const FRAME_PING: u8 = 0x6;
pub(super) const FRAME_GOAWAY: u8 = 0x7;
pub(super) const FLAG_END_STREAM: u8 = 0x1;
pub(super) const FLAG_ACK: u8 = 0x1;

/// Where the writer is in the frame stream h2 produces.
#[derive(Clone, Copy, Default)]
pub(super) struct FrameCursor {
    pub(super) header: [u8; 9],
    pub(super) header_len: u8,
    /// Payload bytes of the current frame still to come.
    pub(super) remaining: u32,
    /// Payload bytes of the current frame already passed.
    offset: u32,
}

/// What one written byte range means.
#[derive(Default)]
pub(super) struct Scan {
    /// Bytes up to and including the final GOAWAY (all of them if none).
    pub(super) keep: usize,
    /// Where in the range the GOAWAY's last-stream-id bytes lie:
    /// (index in the range, index in the 4-byte id).
    pub(super) patch: Vec<(usize, usize)>,
    /// The final GOAWAY ends inside the range.
    pub(super) final_end: bool,
}

impl FrameCursor {
    pub(super) fn kind(&self) -> u8 {
        self.header[3]
    }

    pub(super) fn stream_id(&self) -> u32 {
        u32::from_be_bytes([
            self.header[5],
            self.header[6],
            self.header[7],
            self.header[8],
        ]) & 0x7fff_ffff
    }

    /// Whether the frame under the cursor is its stream's last: DATA or
    /// HEADERS with END_STREAM, or RST_STREAM.
    pub(super) fn ends_stream(&self) -> bool {
        match self.kind() {
            FRAME_DATA | FRAME_HEADERS => self.header[4] & FLAG_END_STREAM != 0,
            FRAME_RST_STREAM => true,
            _ => false,
        }
    }

    /// Walks `data`, calling `frame_end` at the end of each frame; with
    /// `patching`, records where a GOAWAY's id lies and stops after it.
    pub(super) fn walk(
        &mut self,
        data: &[u8],
        patching: bool,
        mut frame_end: impl FnMut(&Self),
    ) -> Scan {
        let mut scan = Scan::default();
        let mut i = 0;
        while i < data.len() {
            if usize::from(self.header_len) < self.header.len() {
                self.header[usize::from(self.header_len)] = data[i];
                self.header_len += 1;
                i += 1;
                if usize::from(self.header_len) == self.header.len() {
                    self.remaining =
                        u32::from_be_bytes([0, self.header[0], self.header[1], self.header[2]]);
                    self.offset = 0;
                } else {
                    continue;
                }
            } else {
                let take = (self.remaining as usize).min(data.len() - i);
                if patching && self.kind() == FRAME_GOAWAY {
                    for k in 0..take {
                        let at = self.offset as usize + k;
                        if at < 4 {
                            scan.patch.push((i + k, at));
                        }
                    }
                }
                // `take` fits in u32: it is at most `remaining`.
                self.remaining -= take as u32;
                self.offset += take as u32;
                i += take;
            }
            if usize::from(self.header_len) == self.header.len() && self.remaining == 0 {
                frame_end(self);
                let goaway = self.kind() == FRAME_GOAWAY;
                self.header_len = 0;
                if patching && goaway {
                    scan.keep = i;
                    scan.final_end = true;
                    return scan;
                }
            }
        }
        scan.keep = data.len();
        scan
    }
}

#[cfg(test)]
pub(super) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_finds_stream_ends_and_the_goaway_id_across_splits() {
        let mut wire = frame(FRAME_DATA, 0, 1, b"abc");
        wire.extend(frame(FRAME_DATA, FLAG_END_STREAM, 1, b"d"));
        wire.extend(frame(FRAME_RST_STREAM, 0, 3, &[0, 0, 0, 2]));
        let goaway_at = wire.len();
        wire.extend(frame(FRAME_GOAWAY, 0, 0, &[0, 0, 0, 9, 0, 0, 0, 0]));
        wire.extend(frame(0x6, 0, 0, &[0; 8]));
        for split in 1..wire.len() {
            let mut cursor = FrameCursor::default();
            let mut ends = Vec::new();
            let mut patch = Vec::new();
            let mut keep = 0;
            for (offset, part) in [&wire[..split], &wire[split..]]
                .into_iter()
                .scan(0, |o, p| {
                    let at = *o;
                    *o += p.len();
                    Some((at, p))
                })
            {
                let scan = cursor.walk(part, true, |f| {
                    if f.ends_stream() {
                        ends.push(f.stream_id());
                    }
                });
                patch.extend(scan.patch.iter().map(|&(i, k)| (offset + i, k)));
                keep = offset + scan.keep;
                if scan.final_end {
                    break;
                }
            }
            assert_eq!(ends, vec![1, 3], "split at {split}");
            let want: Vec<(usize, usize)> = (0..4).map(|k| (goaway_at + 9 + k, k)).collect();
            assert_eq!(patch, want, "split at {split}");
            assert_eq!(keep, goaway_at + 17, "split at {split}");
        }
    }
}
