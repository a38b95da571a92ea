//! The Huffman code of HPACK string literals (RFC 7541 §5.2, Appendix B).
//!
//! [`CODES`] is Appendix B transcribed: one `(code, bits)` pair per symbol,
//! 0 to 255 and EOS (256), the code right-aligned as in the appendix's hex
//! column. Everything the decoder uses is derived from it at compile time,
//! and the derivation asserts that the table is the canonical, complete
//! code the RFC says it is: a mistyped row fails the build, not a request.
//!
//! Decoding takes the next 8 bits to a 256-entry table, which resolves
//! every code of 8 bits or fewer (all of `a-z`, `0-9` and most of the
//! punctuation in real headers); a longer code is found by comparing the
//! next 30 bits against the canonical limits of each length.

use super::HpackError;

/// RFC 7541 Appendix B: `(code as hex aligned to LSB, len in bits)`.
#[rustfmt::skip]
const CODES: [(u32, u8); 257] = [
    // 0-31: control characters
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28),
    (0xfffffe4, 28), (0xfffffe5, 28), (0xfffffe6, 28), (0xfffffe7, 28),
    (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28),
    (0xfffffed, 28), (0xfffffee, 28), (0xfffffef, 28), (0xffffff0, 28),
    (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28),
    (0xffffff8, 28), (0xffffff9, 28), (0xffffffa, 28), (0xffffffb, 28),
    // 32-63: ' ' ! " # $ % & ' ( ) * + , - . / 0-9 : ; < = > ?
    (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11),
    (0x3fa, 10), (0x3fb, 10), (0xf9, 8), (0x7fb, 11),
    (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6),
    (0x1a, 6), (0x1b, 6), (0x1c, 6), (0x1d, 6),
    (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10),
    // 64-95: @ A-Z [ \ ] ^ _
    (0x1ffa, 13), (0x21, 6), (0x5d, 7), (0x5e, 7),
    (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7),
    (0x67, 7), (0x68, 7), (0x69, 7), (0x6a, 7),
    (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7),
    (0xfc, 8), (0x73, 7), (0xfd, 8), (0x1ffb, 13),
    (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    // 96-127: ` a-z { | } ~ DEL
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5),
    (0x24, 6), (0x5, 5), (0x25, 6), (0x26, 6),
    (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5),
    (0x2b, 6), (0x76, 7), (0x2c, 6), (0x8, 5),
    (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15),
    (0x7fc, 11), (0x3ffd, 14), (0x1ffd, 13), (0xffffffc, 28),
    // 128-159
    (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23),
    (0x3fffd6, 22), (0x7fffda, 23), (0x7fffdb, 23), (0x7fffdc, 23),
    (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23),
    (0xffffee, 24), (0x7fffe1, 23), (0x7fffe2, 23), (0x7fffe3, 23),
    (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24),
    // 160-191
    (0x3fffda, 22), (0x1fffdd, 21), (0xfffe9, 20), (0x3fffdb, 22),
    (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24),
    (0x1fffdf, 21), (0x3fffdf, 22), (0x7fffeb, 23), (0x7fffec, 23),
    (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23),
    (0xfffea, 20), (0x3fffe2, 22), (0x3fffe3, 22), (0x3fffe4, 22),
    (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    // 192-223
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19),
    (0x3fffe7, 22), (0x7ffff2, 23), (0x3fffe8, 22), (0x1ffffec, 25),
    (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25),
    (0x7fff2, 19), (0x1fffe3, 21), (0x3ffffe6, 26), (0x7ffffe0, 27),
    (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26),
    (0xffffffd, 28), (0x7ffffe3, 27), (0x7ffffe4, 27), (0x7ffffe5, 27),
    // 224-255
    (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23),
    (0x3fffea, 22), (0x3fffeb, 22), (0x1ffffee, 25), (0x1ffffef, 25),
    (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26),
    (0x7ffffe7, 27), (0x7ffffe8, 27), (0x7ffffe9, 27), (0x7ffffea, 27),
    (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26),
    // EOS
    (0x3fffffff, 30),
];

const EOS: u16 = 256;
/// The longest code (EOS's).
const MAX_BITS: u32 = 30;
/// Codes this short resolve in one lookup of the next 8 bits.
const FAST_BITS: u32 = 8;

