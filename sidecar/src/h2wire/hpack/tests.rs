//! RFC 7541 Appendix C both ways, the decoder's bounds at and one past
//! each limit, the proxy policy, and a round-trip property.

use proptest::prelude::*;

use super::encoder::{IndexPolicy, StringCoding};
use super::table::DynamicTable;
use super::*;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|pair| {
            let text = std::str::from_utf8(pair).expect("ascii");
            u8::from_str_radix(text, 16).expect("hex digit pair")
        })
        .collect()
}

type Pairs = &'static [(&'static str, &'static str)];

/// One header list of an Appendix C sequence.
struct Step {
    /// The block without Huffman coding (C.2, C.3, C.5)...
    plain: &'static str,
    /// ...and with (C.4, C.6; the same as `plain` where C has only one).
    huffman: &'static str,
    fields: Pairs,
    /// The dynamic table after it, newest first, and its size.
    table: Pairs,
    size: usize,
}

const DATE_21: &str = "Mon, 21 Oct 2013 20:13:21 GMT";
const DATE_22: &str = "Mon, 21 Oct 2013 20:13:22 GMT";
const LOCATION: &str = "https://www.example.com";
const COOKIE: &str = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";

const REQUEST_1: Pairs = &[
    (":method", "GET"),
    (":scheme", "http"),
    (":path", "/"),
    (":authority", "www.example.com"),
];
const REQUEST_2: Pairs = &[
    (":method", "GET"),
    (":scheme", "http"),
    (":path", "/"),
    (":authority", "www.example.com"),
    ("cache-control", "no-cache"),
];
const REQUEST_3: Pairs = &[
    (":method", "GET"),
    (":scheme", "https"),
    (":path", "/index.html"),
    (":authority", "www.example.com"),
    ("custom-key", "custom-value"),
];
const TABLE_1: Pairs = &[(":authority", "www.example.com")];
const TABLE_2: Pairs = &[
    ("cache-control", "no-cache"),
    (":authority", "www.example.com"),
];
const TABLE_3: Pairs = &[
    ("custom-key", "custom-value"),
    ("cache-control", "no-cache"),
    (":authority", "www.example.com"),
];
const RESPONSE_1: Pairs = &[
    (":status", "302"),
    ("cache-control", "private"),
    ("date", DATE_21),
    ("location", LOCATION),
];
const RESPONSE_2: Pairs = &[
    (":status", "307"),
    ("cache-control", "private"),
    ("date", DATE_21),
    ("location", LOCATION),
];
const RESPONSE_3: Pairs = &[
    (":status", "200"),
    ("cache-control", "private"),
    ("date", DATE_22),
    ("location", LOCATION),
    ("content-encoding", "gzip"),
    ("set-cookie", COOKIE),
];
const RTABLE_1: Pairs = &[
    ("location", LOCATION),
    ("date", DATE_21),
    ("cache-control", "private"),
    (":status", "302"),
];
const RTABLE_2: Pairs = &[
    (":status", "307"),
    ("location", LOCATION),
    ("date", DATE_21),
    ("cache-control", "private"),
];
const RTABLE_3: Pairs = &[
    ("set-cookie", COOKIE),
    ("content-encoding", "gzip"),
    ("date", DATE_22),
];

/// Names and values, in order.
type Fields<'a> = Vec<(&'a [u8], &'a [u8])>;

fn bytes(pairs: Pairs) -> Fields<'static> {
    pairs
        .iter()
        .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
        .collect()
}

/// A dynamic table's entries, newest first, and its size.
fn entries(table: &DynamicTable) -> (Fields<'_>, usize) {
    let list = (0..table.len()).filter_map(|i| table.get(i)).collect();
    (list, table.size())
}

