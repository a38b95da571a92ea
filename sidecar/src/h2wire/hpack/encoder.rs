//! The HPACK encoder (RFC 7541 §6), with the indexing policy of a proxy.
//!
//! Indexing costs the encoder a table insertion and the peer one, and an
//! entry that is never referenced again only evicts one that would have
//! been. So [`IndexPolicy::Proxy`] indexes only what repeats across the
//! requests of a connection: the authority, content types, gRPC's status
//! and encodings, user agents, and gRPC method paths. Values that differ
//! per request (`grpc-timeout`, `content-length`, dates, request ids) go
//! as literals without indexing. Credentials (`authorization`, short
//! cookies) and anything marked sensitive go as never-indexed literals
//! (§7.1.3), so no later hop indexes them either: an indexed secret can be
//! probed through compression ratios (CRIME-style, §7.1).
//!
//! Under that policy only what is indexed is Huffman-coded: it is coded
//! once per connection and referenced by one octet after, while a literal
//! not indexed would be coded again on every request, to save a fifth of
//! its octets. Coding those cost 4.7% of the instructions of a relayed
//! gRPC streaming call (bench/README.md, #39). HAProxy sends every literal
//! raw.

use super::decoder::DEFAULT_TABLE_SIZE;
use super::table::{self, DYNAMIC_BASE, DynamicTable, ENTRY_OVERHEAD};
use super::{FieldRef, encode_int, huffman};

/// Which fields the encoder adds to the dynamic table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IndexPolicy {
    /// What repeats on a proxy's connection (see the module doc).
    Proxy,
    /// Every field not sensitive: the RFC 7541 Appendix C examples' choice.
    All,
    /// Nothing (the table stays empty; static indexes still used).
    None,
}

/// When a string is Huffman-coded (§5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StringCoding {
    Raw,
    /// Huffman only when strictly shorter: at equal length raw octets cost
    /// the peer nothing to decode.
    HuffmanIfShorter,
    /// Huffman unless longer: the choice of RFC 7541 Appendix C's encoder
    /// (C.6.2 codes "307" in 3 octets, as long as the raw string).
    HuffmanUnlessLonger,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct EncoderOptions {
    pub(crate) policy: IndexPolicy,
    pub(crate) strings: StringCoding,
    /// The most of the peer's SETTINGS_HEADER_TABLE_SIZE we use: the
    /// table is memory held per connection.
    pub(crate) max_table_size: usize,
}

impl Default for EncoderOptions {
    fn default() -> Self {
        Self {
            policy: IndexPolicy::Proxy,
            strings: StringCoding::HuffmanIfShorter,
            max_table_size: DEFAULT_TABLE_SIZE,
        }
    }
}

/// Room for a block encoded into an empty buffer: a gRPC request's head
/// with its literals raw is 100-200 octets.
const FIRST_BLOCK: usize = 256;

/// A field bigger than this share of the table is not indexed: it would
/// evict most of what is there for one entry.
const MAX_ENTRY_SHARE: usize = 4;

pub(crate) struct Encoder {
    table: DynamicTable,
    options: EncoderOptions,
    /// Size updates owed at the start of the next block (§4.2): the
    /// smallest size since the last block, then the final one.
    pending: Option<(usize, usize)>,
}

impl Encoder {
    /// An encoder for a peer whose SETTINGS_HEADER_TABLE_SIZE in force is
    /// `peer_size` (4096 until its SETTINGS frame says otherwise).
    pub(crate) fn new(peer_size: usize, options: EncoderOptions) -> Self {
        let size = peer_size.min(options.max_table_size);
        Self {
            table: DynamicTable::new(peer_size),
            options,
            pending: (size != peer_size).then_some((size, size)),
        }
    }

    /// The peer's SETTINGS_HEADER_TABLE_SIZE changed: the table follows
    /// (within our cap) from the next block, which says so first.
    pub(crate) fn set_peer_settings_size(&mut self, peer_size: usize) {
        let size = peer_size.min(self.options.max_table_size);
        let current = self.pending.map_or(self.table.max_size(), |(_, last)| last);
        if size == current {
            return;
        }
        let low = self.pending.map_or(size, |(low, _)| low.min(size));
        self.pending = Some((low, size));
    }

