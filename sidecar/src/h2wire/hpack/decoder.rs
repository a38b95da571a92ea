//! The HPACK decoder (RFC 7541 §3, §6), bounded against a hostile peer:
//! every integer, every string and the decoded list have a limit, and a
//! table size update may not exceed the size we advertised.

use super::table::{DYNAMIC_BASE, DynamicTable, ENTRY_OVERHEAD, STATIC};
use super::{Cursor, Field, HeaderBlock, HpackError, huffman};

/// SETTINGS_HEADER_TABLE_SIZE's initial value (RFC 9113 §6.5.2).
pub(crate) const DEFAULT_TABLE_SIZE: usize = 4096;

/// What one block may cost us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Longest name or value, decoded. Past it the connection ends: the
    /// string cannot be decoded without holding it.
    pub(crate) max_string_len: usize,
    /// The SETTINGS_MAX_HEADER_LIST_SIZE we advertise: past it the block
    /// is still decoded (the table must stay in step) but its fields are
    /// dropped and [`HpackError::ListTooLarge`] fails its stream.
    pub(crate) max_list_size: usize,
}

impl Default for Limits {
    /// 16 KiB a list, what the sidecar advertises to its app today
    /// (upstream/h2conn.rs), and no string longer than the list. The
    /// downstream side will pass `limits.maxHeaderBytes` (64 KiB by
    /// default) instead.
    fn default() -> Self {
        Self {
            max_string_len: 16 << 10,
            max_list_size: 16 << 10,
        }
    }
}

/// How one field's name is given.
enum NameFrom {
    Static(usize),
    Dynamic(usize),
    Literal,
}

pub(crate) struct Decoder {
    table: DynamicTable,
    /// The SETTINGS_HEADER_TABLE_SIZE in force: no size update above it.
    settings_size: usize,
    /// We lowered our setting below the table's size: the next block must
    /// open with a size update (§4.2).
    update_required: bool,
    limits: Limits,
}

impl Decoder {
    /// A decoder whose table may grow to `settings_size`, the value in
    /// force when the connection's first block comes (4096 until our
    /// SETTINGS is acknowledged).
    pub(crate) fn new(settings_size: usize, limits: Limits) -> Self {
        Self {
            table: DynamicTable::new(settings_size),
            settings_size,
            update_required: false,
            limits,
        }
    }

    /// Our SETTINGS_HEADER_TABLE_SIZE, once the peer acknowledged it.
    pub(crate) fn set_settings_size(&mut self, size: usize) {
        self.settings_size = size;
        if size < self.table.max_size() {
            self.update_required = true;
        }
    }

    pub(crate) fn table(&self) -> &DynamicTable {
        &self.table
    }

    /// Bytes the decoder holds, table included.
    pub(crate) fn memory(&self) -> usize {
        self.table.capacity()
    }

    /// Decodes one complete header block (HEADERS and its CONTINUATIONs
    /// joined) into `out`, which is cleared first. After an error `out`
    /// holds whatever came before it (nothing for a list too large) and
    /// is not to be used. `out` keeps its capacity for the next block;
    /// the connection layer decides when a large one is given back.
    pub(crate) fn decode(&mut self, block: &[u8], out: &mut HeaderBlock) -> Result<(), HpackError> {
        out.clear();
        out.presize(block.len());
        let mut cur = Cursor::new(block);
        let mut fields_seen = false;
        let mut too_large = false;
        while let Some(b) = cur.peek() {
            if b & 0xe0 == 0x20 {
                // §6.3 dynamic table size update.
                if fields_seen {
                    return Err(HpackError::TableSizeMisplaced);
                }
                let size = cur.int(5)? as usize;
                if size > self.settings_size {
                    return Err(HpackError::TableSizeTooLarge);
                }
                self.table.set_max_size(size);
                self.update_required = false;
                continue;
            }
            if self.update_required {
                return Err(HpackError::TableSizeUpdateMissing);
            }
            fields_seen = true;
            if b & 0x80 != 0 {
                // §6.1 indexed field.
                let index = cur.int(7)? as usize;
                self.indexed(index, out, &mut too_large)?;
                continue;
            }
            // §6.2 literals: with incremental indexing (01), never
            // indexed (0001), without indexing (0000).
            let (prefix, indexing, sensitive) = match b & 0xf0 {
                0x40..=0x70 => (6, true, false),
                0x10 => (4, false, true),
                _ => (4, false, false),
            };
            let index = cur.int(prefix)? as usize;
            let name = match index {
                0 => NameFrom::Literal,
                i if i < DYNAMIC_BASE => NameFrom::Static(i),
                i => NameFrom::Dynamic(i - DYNAMIC_BASE),
            };
            self.literal(&mut cur, name, indexing, sensitive, out, &mut too_large)?;
        }
        if self.update_required {
            return Err(HpackError::TableSizeUpdateMissing);
        }
        if too_large {
            out.clear();
            return Err(HpackError::ListTooLarge);
        }
        Ok(())
    }