/// Decodes each step with one decoder and encodes it with one encoder:
/// the fields and table after each, and the encoder's bytes, must be the
/// RFC's.
fn run(table_size: usize, huffman: bool, steps: &[Step]) {
    let mut decoder = Decoder::new(table_size, Limits::default());
    let strings = if huffman {
        StringCoding::HuffmanUnlessLonger
    } else {
        StringCoding::Raw
    };
    let options = EncoderOptions {
        policy: IndexPolicy::All,
        strings,
        max_table_size: table_size,
    };
    let mut encoder = Encoder::new(table_size, options);
    let mut block = HeaderBlock::default();
    for (n, step) in steps.iter().enumerate() {
        let at = format!("table {table_size}, huffman {huffman}, step {n}");
        let wire = hex(if huffman { step.huffman } else { step.plain });
        decoder.decode(&wire, &mut block).expect("decodes");
        let got: Fields<'_> = block.iter().map(|f| (f.name, f.value)).collect();
        assert_eq!(got, bytes(step.fields), "{at}: fields");
        let want = (bytes(step.table), step.size);
        assert_eq!(entries(decoder.table()), want, "{at}: decoder table");
        let mut out = Vec::new();
        let fields = bytes(step.fields)
            .into_iter()
            .map(|(n, v)| FieldRef::new(n, v));
        encoder.encode(fields, &mut out);
        assert_eq!(out, wire, "{at}: encoder bytes");
        assert_eq!(entries(encoder.table()), want, "{at}: encoder table");
    }
}

#[test]
fn c2_1_literal_with_indexing() {
    let wire = "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572";
    let step = Step {
        plain: wire,
        huffman: wire,
        fields: &[("custom-key", "custom-header")],
        table: &[("custom-key", "custom-header")],
        size: 55,
    };
    run(4096, false, &[step]);
}

/// C.2.2 and C.2.3: literals the table does not keep, decoded and
/// passed on as they came (a never-indexed one stays so even under the
/// policy that indexes everything).
#[test]
fn c2_2_and_c2_3_literals_not_indexed() {
    let examples = [
        ("040c 2f73 616d 706c 652f 7061 7468", IndexPolicy::Proxy),
        (
            "1008 7061 7373 776f 7264 0673 6563 7265 74",
            IndexPolicy::All,
        ),
    ];
    let want = [
        (&b":path"[..], &b"/sample/path"[..], false, 4),
        (b"password", b"secret", true, 0),
    ];
    for ((text, policy), want) in examples.into_iter().zip(want) {
        let wire = hex(text);
        let mut decoder = Decoder::new(4096, Limits::default());
        let block = decode_with(&mut decoder, &wire).expect("decodes");
        let got: Vec<_> = block
            .iter()
            .map(|f| (f.name, f.value, f.sensitive, f.static_name))
            .collect();
        assert_eq!((got, decoder.table().len()), (vec![want], 0));
        let options = EncoderOptions {
            policy,
            strings: StringCoding::Raw,
            ..EncoderOptions::default()
        };
        let mut encoder = Encoder::new(4096, options);
        let mut out = Vec::new();
        encoder.encode(block.iter(), &mut out);
        assert_eq!((out, encoder.table().len()), (wire, 0));
    }
}

#[test]
fn c2_4_indexed() {
    let mut decoder = Decoder::new(4096, Limits::default());
    let mut block = HeaderBlock::default();
    decoder.decode(&[0x82], &mut block).expect("decodes");
    let f = block.get(0).expect("one field");
    assert_eq!((f.name, f.value), (&b":method"[..], &b"GET"[..]));
    let mut out = Vec::new();
    Encoder::new(4096, EncoderOptions::default())
        .encode([FieldRef::new(b":method", b"GET")], &mut out);
    assert_eq!(out, [0x82]);
}

/// C.3 (plain) and C.4 (Huffman): three requests on one connection.
const REQUESTS: [Step; 3] = [
    Step {
        plain: "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        huffman: "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        fields: REQUEST_1,
        table: TABLE_1,
        size: 57,
    },
    Step {
        plain: "8286 84be 5808 6e6f 2d63 6163 6865",
        huffman: "8286 84be 5886 a8eb 1064 9cbf",
        fields: REQUEST_2,
        table: TABLE_2,
        size: 110,
    },
    Step {
        plain: "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        huffman: "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        fields: REQUEST_3,
        table: TABLE_3,
        size: 164,
    },
];