/// What the decoder needs, derived from [`CODES`].
struct Derived {
    /// By the next 8 bits: `(symbol, bits)`, or bits 0 for a longer code.
    fast: [(u8, u8); 1 << FAST_BITS],
    /// By length L: one past the last code of length L, left-aligned to
    /// 30 bits. In a canonical code every code of length L is above every
    /// shorter one so aligned, so the length of the code starting the next
    /// 30 bits is the smallest L whose limit is above them.
    limit: [u32; MAX_BITS as usize + 1],
    /// By length: the first code of that length (right-aligned).
    first: [u32; MAX_BITS as usize + 1],
    /// By length: where that length's symbols start in `sorted`.
    offset: [u16; MAX_BITS as usize + 1],
    /// Symbols in code order.
    sorted: [u16; 257],
}

const fn derive() -> Derived {
    let mut d = Derived {
        fast: [(0, 0); 1 << FAST_BITS],
        limit: [0; MAX_BITS as usize + 1],
        first: [0; MAX_BITS as usize + 1],
        offset: [0; MAX_BITS as usize + 1],
        sorted: [0; 257],
    };
    // The canonical construction: codes of each length follow the last
    // code of the shorter lengths, in symbol order (RFC 7541 [CANONICAL]).
    let mut code: u32 = 0;
    let mut n = 0;
    let mut len = 1;
    while len <= MAX_BITS {
        d.first[len as usize] = code;
        d.offset[len as usize] = n as u16;
        let mut sym = 0;
        while sym < CODES.len() {
            if CODES[sym].1 as u32 == len {
                assert!(
                    CODES[sym].0 == code,
                    "RFC 7541 Appendix B transcription: a code is not canonical"
                );
                d.sorted[n] = sym as u16;
                n += 1;
                code += 1;
            }
            sym += 1;
        }
        d.limit[len as usize] = code << (MAX_BITS - len);
        code <<= 1;
        len += 1;
    }
    assert!(n == CODES.len(), "a code length outside 1..=30");
    // Complete: the last code (EOS) is all ones, no bit pattern is unused.
    assert!(
        d.limit[MAX_BITS as usize] == 1 << MAX_BITS,
        "the code is not complete"
    );
    let mut sym = 0;
    while sym < 256 {
        let (code, bits) = CODES[sym];
        let bits = bits as u32;
        if bits <= FAST_BITS {
            let prefix = (code << (FAST_BITS - bits)) as usize;
            let mut k = 0;
            while k < 1 << (FAST_BITS - bits) {
                d.fast[prefix + k] = (sym as u8, bits as u8);
                k += 1;
            }
        }
        sym += 1;
    }
    d
}

static DERIVED: Derived = derive();

/// The symbol whose code starts the 30 bits `next` (left-aligned), and its
/// length in bits.
#[inline]
fn symbol(next: u32) -> (u16, u32) {
    let (sym, bits) = DERIVED.fast[(next >> (MAX_BITS - FAST_BITS)) as usize];
    if bits != 0 {
        return (u16::from(sym), u32::from(bits));
    }
    let mut len = FAST_BITS + 1;
    // Terminates: `next` < 2^30 = limit[30].
    while next >= DERIVED.limit[len as usize] {
        len += 1;
    }
    let code = next >> (MAX_BITS - len);
    let at = u32::from(DERIVED.offset[len as usize]) + (code - DERIVED.first[len as usize]);
    (DERIVED.sorted[at as usize], len)
}

/// Appends the decoding of `input` to `out`, refusing to append more than
/// `cap` octets (a hostile string is stopped at the bound, not after).
pub(crate) fn decode(input: &[u8], out: &mut Vec<u8>, cap: usize) -> Result<(), HpackError> {
    // At most 8 symbols per 5 octets (the shortest code is 5 bits).
    out.reserve((input.len() * 8 / 5).min(cap));
    let mut produced = 0usize;
    // Bits not yet decoded, right-aligned in `acc`; `bits` of them.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    let mut rest = input.iter();
    loop {
        // Refill while a whole octet fits (acc stays below 2^64).
        while bits <= 56 {
            let Some(&b) = rest.next() else { break };
            acc = (acc << 8) | u64::from(b);
            bits += 8;
        }
        if bits == 0 {
            return Ok(());
        }
        let next = if bits >= MAX_BITS {
            ((acc >> (bits - MAX_BITS)) as u32) & ((1 << MAX_BITS) - 1)
        } else {
            // Fewer than 30 bits left: pretend the rest are ones, the
            // padding's value; a code reaching into them is padding.
            ((acc << (MAX_BITS - bits)) as u32) | ((1 << (MAX_BITS - bits)) - 1)
        };
        let (sym, len) = symbol(next);
        if len > bits {
            // §5.2: padding is the most significant bits of EOS (ones),
            // strictly shorter than 8 bits; anything else is an error.
            let ones = (1u64 << bits) - 1;
            if bits > 7 || acc & ones != ones {
                return Err(HpackError::HuffmanPadding);
            }
            return Ok(());
        }
        if sym == EOS {
            return Err(HpackError::HuffmanEos);
        }
        if produced == cap {
            return Err(HpackError::StringTooLong);
        }
        // `sym` < 256 here: EOS was refused above.
        out.push(sym as u8);
        produced += 1;
        bits -= len;
        acc &= (1u64 << bits) - 1;
    }
}

