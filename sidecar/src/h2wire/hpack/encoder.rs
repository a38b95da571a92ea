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
        let never = f.sensitive || always_sensitive(f.name, f.value);
        if !never && let Some(i) = static_name.and_then(|n| table::static_field_index(n, f.value)) {
            encode_int(out, 0x80, 7, usize::from(i));
            return;
        }
        let index = !never && self.worth_indexing(f.name, f.value);
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

    fn worth_indexing(&self, name: &[u8], value: &[u8]) -> bool {
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        match self.options.policy {
            IndexPolicy::None => false,
            IndexPolicy::All => true,
            IndexPolicy::Proxy => {
                size <= self.table.max_size() / MAX_ENTRY_SHARE && repeats(name, value)
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

/// Fields that repeat across a connection's requests or responses.
fn repeats(name: &[u8], value: &[u8]) -> bool {
    match name {
        b":authority"
        | b":status"
        | b"content-type"
        | b"content-encoding"
        | b"accept"
        | b"accept-encoding"
        | b"accept-language"
        | b"cache-control"
        | b"user-agent"
        | b"server"
        | b"vary"
        | b"te"
        | b"x-forwarded-proto"
        | b"grpc-status"
        | b"grpc-encoding"
        | b"grpc-accept-encoding" => true,
        b":path" => is_grpc_method(value),
        _ => false,
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

/// Credentials are never indexed whatever the caller says. Cookies only
/// when short: a long cookie is hard to guess by compression probing, and
/// RFC 7541 §7.1.3 names short cookies as the ones at risk.
fn always_sensitive(name: &[u8], value: &[u8]) -> bool {
    match name {
        b"authorization" | b"proxy-authorization" => true,
        b"cookie" | b"set-cookie" => value.len() < 20,
        _ => false,
    }
}