/// C.5 (plain) and C.6 (Huffman): three responses with a 256-octet table,
/// so entries are evicted.
const RESPONSES: [Step; 3] = [
    Step {
        plain: "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133
                2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70
                6c65 2e63 6f6d",
        huffman: "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6
                  2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        fields: RESPONSE_1,
        table: RTABLE_1,
        size: 222,
    },
    Step {
        plain: "4803 3330 37c1 c0bf",
        huffman: "4883 640e ffc1 c0bf",
        fields: RESPONSE_2,
        table: RTABLE_2,
        size: 222,
    },
    Step {
        plain: "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d
                54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049
                5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e
                3d31",
        huffman: "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab
                  77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f
                  9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        fields: RESPONSE_3,
        table: RTABLE_3,
        size: 215,
    },
];

/// C.3 to C.6: each sequence on a fresh decoder and encoder.
#[test]
fn c3_to_c6_requests_and_responses_with_and_without_huffman() {
    for (table_size, steps) in [(4096, &REQUESTS), (256, &RESPONSES)] {
        for huffman in [false, true] {
            run(table_size, huffman, steps);
        }
    }
}

fn decode_with(decoder: &mut Decoder, wire: &[u8]) -> Result<HeaderBlock, HpackError> {
    let mut block = HeaderBlock::default();
    decoder.decode(wire, &mut block).map(|()| block)
}

#[test]
fn c1_integers_both_ways() {
    for (value, prefix, wire) in [
        (10, 5, &[0x0a][..]),
        (1337, 5, &[0x1f, 0x9a, 0x0a]),
        (42, 8, &[0x2a]),
    ] {
        let mut out = Vec::new();
        encode_int(&mut out, 0, prefix, value);
        assert_eq!(out, wire, "{value} on {prefix} bits");
        assert_eq!(Cursor::new(wire).int(prefix), Ok(value as u32));
    }
}

#[test]
fn integers_at_their_bound_and_past_it() {
    let mut wire = Vec::new();
    encode_int(&mut wire, 0, 5, u32::MAX as usize);
    assert_eq!(Cursor::new(&wire).int(5), Ok(u32::MAX));
    wire.clear();
    encode_int(&mut wire, 0, 5, u32::MAX as usize + 1);
    assert_eq!(Cursor::new(&wire).int(5), Err(HpackError::IntegerOverflow));
    // 1337 with a 5-bit prefix (C.1.2), then zero-padded to the most
    // continuation octets allowed, then one more.
    assert_eq!(Cursor::new(&[0x1f, 0x9a, 0x0a]).int(5), Ok(1337));
    assert_eq!(
        Cursor::new(&[0x1f, 0x9a, 0x8a, 0x80, 0x80, 0x00]).int(5),
        Ok(1337)
    );
    assert_eq!(
        Cursor::new(&[0x1f, 0x9a, 0x8a, 0x80, 0x80, 0x80, 0x00]).int(5),
        Err(HpackError::IntegerOverflow)
    );
    assert_eq!(
        Cursor::new(&[0x1f, 0x9a]).int(5),
        Err(HpackError::Truncated)
    );
    assert_eq!(Cursor::new(&[0x2a]).int(8), Ok(42));
}

#[test]
fn strings_at_the_length_limit_and_one_past() {
    let limits = Limits {
        max_string_len: 10,
        max_list_size: 1 << 20,
    };
    for strings in [StringCoding::Raw, StringCoding::HuffmanIfShorter] {
        let options = EncoderOptions {
            policy: IndexPolicy::None,
            strings,
            ..EncoderOptions::default()
        };
        for (len, ok) in [(10, true), (11, false)] {
            let value = vec![b'a'; len];
            let mut wire = Vec::new();
            Encoder::new(4096, options).encode([FieldRef::new(b"x", &value)], &mut wire);
            let got = decode_with(&mut Decoder::new(4096, limits), &wire);
            assert_eq!(got.is_ok(), ok, "len {len} {strings:?}");
            if !ok {
                assert_eq!(got.err(), Some(HpackError::StringTooLong));
            }
        }
    }
    // A length past the block is truncation, not an allocation.
    let got = decode_with(
        &mut Decoder::new(4096, limits),
        &[0x00, 0x01, b'x', 0x7f, 0xff, 0xff, 0x03],
    );
    assert_eq!(got.err(), Some(HpackError::Truncated));
}