    fn indexed(
        &self,
        index: usize,
        out: &mut HeaderBlock,
        too_large: &mut bool,
    ) -> Result<(), HpackError> {
        let (name, value, static_name) = match index {
            0 => return Err(HpackError::BadIndex),
            i if i < DYNAMIC_BASE => (STATIC[i - 1].0, STATIC[i - 1].1, i as u8),
            i => {
                let (n, v) = self
                    .table
                    .get(i - DYNAMIC_BASE)
                    .ok_or(HpackError::BadIndex)?;
                (n, v, 0)
            }
        };
        // Sized before copying: a small block of indexes into a large
        // entry must not cost a copy each once over the limit.
        if !*too_large && self.fits(out, name.len() + value.len()) {
            let start = out.bytes.len();
            out.bytes.extend_from_slice(name);
            out.bytes.extend_from_slice(value);
            push(out, start, name.len(), value.len(), false, static_name);
        } else {
            *too_large = true;
        }
        Ok(())
    }

    fn literal(
        &mut self,
        cur: &mut Cursor<'_>,
        name: NameFrom,
        indexing: bool,
        sensitive: bool,
        out: &mut HeaderBlock,
        too_large: &mut bool,
    ) -> Result<(), HpackError> {
        if *too_large && !indexing {
            // The stream has failed and this field changes no table: its
            // octets are passed over, not copied (a name from a large
            // dynamic entry, named by two octets, would cost a copy each).
            if let NameFrom::Dynamic(i) = name {
                self.table.get(i).ok_or(HpackError::BadIndex)?;
            }
            if let NameFrom::Literal = name {
                skip_string(cur)?;
            }
            return skip_string(cur);
        }
        let start = out.bytes.len();
        let static_name = match name {
            NameFrom::Static(i) => {
                out.bytes.extend_from_slice(STATIC[i - 1].0);
                i as u8
            }
            NameFrom::Dynamic(i) => {
                let (n, _) = self.table.get(i).ok_or(HpackError::BadIndex)?;
                out.bytes.extend_from_slice(n);
                0
            }
            NameFrom::Literal => {
                self.string(cur, &mut out.bytes)?;
                0
            }
        };
        let name_len = out.bytes.len() - start;
        self.string(cur, &mut out.bytes)?;
        let value_len = out.bytes.len() - start - name_len;
        if indexing {
            let mid = start + name_len;
            self.table.insert(&out.bytes[start..mid], &out.bytes[mid..]);
        }
        if !*too_large && self.fits(out, name_len + value_len) {
            push(out, start, name_len, value_len, sensitive, static_name);
        } else {
            *too_large = true;
            out.bytes.truncate(start);
        }
        Ok(())
    }

    /// Whether a field of `len` octets keeps the list within its limit.
    fn fits(&self, out: &HeaderBlock, len: usize) -> bool {
        out.list_size + len + ENTRY_OVERHEAD <= self.limits.max_list_size
    }

    /// A string literal (§5.2) appended to `to`, within the length limit.
    fn string(&self, cur: &mut Cursor<'_>, to: &mut Vec<u8>) -> Result<(), HpackError> {
        let huffman = cur.peek().ok_or(HpackError::Truncated)? & 0x80 != 0;
        let len = cur.int(7)? as usize;
        let raw = cur.take(len)?;
        if huffman {
            huffman::decode(raw, to, self.limits.max_string_len)
        } else if len > self.limits.max_string_len {
            Err(HpackError::StringTooLong)
        } else {
            to.extend_from_slice(raw);
            Ok(())
        }
    }
}

/// Passes over a string literal (§5.2): its length prefix and octets.
fn skip_string(cur: &mut Cursor<'_>) -> Result<(), HpackError> {
    // The H bit is outside the 7-bit prefix.
    let len = cur.int(7)? as usize;
    cur.take(len).map(|_| ())
}

fn push(
    out: &mut HeaderBlock,
    start: usize,
    name_len: usize,
    value_len: usize,
    sensitive: bool,
    static_name: u8,
) {
    // The buffer holds at most a list's limit plus one field, far below
    // 4 GiB: the limits are u32 in SETTINGS.
    out.fields.push(Field {
        start: start as u32,
        name_len: name_len as u32,
        value_len: value_len as u32,
        sensitive,
        static_name,
    });
    out.list_size += name_len + value_len + ENTRY_OVERHEAD;
}