    pub(crate) fn table(&self) -> &DynamicTable {
        &self.table
    }

    /// Bytes the encoder holds, table included.
    pub(crate) fn memory(&self) -> usize {
        self.table.capacity()
    }

    /// Appends one header block holding `fields` to `out`.
    pub(crate) fn encode<'a>(
        &mut self,
        fields: impl IntoIterator<Item = FieldRef<'a>>,
        out: &mut Vec<u8>,
    ) {
        if out.capacity() == 0 {
            // The connections give their block buffer back when idle: one
            // allocation for a usual head, not one per doubling.
            out.reserve(FIRST_BLOCK);
        }
        if let Some((low, last)) = self.pending.take() {
            if low < last {
                self.size_update(low, out);
            }
            self.size_update(last, out);
        }
        for field in fields {
            self.field(field, out);
        }
    }

    fn size_update(&mut self, size: usize, out: &mut Vec<u8>) {
        encode_int(out, 0x20, 5, size);
        self.table.set_max_size(size);
    }

    fn field(&mut self, f: FieldRef<'_>, out: &mut Vec<u8>) {
        let static_name = match f.static_name {
            i @ 1..=61 if table::STATIC[usize::from(i) - 1].0 == f.name => Some(i),
            _ => table::static_name_index(f.name),
        };
        let kind = name_kind(static_name, f.name);
        let never = f.sensitive
            || match kind {
                NameKind::Credential => true,
                NameKind::Cookie => f.value.len() < SHORT_COOKIE,
                _ => false,
            };
        if !never
            && matches!(
                kind,
                NameKind::StaticValues | NameKind::RepeatsWithStaticValues | NameKind::Path
            )
            && let Some(i) = static_name.and_then(|n| table::static_field_index(n, f.value))
        {
            encode_int(out, 0x80, 7, usize::from(i));
            return;
        }
        let index = !never && self.worth_indexing(kind, f.name, f.value);
        // Only fields the policy indexes are ever in the table.
        let (full, name_only) = if index || self.options.policy == IndexPolicy::All {
            self.table.find(f.name, f.value)
        } else {
            (None, None)
        };
        if let Some(i) = full.filter(|_| !never) {
            encode_int(out, 0x80, 7, DYNAMIC_BASE + i);
            return;
        }
        let (flags, prefix) = if index {
            (0x40, 6)
        } else if never {
            (0x10, 4)
        } else {
            (0x00, 4)
        };
        match static_name
            .map(usize::from)
            .or(name_only.map(|i| DYNAMIC_BASE + i))
        {
            Some(i) => encode_int(out, flags, prefix, i),
            None => {
                out.push(flags);
                self.string(f.name, index, out);
            }
        }
        self.string(f.value, index, out);
        if index {
            self.table.insert(f.name, f.value);
        }
    }

    fn worth_indexing(&self, kind: NameKind, name: &[u8], value: &[u8]) -> bool {
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        match self.options.policy {
            IndexPolicy::None => false,
            IndexPolicy::All => true,
            IndexPolicy::Proxy => {
                size <= self.table.max_size() / MAX_ENTRY_SHARE
                    && match kind {
                        NameKind::Repeats | NameKind::RepeatsWithStaticValues => true,
                        NameKind::Path => is_grpc_method(value),
                        _ => false,
                    }
            }
        }
    }

    /// §5.2: raw or Huffman-coded, as the options say; raw when the proxy
    /// policy leaves the field out of the table (see the module doc).
    fn string(&self, s: &[u8], index: bool, out: &mut Vec<u8>) {
        let coding = if index || self.options.policy != IndexPolicy::Proxy {
            self.options.strings
        } else {
            StringCoding::Raw
        };
        let huffman = match coding {
            StringCoding::Raw => None,
            StringCoding::HuffmanIfShorter => {
                Some(huffman::encoded_len(s)).filter(|&n| n < s.len())
            }
            StringCoding::HuffmanUnlessLonger => {
                Some(huffman::encoded_len(s)).filter(|&n| n <= s.len())
            }
        };
        if let Some(len) = huffman {
            encode_int(out, 0x80, 7, len);
            huffman::encode(s, out);
            return;
        }
        encode_int(out, 0x00, 7, s.len());
        out.extend_from_slice(s);
    }
}

