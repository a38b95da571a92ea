//! Finds where a chunked body ends without decoding it: the bytes are
//! relayed as they came, and this framer only follows the chunk sizes,
//! extensions and trailers to know when the message is over. It is as
//! strict as hyper's decoder, or stricter: sizes are 1 to 16 hex digits,
//! every line ends in CRLF (a bare LF is refused), the data of a chunk is
//! followed by CRLF, and extensions and trailers are bounded.

use super::super::path::hex;
use super::super::rules::TrailerName;

/// Bytes allowed for one chunk-size line's extensions.
const MAX_EXTENSION: u32 = 4096;
/// Bytes allowed for all trailer lines together.
const MAX_TRAILERS: u32 = 16 * 1024;
/// Hex digits in a chunk size: more cannot fit in a u64.
const MAX_SIZE_DIGITS: u8 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the hex digits of a chunk size.
    Size {
        digits: u8,
    },
    /// Spaces or tabs after the size, before `;` or CR.
    SizeSpace,
    /// Inside a chunk extension, up to CR.
    Extension,
    /// Saw the CR ending a size line; LF next.
    SizeLf,
    /// Inside chunk data.
    Data,
    /// After the data: CR, then LF.
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a trailer field's name, up to `:`.
    TrailerName,
    /// Inside a trailer line's value, up to CR.
    Trailer,
    /// CR of a trailer line seen; LF next.
    TrailerLf,
    /// CR of the final empty line seen; LF next.
    EndLf,
    Done,
}

/// A chunked body that breaks the framing rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadChunk;

#[derive(Debug, Clone)]
pub(crate) struct ChunkFramer {
    state: State,
    /// The size of the chunk being read, then what is left of its data.
    size: u64,
    /// Bytes of extensions on this line, or of trailers so far.
    extra: u32,
    /// Refuse trailer fields that may not be trailers (a request body's:
    /// proxy/rules.rs), and the name being read.
    strict: bool,
    name: TrailerName,
}

impl Default for ChunkFramer {
    fn default() -> Self {
        ChunkFramer {
            state: State::Size { digits: 0 },
            size: 0,
            extra: 0,
            strict: false,
            name: TrailerName::start(),
        }
    }
}

impl ChunkFramer {
    /// A framer for a request body: its trailers go to the app, so one
    /// that may not be a trailer (`Host`, `Content-Length`, ...) is
    /// refused like a malformed body (proxy/rules.rs).
    pub(crate) fn for_request() -> ChunkFramer {
        ChunkFramer {
            strict: true,
            ..ChunkFramer::default()
        }
    }

    /// Whether the last chunk and the trailers have been seen.
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Follows `data`, the next bytes of the body. Returns how many of them
    /// belong to the body: all of them, or fewer when the body ends inside
    /// (the rest is the next message).
    pub(crate) fn feed(&mut self, data: &[u8]) -> Result<usize, BadChunk> {
        let mut i = 0;
        while i < data.len() {
            if self.state == State::Data {
                // The bulk of the bytes: skip the chunk's data in one step.
                let left = (data.len() - i) as u64;
                let take = left.min(self.size);
                i += take as usize;
                self.size -= take;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            let b = data[i];
            i += 1;
            self.state = match self.state {
                State::Size { digits } => match hex(b) {
                    Some(v) => {
                        if digits >= MAX_SIZE_DIGITS {
                            return Err(BadChunk);
                        }
                        self.size = (self.size << 4) | u64::from(v);
                        State::Size { digits: digits + 1 }
                    }
                    None if digits == 0 => return Err(BadChunk),
                    None => self.after_size(b)?,
                },
                State::SizeSpace => self.after_size(b)?,
                State::Extension => match b {
                    b'\r' => State::SizeLf,
                    // Control bytes (bare LF included) are not extension text.
                    b'\t' => self.extension_byte()?,
                    0..=0x1f | 0x7f => return Err(BadChunk),
                    _ => self.extension_byte()?,
                },
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(BadChunk);
                    }
                    self.extra = 0;
                    if self.size == 0 {
                        State::TrailerStart
                    } else {
                        State::Data
                    }
                }
                State::DataCr => match b {
                    b'\r' => State::DataLf,
                    _ => return Err(BadChunk),
                },
                State::DataLf => match b {
                    b'\n' => {
                        self.size = 0;
                        State::Size { digits: 0 }
                    }
                    _ => return Err(BadChunk),
                },
                // A trailer is a header field: a token name, then `:` with
                // nothing between (what hyper, the app's likely parser,
                // takes; it refuses the body otherwise).
                State::TrailerStart => match b {
                    b'\r' => State::EndLf,
                    _ if is_tchar(b) => {
                        if self.strict {
                            self.name = TrailerName::start();
                            self.name.byte(b);
                        }
                        self.trailer_byte(State::TrailerName)?
                    }
                    _ => return Err(BadChunk),
                },
                State::TrailerName => match b {
                    b':' if self.strict && self.name.forbidden() => return Err(BadChunk),
                    b':' => self.trailer_byte(State::Trailer)?,
                    _ if is_tchar(b) => {
                        if self.strict {
                            self.name.byte(b);
                        }
                        self.trailer_byte(State::TrailerName)?
                    }
                    _ => return Err(BadChunk),
                },
                State::Trailer => match b {
                    b'\r' => State::TrailerLf,
                    b'\t' => self.trailer_byte(State::Trailer)?,
                    0..=0x1f | 0x7f => return Err(BadChunk),
                    _ => self.trailer_byte(State::Trailer)?,
                },
                State::TrailerLf => match b {
                    b'\n' => State::TrailerStart,
                    _ => return Err(BadChunk),
                },
                State::EndLf => match b {
                    b'\n' => {
                        self.state = State::Done;
                        return Ok(i);
                    }
                    _ => return Err(BadChunk),
                },
                State::Done => return Ok(i - 1),
                State::Data => State::Data,
            };
        }
        Ok(i)
    }

    /// The byte after a chunk size's digits.
    fn after_size(&self, b: u8) -> Result<State, BadChunk> {
        match b {
            b' ' | b'\t' => Ok(State::SizeSpace),
            b';' => Ok(State::Extension),
            b'\r' => Ok(State::SizeLf),
            _ => Err(BadChunk),
        }
    }

    fn extension_byte(&mut self) -> Result<State, BadChunk> {
        self.extra += 1;
        if self.extra > MAX_EXTENSION {
            return Err(BadChunk);
        }
        Ok(State::Extension)
    }

    fn trailer_byte(&mut self, next: State) -> Result<State, BadChunk> {
        self.extra += 1;
        if self.extra > MAX_TRAILERS {
            return Err(BadChunk);
        }
        Ok(next)
    }
}