#[test]
fn the_list_limit_fails_the_stream_and_keeps_the_table_in_step() {
    // Two fields of 1 + 1 + 32 octets: 68 fits in 68, not in 67.
    let fields = [FieldRef::new(b"a", b"1"), FieldRef::new(b"b", b"2")];
    let options = EncoderOptions {
        policy: IndexPolicy::All,
        strings: StringCoding::Raw,
        ..EncoderOptions::default()
    };
    for (max, ok) in [(68, true), (67, false)] {
        let limits = Limits {
            max_string_len: 100,
            max_list_size: max,
        };
        let mut encoder = Encoder::new(4096, options);
        let mut decoder = Decoder::new(4096, limits);
        let mut wire = Vec::new();
        encoder.encode(fields, &mut wire);
        let got = decode_with(&mut decoder, &wire);
        assert_eq!(
            got.as_ref().map(HeaderBlock::list_size).ok(),
            ok.then_some(68)
        );
        if !ok {
            assert_eq!(got.err(), Some(HpackError::ListTooLarge));
            assert!(!HpackError::ListTooLarge.ends_connection());
        }
        // Both entries went into the table even when the stream failed:
        // the next block's indexes resolve.
        wire.clear();
        encoder.encode([FieldRef::new(b"b", b"2")], &mut wire);
        assert_eq!(wire, [0x80 | 62]);
        let block = decode_with(&mut decoder, &wire).expect("in step");
        assert_eq!(
            block.get(0).map(|f| (f.name, f.value)),
            Some((&b"b"[..], &b"2"[..]))
        );
    }
}

#[test]
fn indexes_into_a_large_entry_stop_at_the_list_limit() {
    let limits = Limits {
        max_string_len: 4096,
        max_list_size: 16 << 10,
    };
    let mut decoder = Decoder::new(4096, limits);
    // A literal with indexing of a 4000-octet value, then 1000 indexes
    // of it: 4 MB if copied, refused after 4 copies.
    let mut wire = vec![0x40, 0x01, b'x'];
    encode_int(&mut wire, 0, 7, 4000);
    wire.extend(std::iter::repeat_n(b'v', 4000));
    wire.extend(std::iter::repeat_n(0x80 | 62, 1000));
    // And 1000 literals without indexing that name the entry (index 62
    // on 4 bits: 0x0f 0x2f) with an empty value: passed over.
    for _ in 0..1000 {
        wire.extend_from_slice(&[0x0f, 0x2f, 0x00]);
    }
    let mut block = HeaderBlock::default();
    assert_eq!(
        decoder.decode(&wire, &mut block),
        Err(HpackError::ListTooLarge)
    );
    assert!(block.is_empty());
    assert!(
        block.bytes.capacity() <= (16 << 10) + 8192,
        "{}",
        block.bytes.capacity()
    );
    // Still in step: the entry is there; and past the limit a bad index
    // (63 on 4 bits: 0x0f 0x30) still ends the connection.
    let entry = decoder.table().get(0).map(|(n, v)| (n, v.len()));
    assert_eq!(entry, Some((&b"x"[..], 4000)));
    let past = [0xbe, 0xbe, 0xbe, 0xbe, 0xbe, 0x0f, 0x30, 0x00];
    assert_eq!(decoder.decode(&past, &mut block), Err(HpackError::BadIndex));
}

