use super::*;

const REWRITE: Rewrite<'static> = Rewrite {
    peer_ip: b"10.0.0.7",
    trust_proto: false,
    keep_underscores: false,
};

/// A parsed request head, owned: framing, close, has_host, path, host.
type Owned = (Framing, bool, bool, String, Option<String>);

fn request(raw: &str) -> (Parsed<Owned>, String) {
    let mut out = Vec::new();
    let parsed = match parse_request(raw.as_bytes(), 100, 64 * 1024, &REWRITE, &mut out) {
        Parsed::Done(h) => {
            assert!(h.len <= raw.len());
            Parsed::Done((
                h.framing,
                h.close,
                h.has_host,
                h.path.to_string(),
                h.host.map(|h| String::from_utf8_lossy(h).into_owned()),
            ))
        }
        Parsed::Partial => Parsed::Partial,
        Parsed::Fallback => Parsed::Fallback,
        Parsed::Refused(r) => Parsed::Refused(r),
    };
    (parsed, String::from_utf8_lossy(&out).into_owned())
}

fn refused(raw: &str) -> Option<Refusal> {
    match request(raw).0 {
        Parsed::Refused(r) => Some(r),
        _ => None,
    }
}

fn falls_back(raw: &str) -> bool {
    matches!(request(raw).0, Parsed::Fallback)
}

#[test]
fn a_plain_get_is_rewritten_in_one_buffer() {
    let (parsed, out) = request(
        "GET /a/b?x=1 HTTP/1.1\r\nHost: shop\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\
         Keep-Alive: timeout=5\r\nProxy-Connection: x\r\nTE: gzip, trailers\r\nAccept: */*\r\n\r\n",
    );
    let Parsed::Done((framing, close, has_host, path, host)) = parsed else {
        panic!("{parsed:?}");
    };
    assert_eq!(framing, Framing::Empty);
    assert!(!close && has_host);
    assert_eq!(path, "/a/b");
    assert_eq!(host.as_deref(), Some("shop"));
    assert_eq!(
        out,
        "GET /a/b?x=1 HTTP/1.1\r\nHost: shop\r\nte: trailers\r\nAccept: */*\r\n\
         x-forwarded-for: 10.0.0.7\r\nx-forwarded-proto: http\r\n"
    );
}

#[test]
fn forwarded_headers_are_appended_or_replaced() {
    let (_, out) = request(
        "GET / HTTP/1.1\r\nX-Forwarded-For: 203.0.113.1\r\nX-Forwarded-Proto: https\r\n\r\n",
    );
    assert_eq!(
        out,
        "GET / HTTP/1.1\r\nX-Forwarded-For: 203.0.113.1, 10.0.0.7\r\nx-forwarded-proto: http\r\n"
    );
    let trusted = Rewrite {
        trust_proto: true,
        ..REWRITE
    };
    let mut out = Vec::new();
    let raw = b"GET / HTTP/1.1\r\nX-Forwarded-Proto: https\r\n\r\n";
    assert!(matches!(
        parse_request(raw, 100, 65536, &trusted, &mut out),
        Parsed::Done(RequestHead {
            has_host: false,
            ..
        })
    ));
    assert_eq!(
        String::from_utf8_lossy(&out),
        "GET / HTTP/1.1\r\nX-Forwarded-Proto: https\r\nx-forwarded-for: 10.0.0.7\r\n"
    );
}

#[test]
fn framing_and_close_are_read() {
    let cases = [
        (
            "POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
            Framing::Length(5),
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            Framing::Empty,
        ),
        (
            "POST / HTTP/1.1\r\ntransfer-encoding: Chunked\r\n\r\n",
            Framing::Chunked,
        ),
    ];
    for (raw, want) in cases {
        match request(raw).0 {
            Parsed::Done((framing, ..)) => assert_eq!(framing, want, "{raw}"),
            other => panic!("{raw}: {other:?}"),
        }
    }
    match request("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n").0 {
        Parsed::Done((_, close, ..)) => assert!(close),
        other => panic!("{other:?}"),
    }
}

#[test]
fn smuggling_shapes_are_refused() {
    let bad = [
        "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
        // obs-fold
        "GET / HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        "GET / HTTP/1.1\r\n: x\r\n\r\n",
        "GET /\x01 HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",
        "G(T / HTTP/1.1\r\n\r\n",
        "GET / HTTP/2.0\r\n\r\n",
    ];
    for raw in bad {
        assert_eq!(refused(raw), Some(Refusal::BadRequest), "{raw:?}");
    }
}

#[test]
fn what_this_path_does_not_serve_goes_to_hyper() {
    let hyper_s = [
        "GET / HTTP/1.0\r\n\r\n",
        "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
        "GET http://a/ HTTP/1.1\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        "GET / HTTP/1.1\r\nConnection: Upgrade\r\n\r\n",
        "POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        "GET / HTTP/1.1\r\nConnection: a, b, c, d, e, f, g, h, i\r\n\r\n",
        "POST / HTTP/1.1\r\nConnection: Content-Length\r\nContent-Length: 1\r\n\r\n",
        "GET / HTTP/1.1\r\nConnection: host\r\nHost: a\r\n\r\n",
    ];
    for raw in hyper_s {
        assert!(falls_back(raw), "{raw:?}: {:?}", request(raw).0);
    }
}