/// A byte of an HTTP token (RFC 9110 `tchar`), as a field name is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `body` in pieces of `step` bytes; the body length found.
    fn frame(body: &[u8], step: usize) -> Result<Option<usize>, BadChunk> {
        let mut framer = ChunkFramer::default();
        let mut total = 0;
        for piece in body.chunks(step) {
            let n = framer.feed(piece)?;
            total += n;
            if framer.is_done() {
                return Ok(Some(total));
            }
            assert_eq!(n, piece.len());
        }
        Ok(None)
    }

    #[test]
    fn finds_the_end_whatever_the_pieces() {
        let body = b"5\r\nhello\r\na;name=v\r\n0123456789\r\n0\r\nX-Sum: 1\r\n\r\nGET / HTTP/1.1";
        let end = body.len() - "GET / HTTP/1.1".len();
        for step in 1..body.len() {
            assert_eq!(frame(body, step), Ok(Some(end)), "step {step}");
        }
    }

    #[test]
    fn an_unfinished_body_is_not_done() {
        assert_eq!(frame(b"5\r\nhel", 2), Ok(None));
        assert_eq!(frame(b"0\r\n", 1), Ok(None));
        assert_eq!(frame(b"0\r\n\r", 1), Ok(None));
    }

    #[test]
    fn big_sizes_and_upper_case_hex_pass() {
        let mut framer = ChunkFramer::default();
        assert_eq!(framer.feed(b"FFFFFFFFFFFFFFFF\r\n"), Ok(18));
        assert!(!framer.is_done());
        assert_eq!(
            frame(b"00000A \t;x\r\n0123456789\r\n0\r\n\r\n", 3),
            Ok(Some(29))
        );
    }

    #[test]
    fn bad_framing_is_refused() {
        let bad: [&[u8]; 15] = [
            b"zz\r\nhello\r\n0\r\n\r\n",
            b"123456789012345678901\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"-1\r\nx\r\n0\r\n\r\n",
            b"\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"0\r\n\n",
            b"0\r\nX: 1\n\r\n",
            b"+5\r\nhello\r\n0\r\n\r\n",
            b"5 5\r\nhello\r\n0\r\n\r\n",
            b"0\r\n folded: trailer\r\n\r\n",
            // Trailers hyper refuses: no name, a space before the colon,
            // no colon.
            b"0\r\n: v\r\n\r\n",
            b"0\r\nX-A : v\r\n\r\n",
            b"0\r\nno-colon\r\n\r\n",
        ];
        for body in bad {
            for step in [1, 3, body.len()] {
                assert_eq!(
                    frame(body, step),
                    Err(BadChunk),
                    "{:?} step {step}",
                    String::from_utf8_lossy(body)
                );
            }
        }
    }

    #[test]
    fn extensions_and_trailers_are_bounded() {
        let mut long = b"1;".to_vec();
        long.extend(std::iter::repeat_n(b'x', MAX_EXTENSION as usize + 1));
        assert_eq!(frame(&long, 1000), Err(BadChunk));
        let mut trailers = b"0\r\nX: ".to_vec();
        trailers.extend(std::iter::repeat_n(b'y', MAX_TRAILERS as usize));
        assert_eq!(frame(&trailers, 1000), Err(BadChunk));
    }

    #[test]
    fn a_request_body_with_a_forbidden_trailer_is_refused() {
        let body = b"5\r\nhello\r\n0\r\nX-Sum: 1\r\nhOsT: evil\r\n\r\n";
        let mut framer = ChunkFramer::for_request();
        assert_eq!(framer.feed(body), Err(BadChunk));
        // Split inside the name: the same answer.
        let mut framer = ChunkFramer::for_request();
        let at = body.len() - 12;
        assert!(framer.feed(&body[..at]).is_ok());
        assert_eq!(framer.feed(&body[at..]), Err(BadChunk));
        // A response's (relayed to the client as hyper would) and allowed
        // names pass.
        assert_eq!(ChunkFramer::default().feed(body), Ok(body.len()));
        let fine = b"0\r\nX-Sum: 1\r\nHostname: a\r\n\r\n";
        assert_eq!(ChunkFramer::for_request().feed(fine), Ok(fine.len()));
    }
}