#[test]
fn table_size_updates_are_bounded_by_our_setting_and_placed_first() {
    let mut decoder = Decoder::new(4096, Limits::default());
    // 0x3f e1 1f = 4096 with a 5-bit prefix: at the setting.
    assert!(decode_with(&mut decoder, &[0x3f, 0xe1, 0x1f, 0x82]).is_ok());
    // 4097: one past.
    assert_eq!(
        decode_with(&mut decoder, &[0x3f, 0xe2, 0x1f]).err(),
        Some(HpackError::TableSizeTooLarge)
    );
    // After a field.
    assert_eq!(
        decode_with(&mut decoder, &[0x82, 0x20]).err(),
        Some(HpackError::TableSizeMisplaced)
    );
    // We lower our setting: the next block must open with an update.
    let mut decoder = Decoder::new(4096, Limits::default());
    decoder.set_settings_size(100);
    assert_eq!(
        decode_with(&mut decoder, &[0x82]).err(),
        Some(HpackError::TableSizeUpdateMissing)
    );
    let mut decoder = Decoder::new(4096, Limits::default());
    decoder.set_settings_size(100);
    assert_eq!(
        decode_with(&mut decoder, &[0x3f, 0x46]).err(),
        Some(HpackError::TableSizeTooLarge)
    );
    // 0x3f 0x45 = 100: at the new setting; two updates in a row are fine.
    assert!(decode_with(&mut decoder, &[0x20, 0x3f, 0x45, 0x82]).is_ok());
    assert!(decode_with(&mut decoder, &[0x82]).is_ok());
}

#[test]
fn bad_indexes_are_refused() {
    let mut decoder = Decoder::new(4096, Limits::default());
    assert_eq!(
        decode_with(&mut decoder, &[0x80]).err(),
        Some(HpackError::BadIndex)
    );
    assert_eq!(
        decode_with(&mut decoder, &[0x80 | 62]).err(),
        Some(HpackError::BadIndex)
    );
    assert_eq!(
        decode_with(&mut decoder, &[0x40 | 62, 0x00]).err(),
        Some(HpackError::BadIndex)
    );
    assert_eq!(
        decode_with(&mut decoder, &[0x80 | 61]).map(|b| b.len()),
        Ok(1)
    );
    assert_eq!(
        decode_with(&mut decoder, &[0x41]).err(),
        Some(HpackError::Truncated)
    );
}

#[test]
fn the_proxy_policy_indexes_what_repeats_only() {
    let mut encoder = Encoder::new(4096, EncoderOptions::default());
    let mut decoder = Decoder::new(4096, Limits::default());
    let request = |timeout: &'static [u8]| {
        [
            FieldRef::new(b":method", b"POST"),
            FieldRef::new(b":scheme", b"http"),
            FieldRef::new(b":path", b"/helloworld.Greeter/SayHello"),
            FieldRef::new(b":authority", b"greeter.default.svc:50051"),
            FieldRef::new(b"content-type", b"application/grpc"),
            FieldRef::new(b"te", b"trailers"),
            FieldRef::new(b"grpc-timeout", timeout),
            FieldRef::new(b"authorization", b"Bearer abcdefghijklmnopqrstuvwxyz"),
            FieldRef::new(b"x-request-id", b"f3a1").sensitive(),
        ]
    };
    let mut first = Vec::new();
    encoder.encode(request(b"99m"), &mut first);
    assert_eq!(
        encoder.table().len(),
        4,
        "path, authority, content-type, te"
    );
    let mut second = Vec::new();
    encoder.encode(request(b"98m"), &mut second);
    assert_eq!(encoder.table().len(), 4, "nothing new the second time");
    // POST, http, then the four entries (newest, te, is 62).
    assert_eq!(second[..6], [0x83, 0x86, 0xc1, 0xc0, 0xbf, 0xbe]);
    assert!(
        second.len() < first.len(),
        "{} then {}",
        first.len(),
        second.len()
    );
    for wire in [&first, &second] {
        let block = decode_with(&mut decoder, wire).expect("decodes");
        let sensitive: Vec<&[u8]> = block
            .iter()
            .filter(|f| f.sensitive)
            .map(|f| f.name)
            .collect();
        assert_eq!(sensitive, [&b"authorization"[..], b"x-request-id"]);
        assert_eq!(block.len(), 9);
    }
    assert_eq!(decoder.table().len(), 4);
    // A REST path with an id is not indexed.
    encoder.encode([FieldRef::new(b":path", b"/items/12345")], &mut Vec::new());
    assert_eq!(encoder.table().len(), 4);
}

