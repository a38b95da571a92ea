//! HPACK (RFC 7541): header blocks to fields and back.
//!
//! - [`Decoder`] turns a complete header block into a [`HeaderBlock`]: the
//!   names and values of all fields in one buffer, each field a pair of
//!   ranges. The buffer and the field list are reused block after block,
//!   so decoding allocates nothing per header once warm, and a proxy can
//!   hand the fields to the [`Encoder`] of the other side without ever
//!   building an `http::HeaderMap`.
//! - [`Encoder`] writes fields as a block, with the indexing policy of
//!   encoder.rs.
//!
//! Errors: every [`HpackError`] but [`HpackError::ListTooLarge`] leaves the
//! decoder's table out of step with the peer's encoder, so the connection
//! must end with COMPRESSION_ERROR (RFC 9113 §4.3). A list too large is
//! decoded to the end (the table stays in step) and only its stream fails:
//! the connection layer answers 431 or resets that stream.

mod decoder;
mod encoder;
mod huffman;
mod table;

#[cfg(test)]
mod tests;

pub(crate) use decoder::{Decoder, Limits};
pub(crate) use encoder::{Encoder, EncoderOptions};

use super::ErrorCode;

/// Why a header block could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HpackError {
    /// The block ended inside a representation.
    Truncated,
    /// An integer above `u32::MAX` or with more than 5 continuation octets.
    IntegerOverflow,
    /// A string longer than [`Limits::max_string_len`].
    StringTooLong,
    /// A Huffman string contains the EOS symbol (§5.2).
    HuffmanEos,
    /// A Huffman string's padding is 8 bits or more, or not all ones (§5.2).
    HuffmanPadding,
    /// Index 0, or past the end of the static and dynamic tables (§2.3.3).
    BadIndex,
    /// A table size update above the SETTINGS_HEADER_TABLE_SIZE in force
    /// (§6.3).
    TableSizeTooLarge,
    /// A table size update after the block's first field (§4.2).
    TableSizeMisplaced,
    /// Our setting was lowered and the block did not start with a table
    /// size update (§4.2).
    TableSizeUpdateMissing,
    /// The decoded list is over [`Limits::max_list_size`] (RFC 9113
    /// §6.5.2 accounting). The decoder is still in step with the peer.
    ListTooLarge,
}

impl HpackError {
    /// Whether the connection must end (the table is no longer in step).
    pub(crate) fn ends_connection(self) -> bool {
        self != Self::ListTooLarge
    }

    /// The code to send: COMPRESSION_ERROR in a GOAWAY, or for a list too
    /// large the stream's reset code where no 431 can be answered (not
    /// REFUSED_STREAM: that invites a retry that fails the same way).
    pub(crate) fn code(self) -> ErrorCode {
        if self.ends_connection() {
            ErrorCode::COMPRESSION_ERROR
        } else {
            ErrorCode::PROTOCOL_ERROR
        }
    }
}

/// One field of a [`HeaderBlock`]: where its name and value lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Field {
    /// Offset of the name in the block's buffer; the value follows it.
    start: u32,
    name_len: u32,
    value_len: u32,
    sensitive: bool,
    static_name: u8,
}

/// A field as the encoder takes it and a [`HeaderBlock`] yields it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FieldRef<'a> {
    pub(crate) name: &'a [u8],
    pub(crate) value: &'a [u8],
    /// Never to be indexed, by us or by any hop after us: it came as a
    /// never-indexed literal (§6.2.3, §7.1.3), or the caller says so.
    pub(crate) sensitive: bool,
    /// The static-table index (1..=61) of the name, if known, else 0: a
    /// decoded field whose name came from the static table carries it, so
    /// re-encoding it skips the name lookup.
    pub(crate) static_name: u8,
}

impl<'a> FieldRef<'a> {
    pub(crate) fn new(name: &'a [u8], value: &'a [u8]) -> Self {
        Self {
            name,
            value,
            sensitive: false,
            static_name: 0,
        }
    }

    pub(crate) fn sensitive(mut self) -> Self {
        self.sensitive = true;
        self
    }
}

/// A decoded header block: every field's bytes in one buffer. Reused:
/// [`Decoder::decode`] clears it first and keeps its capacity.
#[derive(Debug, Default)]
pub(crate) struct HeaderBlock {
    bytes: Vec<u8>,
    fields: Vec<Field>,
    /// RFC 9113 §6.5.2: names and values plus 32 octets per field.
    list_size: usize,
}