#[test]
fn limits_give_431_and_partial_heads_wait() {
    assert!(matches!(
        request("GET / HTTP/1.1\r\nHost: a\r\n").0,
        Parsed::Partial
    ));
    let mut out = Vec::new();
    let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X: 1\r\n".repeat(11));
    assert!(matches!(
        parse_request(many.as_bytes(), 10, 65536, &REWRITE, &mut out),
        Parsed::Refused(Refusal::TooLarge)
    ));
    // More than this path holds but within a larger limit: hyper's.
    let lots = format!("GET / HTTP/1.1\r\n{}\r\n", "X: 1\r\n".repeat(120));
    assert!(matches!(
        parse_request(lots.as_bytes(), 200, 65536, &REWRITE, &mut out),
        Parsed::Fallback
    ));
    let big = format!("GET / HTTP/1.1\r\nX: {}", "y".repeat(9000));
    assert!(matches!(
        parse_request(big.as_bytes(), 100, 8192, &REWRITE, &mut out),
        Parsed::Refused(Refusal::TooLarge)
    ));
}

fn response(raw: &str, head_request: bool, close: bool) -> (Parsed<ResponseHead>, String) {
    let mut out = Vec::new();
    let parsed = parse_response(raw.as_bytes(), head_request, close, &mut out);
    (parsed, String::from_utf8_lossy(&out).into_owned())
}

#[test]
fn response_heads_keep_their_framing_and_lose_hop_by_hop() {
    let (parsed, out) = response(
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\
         Keep-Alive: timeout=5\r\nX-App: a\r\n\r\nhello",
        false,
        false,
    );
    let Parsed::Done(head) = parsed else {
        panic!("{parsed:?}")
    };
    assert_eq!(head.framing, Framing::Length(5));
    assert!(head.reusable && !head.close);
    assert_eq!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-App: a\r\n\r\n"
    );

    let (parsed, out) = response(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        false,
        true,
    );
    let Parsed::Done(head) = parsed else {
        panic!("{parsed:?}")
    };
    assert_eq!(head.framing, Framing::Chunked);
    assert!(head.close);
    assert_eq!(
        out,
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nconnection: close\r\n\r\n"
    );
}

#[test]
fn response_framing_follows_rfc_9112() {
    let framing = |raw: &str, head_request: bool| match response(raw, head_request, false).0 {
        Parsed::Done(h) => (h.framing, h.reusable, h.close),
        other => panic!("{raw}: {other:?}"),
    };
    assert_eq!(
        framing("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true),
        (Framing::Empty, true, false)
    );
    assert_eq!(
        framing("HTTP/1.1 204 No Content\r\n\r\n", false),
        (Framing::Empty, true, false)
    );
    assert_eq!(
        framing(
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
            false
        ),
        (Framing::Empty, true, false)
    );
    assert_eq!(
        framing("HTTP/1.1 200 OK\r\n\r\n", false),
        (Framing::Close, false, true)
    );
    assert_eq!(
        framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false),
        (Framing::Close, false, true)
    );
    assert_eq!(
        framing(
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            false
        ),
        (Framing::Chunked, false, false)
    );
    assert_eq!(
        framing(
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\n",
            false
        ),
        (Framing::Length(3), false, false)
    );
    assert_eq!(
        framing("HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\n", false),
        (Framing::Length(3), false, false)
    );
    assert!(matches!(
        response(
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            false,
            false
        )
        .0,
        Parsed::Refused(_)
    ));
    assert!(matches!(
        response("HTTP/1.1 100 Continue\r\n\r\n", false, false).0,
        Parsed::Done(ResponseHead { status: 100, .. })
    ));
}

#[test]
fn targets_hyper_refuses_are_refused_and_fragments_are_hyper_s() {
    for target in ["/a<b", "/a>b", "/`", "/a?q=\"x\"", "/a?<", "/a b"] {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(refused(&raw), Some(Refusal::BadRequest), "{target}");
    }
    for target in ["/a{b}\"c", "/a?q=`x`&y=~", "/%3C", "/caf\u{e9}"] {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(matches!(request(&raw).0, Parsed::Done(_)), "{target}");
    }
    assert!(falls_back("GET /a#frag HTTP/1.1\r\nHost: a\r\n\r\n"));
}