#[test]
fn the_proxy_policy_huffman_codes_what_it_indexes_only() {
    let mut encoder = Encoder::new(4096, EncoderOptions::default());
    let mut out = Vec::new();
    encoder.encode(
        [
            FieldRef::new(b"content-type", b"application/grpc"),
            FieldRef::new(b"grpc-timeout", b"99m"),
            FieldRef::new(b"x-forwarded-for", b"10.0.0.7"),
        ],
        &mut out,
    );
    let huffman = |s: &[u8]| {
        let mut coded = Vec::new();
        super::huffman::encode(s, &mut coded);
        coded
    };
    let mut want = vec![0x5f, 0x80 | 11];
    want.extend(huffman(b"application/grpc"));
    want.extend([0x00, 12]);
    want.extend(b"grpc-timeout");
    want.extend([3]);
    want.extend(b"99m");
    want.extend([0x00, 15]);
    want.extend(b"x-forwarded-for");
    want.extend([8]);
    want.extend(b"10.0.0.7");
    assert_eq!(huffman(b"application/grpc").len(), 11);
    assert_eq!(out, want);
    assert_eq!(out.capacity(), 256, "an empty buffer is sized once");
    assert_eq!(encoder.table().len(), 1);
    // The RFC's policy (every field indexed) codes them all.
    let options = EncoderOptions {
        policy: IndexPolicy::All,
        ..EncoderOptions::default()
    };
    let mut all = Vec::new();
    Encoder::new(4096, options).encode([FieldRef::new(b"grpc-timeout", b"99m")], &mut all);
    assert_eq!(all[..2], [0x40, 0x80 | 9]);
}

#[test]
fn the_encoder_signals_the_smallest_then_the_final_table_size() {
    let mut encoder = Encoder::new(4096, EncoderOptions::default());
    encoder.encode(
        [FieldRef::new(b":authority", b"a.example")],
        &mut Vec::new(),
    );
    encoder.set_peer_settings_size(0);
    encoder.set_peer_settings_size(1024);
    let mut wire = Vec::new();
    encoder.encode([], &mut wire);
    // 0, then 1024 (0x3f e1 07).
    assert_eq!(wire, [0x20, 0x3f, 0xe1, 0x07]);
    assert_eq!(encoder.table().len(), 0);
    // Our own cap holds whatever the peer allows.
    let options = EncoderOptions {
        max_table_size: 512,
        ..EncoderOptions::default()
    };
    let mut encoder = Encoder::new(4096, options);
    let mut wire = Vec::new();
    encoder.encode([], &mut wire);
    assert_eq!(wire, [0x3f, 0xe1, 0x03]);
    encoder.set_peer_settings_size(65536);
    wire.clear();
    encoder.encode([], &mut wire);
    assert!(wire.is_empty(), "still 512: {wire:?}");
}

/// A field for the property: names that the static table has, that the
/// proxy policy indexes, and arbitrary ones; arbitrary octets as values.
fn field() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, bool)> {
    const NAMES: [&[u8]; 6] = [
        b":authority",
        b":path",
        b":status",
        b"content-type",
        b"grpc-status",
        b"cookie",
    ];
    let name = prop_oneof![
        proptest::sample::select(&NAMES[..]).prop_map(<[u8]>::to_vec),
        proptest::collection::vec(any::<u8>(), 0..12),
    ];
    let value = prop_oneof![
        Just(b"200".to_vec()),
        Just(b"/pkg.Service/Method".to_vec()),
        proptest::collection::vec(b'a'..=b'e', 0..8),
        proptest::collection::vec(any::<u8>(), 0..40),
    ];
    (name, value, any::<bool>())
}