/// Room a [`HeaderBlock`] takes at once when its buffers were given back
/// (an idle connection's are): decoded octets per encoded one, the
/// octets at least and at most, and fields. A usual request decodes to
/// 200-400 octets in about 10 fields; growing to that from nothing took
/// ten reallocations, a tenth of a lone gRPC call's instructions with
/// the rest of the first-use growth (bench/README.md, #39).
const FIRST_BYTES_PER_ENCODED: usize = 2;
const FIRST_BYTES_MIN: usize = 512;
const FIRST_BYTES_MAX: usize = 4096;
const FIRST_FIELDS: usize = 16;

impl HeaderBlock {
    /// Sizes empty buffers for a block of `encoded` octets in one step
    /// each; buffers that have room already are left alone.
    pub(crate) fn presize(&mut self, encoded: usize) {
        if self.bytes.capacity() == 0 {
            let guess = encoded.saturating_mul(FIRST_BYTES_PER_ENCODED);
            self.bytes
                .reserve(guess.clamp(FIRST_BYTES_MIN, FIRST_BYTES_MAX));
        }
        if self.fields.capacity() == 0 {
            self.fields.reserve(FIRST_FIELDS);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.fields.clear();
        self.list_size = 0;
    }

    pub(crate) fn len(&self) -> usize {
        self.fields.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Heap bytes held (both buffers' capacities).
    pub(crate) fn capacity(&self) -> usize {
        self.bytes.capacity() + self.fields.capacity() * size_of::<Field>()
    }

    /// The size SETTINGS_MAX_HEADER_LIST_SIZE is compared with.
    pub(crate) fn list_size(&self) -> usize {
        self.list_size
    }

    pub(crate) fn get(&self, i: usize) -> Option<FieldRef<'_>> {
        self.fields.get(i).map(|f| self.field(f))
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = FieldRef<'_>> + '_ {
        self.fields.iter().map(|f| self.field(f))
    }

    /// The one buffer every field's name and value lie in.
    pub(crate) fn buffer(&self) -> &[u8] {
        &self.bytes
    }

    /// Every field, with where its value lies in [`Self::buffer`]: a
    /// caller that copies the buffer once can share slices of it.
    pub(crate) fn iter_ranged(
        &self,
    ) -> impl Iterator<Item = (FieldRef<'_>, std::ops::Range<usize>)> + '_ {
        self.fields.iter().map(|f| {
            let mid = f.start as usize + f.name_len as usize;
            (self.field(f), mid..mid + f.value_len as usize)
        })
    }

    fn field(&self, f: &Field) -> FieldRef<'_> {
        let start = f.start as usize;
        let mid = start + f.name_len as usize;
        let end = mid + f.value_len as usize;
        FieldRef {
            name: &self.bytes[start..mid],
            value: &self.bytes[mid..end],
            sensitive: f.sensitive,
            static_name: f.static_name,
        }
    }
}

/// A read position in a header block.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    fn byte(&mut self) -> Result<u8, HpackError> {
        let b = self.peek().ok_or(HpackError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], HpackError> {
        let end = self.pos.checked_add(n).ok_or(HpackError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(HpackError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    /// An integer with an N-bit prefix (§5.1). Values above `u32::MAX`
    /// and encodings longer than 5 continuation octets (enough for any
    /// u32, zero-padded or not) are refused: no field, index or size
    /// here is anywhere near them.
    fn int(&mut self, prefix_bits: u8) -> Result<u32, HpackError> {
        let mask = (1u32 << prefix_bits) - 1;
        let mut value = u32::from(self.byte()?) & mask;
        if value < mask {
            return Ok(value);
        }
        let mut shift = 0u32;
        loop {
            let b = self.byte()?;
            let total = u64::from(value) + (u64::from(b & 0x7f) << shift);
            value = u32::try_from(total).map_err(|_| HpackError::IntegerOverflow)?;
            if b & 0x80 == 0 {
                return Ok(value);
            }
            shift += 7;
            if shift > 28 {
                return Err(HpackError::IntegerOverflow);
            }
        }
    }
}

/// Writes `value` with an N-bit prefix after the representation's `flags`
/// (§5.1).
fn encode_int(out: &mut Vec<u8>, flags: u8, prefix_bits: u8, value: usize) {
    let mask = (1usize << prefix_bits) - 1;
    if value < mask {
        // Below the mask, so it fits the prefix.
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}