/// Lines already in the written form are copied from the buffer in runs;
/// the others are written anew. Either way the bytes are the ones a line
/// by line rewrite gives: dropped lines end a run, odd spacing and bare
/// line ends are normalised, and a status or request line not in the
/// written form is written anew.
#[test]
fn lines_copied_as_they_came_give_the_bytes_written_anew() {
    let (parsed, out) = request(
        "\r\nGET /x?q HTTP/1.1\r\nHost:  shop\r\nA: 1\r\nB: 2 \r\nC:3\r\nD: 4\r\n\
         Connection: close\r\nE: 5\nF: \r\nX-Forwarded-For: 1.2.3.4\r\nG: 6\r\n\r\n",
    );
    assert!(matches!(parsed, Parsed::Done(_)), "{parsed:?}");
    assert_eq!(
        out,
        "GET /x?q HTTP/1.1\r\nHost: shop\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\nF: \r\n\
         X-Forwarded-For: 1.2.3.4, 10.0.0.7\r\nG: 6\r\nx-forwarded-proto: http\r\n"
    );

    let (parsed, out) = request("GET / HTTP/1.1\nHost: a\r\nB: 2\r\n\r\n");
    assert!(matches!(parsed, Parsed::Done(_)), "{parsed:?}");
    assert_eq!(
        out,
        "GET / HTTP/1.1\r\nHost: a\r\nB: 2\r\nx-forwarded-for: 10.0.0.7\r\nx-forwarded-proto: http\r\n"
    );

    for (raw, want) in [
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX:  y\r\nZ: z\r\nKeep-Alive: 5\r\nW: w\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX: y\r\nZ: z\r\nW: w\r\n\r\n",
        ),
        (
            "HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n",
        ),
        (
            "HTTP/1.1 204\r\nA: 1\r\n\r\n",
            "HTTP/1.1 204 \r\nA: 1\r\n\r\n",
        ),
        (
            "HTTP/1.0 200 Fine\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n",
            "HTTP/1.1 200 Fine\r\nContent-Length: 0\r\n\r\n",
        ),
        (
            "HTTP/1.1 200 OK\nContent-Length: 0\n\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        ),
    ] {
        let (parsed, out) = response(raw, false, false);
        assert!(matches!(parsed, Parsed::Done(_)), "{raw:?}: {parsed:?}");
        assert_eq!(out, want, "{raw:?}");
    }
}

#[test]
fn forwarding_headers_connection_lists_are_the_clients_to_lose() {
    let (_, out) = request(
        "GET / HTTP/1.1\r\nX-Forwarded-For: 203.0.113.1\r\nX-Forwarded-Proto: https\r\n\
         Connection: X-Forwarded-For, x-forwarded-proto\r\n\r\n",
    );
    assert_eq!(
        out,
        "GET / HTTP/1.1\r\nx-forwarded-for: 10.0.0.7\r\nx-forwarded-proto: http\r\n"
    );
}

#[test]
fn several_forwarded_for_lines_become_one_with_the_peer_last() {
    let (_, out) = request(
        "GET / HTTP/1.1\r\nX-Forwarded-For: 203.0.113.1\r\nA: b\r\n\
         x-forwarded-for: 198.51.100.2, 192.0.2.3\r\n\r\n",
    );
    assert_eq!(
        out,
        "GET / HTTP/1.1\r\nX-Forwarded-For: 203.0.113.1, 198.51.100.2, 192.0.2.3, 10.0.0.7\r\n\
         A: b\r\nx-forwarded-proto: http\r\n"
    );
}

#[test]
fn underscore_names_are_dropped_unless_kept() {
    let raw = "GET / HTTP/1.1\r\nContent_Length: 5\r\nX_Real_IP: 1.2.3.4\r\nX-Ok: 1\r\n\r\n";
    let (_, out) = request(raw);
    assert_eq!(
        out,
        "GET / HTTP/1.1\r\nX-Ok: 1\r\nx-forwarded-for: 10.0.0.7\r\nx-forwarded-proto: http\r\n"
    );
    let keep = Rewrite {
        keep_underscores: true,
        ..REWRITE
    };
    let mut out = Vec::new();
    assert!(matches!(
        parse_request(raw.as_bytes(), 100, 65536, &keep, &mut out),
        Parsed::Done(_)
    ));
    assert!(String::from_utf8_lossy(&out).contains("Content_Length: 5\r\nX_Real_IP: 1.2.3.4\r\n"));
}

#[test]
fn the_app_gets_the_path_the_route_was_chosen_by() {
    let (parsed, out) = request("GET /%6cim/./x//y/../z?q=%2F HTTP/1.1\r\nHost: a\r\n\r\n");
    let Parsed::Done((_, _, _, path, _)) = parsed else {
        panic!("{parsed:?}");
    };
    assert_eq!(path, "/lim/x/z");
    assert!(
        out.starts_with("GET /lim/x/z?q=%2F HTTP/1.1\r\nHost: a\r\n"),
        "{out}"
    );
    for escaped in ["/lim%2fx", "/lim%5C"] {
        assert_eq!(
            refused(&format!("GET {escaped} HTTP/1.1\r\nHost: a\r\n\r\n")),
            Some(Refusal::BadRequest),
            "{escaped}"
        );
    }
}