proptest! {
    #![proptest_config(crate::testing::fuzz_config(64))]

    #[test]
    fn blocks_round_trip_and_tables_stay_in_step(
        blocks in proptest::collection::vec(
            (proptest::collection::vec(field(), 0..12), prop_oneof![Just(None), (0usize..600).prop_map(Some)]),
            1..8,
        ),
        policy in prop_oneof![Just(IndexPolicy::Proxy), Just(IndexPolicy::All), Just(IndexPolicy::None)],
        strings in prop_oneof![
            Just(StringCoding::Raw),
            Just(StringCoding::HuffmanIfShorter),
            Just(StringCoding::HuffmanUnlessLonger),
        ],
        table in 0usize..600,
    ) {
        let options = EncoderOptions { policy, strings, max_table_size: 4096 };
        let mut encoder = Encoder::new(table, options);
        let limits = Limits { max_string_len: 1 << 10, max_list_size: 1 << 16 };
        let mut decoder = Decoder::new(table, limits);
        let mut block = HeaderBlock::default();
        let mut wire = Vec::new();
        for (fields, resize) in &blocks {
            if let Some(size) = resize {
                // The decoder's side advertised it and the encoder's
                // side acknowledged it.
                decoder.set_settings_size(*size);
                encoder.set_peer_settings_size(*size);
            }
            wire.clear();
            encoder.encode(
                fields.iter().map(|(n, v, s)| FieldRef { name: n, value: v, sensitive: *s, static_name: 0 }),
                &mut wire,
            );
            decoder.decode(&wire, &mut block).expect("decodes what the encoder wrote");
            prop_assert_eq!(block.len(), fields.len());
            for (got, (n, v, s)) in block.iter().zip(fields) {
                prop_assert_eq!(got.name, &n[..]);
                prop_assert_eq!(got.value, &v[..]);
                // Sensitive in, sensitive out; and nothing else is
                // marked unless the encoder's credential rule made it so.
                prop_assert!(!*s || got.sensitive);
            }
            prop_assert_eq!(decoder.table().size(), encoder.table().size());
            prop_assert_eq!(decoder.table().len(), encoder.table().len());
            for i in 0..decoder.table().len() {
                prop_assert_eq!(decoder.table().get(i), encoder.table().get(i));
            }
        }
    }

    #[test]
    fn huffman_round_trips_and_never_overruns(s in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut wire = Vec::new();
        huffman::encode(&s, &mut wire);
        prop_assert_eq!(wire.len(), huffman::encoded_len(&s));
        let mut back = Vec::new();
        prop_assert_eq!(huffman::decode(&wire, &mut back, s.len()), Ok(()));
        prop_assert_eq!(&back, &s);
        // Any octets: an error or a string, never a panic; at most 8
        // symbols per 5 octets (the shortest code is 5 bits).
        back.clear();
        if huffman::decode(&s, &mut back, usize::MAX).is_ok() {
            prop_assert!(back.len() <= s.len() * 8 / 5);
        }
    }

    #[test]
    fn arbitrary_blocks_never_panic_and_stay_bounded(
        wire in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let limits = Limits { max_string_len: 64, max_list_size: 256 };
        let mut decoder = Decoder::new(256, limits);
        let mut block = HeaderBlock::default();
        if decoder.decode(&wire, &mut block).is_ok() {
            prop_assert!(block.list_size() <= 256);
        }
        prop_assert!(decoder.table().size() <= 256);
    }
}

#[test]
fn an_empty_block_is_sized_once_within_its_bounds() {
    let fields = 16 * size_of::<Field>();
    for (encoded, bytes) in [
        (0, 512),
        (100, 512),
        (1000, 2000),
        (2048, 4096),
        (usize::MAX, 4096),
    ] {
        let mut block = HeaderBlock::default();
        block.presize(encoded);
        assert_eq!(block.capacity(), bytes + fields, "{encoded} encoded octets");
        // Buffers with room are left as they are.
        block.presize(usize::MAX);
        assert_eq!(block.capacity(), bytes + fields);
    }
    // The decoder sizes the block it decodes into.
    let mut block = HeaderBlock::default();
    Decoder::new(4096, Limits::default())
        .decode(&[0x82], &mut block)
        .expect("decodes");
    assert_eq!(block.capacity(), 512 + fields);
}