/// What the encoder does with a field by its name, decided by one lookup
/// (the static table's index where the name has one) rather than a
/// comparison of the name per rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameKind {
    /// Repeats across a connection's requests or responses: indexed.
    Repeats,
    /// Repeats, and has values in the static table, looked up there first
    /// (`:status`, `accept-encoding`).
    RepeatsWithStaticValues,
    /// `:path`: its static values first (`/`), then indexed when a gRPC
    /// method (see [`is_grpc_method`]).
    Path,
    /// Has values in the static table, looked up there first; a literal
    /// otherwise (`:method`, `:scheme`).
    StaticValues,
    /// Credentials, never indexed whatever the caller says.
    Credential,
    /// Cookies: never indexed when short (see [`SHORT_COOKIE`]).
    Cookie,
    Other,
}

/// A cookie shorter than this is never indexed: a long cookie is hard to
/// guess by compression probing, and RFC 7541 §7.1.3 names short cookies
/// as the ones at risk.
const SHORT_COOKIE: usize = 20;

/// Indexes follow RFC 7541 Appendix A (`table::STATIC`).
fn name_kind(static_name: Option<u8>, name: &[u8]) -> NameKind {
    match static_name {
        // :authority, content-type, content-encoding, accept,
        // accept-language, cache-control, user-agent, server, vary.
        Some(1 | 31 | 26 | 19 | 17 | 24 | 58 | 54 | 59) => NameKind::Repeats,
        // :status, accept-encoding.
        Some(8..=14 | 16) => NameKind::RepeatsWithStaticValues,
        // :method, :scheme.
        Some(2 | 3 | 6 | 7) => NameKind::StaticValues,
        Some(4 | 5) => NameKind::Path,
        // authorization, proxy-authorization.
        Some(23 | 49) => NameKind::Credential,
        // cookie, set-cookie.
        Some(32 | 55) => NameKind::Cookie,
        Some(_) => NameKind::Other,
        None => match name {
            b"te"
            | b"x-forwarded-proto"
            | b"grpc-status"
            | b"grpc-encoding"
            | b"grpc-accept-encoding" => NameKind::Repeats,
            _ => NameKind::Other,
        },
    }
}

/// `/package.Service/Method`: the same few values on every call of a gRPC
/// client, unlike REST paths with ids in them.
fn is_grpc_method(path: &[u8]) -> bool {
    let Some(rest) = path.strip_prefix(b"/") else {
        return false;
    };
    let mut parts = rest.split(|&b| b == b'/');
    let (Some(service), Some(method), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    service.contains(&b'.') && !method.is_empty() && !path.contains(&b'?')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kinds keyed by index agree with the names: every index of a name
    /// has its kind, every static value is looked up, and the names with
    /// no index are classed by the bytes.
    #[test]
    fn name_kinds_follow_the_static_table() {
        for (at, (name, value)) in table::STATIC.iter().enumerate() {
            let index = u8::try_from(at + 1).expect("61 entries");
            let first = table::static_name_index(name).expect("a static name");
            assert_eq!(
                name_kind(Some(index), name),
                name_kind(Some(first), name),
                "{index}"
            );
            let looked_up = matches!(
                name_kind(Some(index), name),
                NameKind::StaticValues | NameKind::RepeatsWithStaticValues | NameKind::Path
            );
            assert_eq!(looked_up, !value.is_empty(), "{index}");
        }
        let kind = |n: &[u8]| name_kind(table::static_name_index(n), n);
        assert_eq!(kind(b"authorization"), NameKind::Credential);
        assert_eq!(kind(b"proxy-authorization"), NameKind::Credential);
        assert_eq!(kind(b"set-cookie"), NameKind::Cookie);
        assert_eq!(kind(b"user-agent"), NameKind::Repeats);
        assert_eq!(kind(b":status"), NameKind::RepeatsWithStaticValues);
        assert_eq!(kind(b"grpc-status"), NameKind::Repeats);
        assert_eq!(kind(b"grpc-timeout"), NameKind::Other);
        assert_eq!(kind(b"content-length"), NameKind::Other);
    }
}