/// The length of `s` Huffman-coded, padding included.
pub(crate) fn encoded_len(s: &[u8]) -> usize {
    let bits: usize = s
        .iter()
        .map(|&b| usize::from(CODES[usize::from(b)].1))
        .sum();
    bits.div_ceil(8)
}

/// Appends `s` Huffman-coded, padded to an octet with ones (EOS's prefix).
pub(crate) fn encode(s: &[u8], out: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    for &b in s {
        let (code, len) = CODES[usize::from(b)];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
        acc &= (1u64 << bits) - 1;
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) as u8) | ((1u8 << pad) - 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(input: &[u8]) -> Result<Vec<u8>, HpackError> {
        let mut out = Vec::new();
        decode(input, &mut out, usize::MAX).map(|()| out)
    }

    #[test]
    fn every_symbol_round_trips_alone_and_after_each_other_symbol() {
        for a in 0..=255u8 {
            for s in [vec![a], vec![a, b'a'], vec![b'z', a, 0xff, a]] {
                let mut wire = Vec::new();
                encode(&s, &mut wire);
                assert_eq!(wire.len(), encoded_len(&s));
                assert_eq!(decoded(&wire), Ok(s.clone()), "symbol {a}");
            }
        }
    }

    #[test]
    fn rfc_examples_decode() {
        // RFC 7541 C.4.1 and C.6.1 values.
        let www = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        assert_eq!(decoded(&www).as_deref(), Ok(&b"www.example.com"[..]));
        assert_eq!(decoded(&[0x64, 0x02]).as_deref(), Ok(&b"302"[..]));
        let private = [0xae, 0xc3, 0x77, 0x1a, 0x4b];
        assert_eq!(decoded(&private).as_deref(), Ok(&b"private"[..]));
    }

    #[test]
    fn eos_in_the_string_is_refused() {
        // EOS (30 ones) then two padding ones.
        assert_eq!(
            decoded(&[0xff, 0xff, 0xff, 0xff]),
            Err(HpackError::HuffmanEos)
        );
        // 'a' (00011) then EOS.
        let mut wire = Vec::new();
        let bits = (0b00011u64 << 30) | 0x3fff_ffff; // 35 bits
        let padded = (bits << 5) | 0x1f; // 40 bits
        wire.extend_from_slice(&padded.to_be_bytes()[3..]);
        assert_eq!(decoded(&wire), Err(HpackError::HuffmanEos));
    }

    #[test]
    fn padding_must_be_ones_and_shorter_than_an_octet() {
        // 'a' = 00011, padding 111: fine.
        assert_eq!(decoded(&[0b0001_1111]).as_deref(), Ok(&b"a"[..]));
        // Padding 110: not all ones.
        assert_eq!(decoded(&[0b0001_1110]), Err(HpackError::HuffmanPadding));
        // 'a' then 11 ones of padding: 8 bits or more.
        assert_eq!(
            decoded(&[0b0001_1111, 0xff]),
            Err(HpackError::HuffmanPadding)
        );
        // A whole octet of ones alone is padding of 8 bits.
        assert_eq!(decoded(&[0xff]), Err(HpackError::HuffmanPadding));
        // The empty string is zero octets.
        assert_eq!(decoded(&[]).as_deref(), Ok(&b""[..]));
    }

    #[test]
    fn the_cap_stops_decoding_at_the_bound() {
        let mut wire = Vec::new();
        encode(b"abcdef", &mut wire);
        let mut out = Vec::new();
        assert_eq!(decode(&wire, &mut out, 6), Ok(()));
        out.clear();
        assert_eq!(decode(&wire, &mut out, 5), Err(HpackError::StringTooLong));
        assert_eq!(out.len(), 5);
    }
}
