//! The static table (RFC 7541 Appendix A) and the dynamic table (§2.3.2,
//! §4), shared by the decoder and the encoder.

use std::collections::VecDeque;

/// Appendix A, index 1 first.
pub(super) const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// Index of the first static entry, where the dynamic table's begin.
pub(super) const DYNAMIC_BASE: usize = STATIC.len() + 1;

/// §4.1: each entry counts its name, its value and this.
pub(super) const ENTRY_OVERHEAD: usize = 32;

/// The static index of `name`'s first entry. A match on the bytes: the
/// compiler sorts it by length and compares few candidates.
pub(super) fn static_name_index(name: &[u8]) -> Option<u8> {
    let i = match name {
        b":authority" => 1,
        b":method" => 2,
        b":path" => 4,
        b":scheme" => 6,
        b":status" => 8,
        b"accept-charset" => 15,
        b"accept-encoding" => 16,
        b"accept-language" => 17,
        b"accept-ranges" => 18,
        b"accept" => 19,
        b"access-control-allow-origin" => 20,
        b"age" => 21,
        b"allow" => 22,
        b"authorization" => 23,
        b"cache-control" => 24,
        b"content-disposition" => 25,
        b"content-encoding" => 26,
        b"content-language" => 27,
        b"content-length" => 28,
        b"content-location" => 29,
        b"content-range" => 30,
        b"content-type" => 31,
        b"cookie" => 32,
        b"date" => 33,
        b"etag" => 34,
        b"expect" => 35,
        b"expires" => 36,
        b"from" => 37,
        b"host" => 38,
        b"if-match" => 39,
        b"if-modified-since" => 40,
        b"if-none-match" => 41,
        b"if-range" => 42,
        b"if-unmodified-since" => 43,
        b"last-modified" => 44,
        b"link" => 45,
        b"location" => 46,
        b"max-forwards" => 47,
        b"proxy-authenticate" => 48,
        b"proxy-authorization" => 49,
        b"range" => 50,
        b"referer" => 51,
        b"refresh" => 52,
        b"retry-after" => 53,
        b"server" => 54,
        b"set-cookie" => 55,
        b"strict-transport-security" => 56,
        b"transfer-encoding" => 57,
        b"user-agent" => 58,
        b"vary" => 59,
        b"via" => 60,
        b"www-authenticate" => 61,
        _ => return None,
    };
    Some(i)
}

/// The static index of `(name, value)` given the index of any entry with
/// that name (a decoded field carries the one its peer used).
pub(super) fn static_field_index(name_index: u8, value: &[u8]) -> Option<u8> {
    let at = usize::from(name_index).checked_sub(1)?;
    let name = STATIC.get(at)?.0;
    // The entries of one name are adjacent: search from the first.
    let first = STATIC[..at]
        .iter()
        .rposition(|(n, _)| *n != name)
        .map_or(0, |i| i + 1);
    STATIC[first..]
        .iter()
        .take_while(|(n, _)| *n == name)
        .position(|(_, v)| !v.is_empty() && *v == value)
        .and_then(|k| u8::try_from(first + k + 1).ok())
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Offset in `DynamicTable::bytes`; the value follows the name.
    start: usize,
    name_len: usize,
    value_len: usize,
}

/// The dynamic table: entries' bytes appended to one buffer, oldest first,
/// evicted from the front by moving `head`; the dead front is reclaimed
/// once it is as large as the live part, so the buffer stays within about
/// twice the table's size and no entry is an allocation of its own.
#[derive(Debug)]
pub(crate) struct DynamicTable {
    bytes: Vec<u8>,
    head: usize,
    /// Oldest at the front; HPACK index 62 is the back (the newest).
    entries: VecDeque<Entry>,
    /// §4.1 size: lengths plus 32 per entry.
    size: usize,
    max_size: usize,
}

impl DynamicTable {
    pub(super) fn new(max_size: usize) -> Self {
        Self {
            bytes: Vec::new(),
            head: 0,
            entries: VecDeque::new(),
            size: 0,
            max_size,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    pub(crate) fn max_size(&self) -> usize {
        self.max_size
    }

    /// Entry `i`, 0 the newest (HPACK index 62).
    pub(crate) fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        let at = self.entries.len().checked_sub(i + 1)?;
        let e = self.entries.get(at)?;
        let mid = e.start + e.name_len;
        Some((
            &self.bytes[e.start..mid],
            &self.bytes[mid..mid + e.value_len],
        ))
    }

    /// §4.3: a new maximum evicts down to it.
    pub(super) fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        while self.size > self.max_size {
            self.evict_oldest();
        }
    }

    /// §4.4: evicts until the entry fits, then adds it; an entry larger
    /// than the whole table empties it and is not added (not an error).
    pub(super) fn insert(&mut self, name: &[u8], value: &[u8]) {
        let entry_size = name.len() + value.len() + ENTRY_OVERHEAD;
        if entry_size > self.max_size {
            self.entries.clear();
            self.bytes.clear();
            self.head = 0;
            self.size = 0;
            return;
        }
        while self.size + entry_size > self.max_size {
            self.evict_oldest();
        }
        if self.head > 0 && self.head >= self.bytes.len() - self.head {
            let live = self.bytes.len() - self.head;
            self.bytes.copy_within(self.head.., 0);
            self.bytes.truncate(live);
            for e in &mut self.entries {
                e.start -= self.head;
            }
            self.head = 0;
        }
        let start = self.bytes.len();
        self.bytes.extend_from_slice(name);
        self.bytes.extend_from_slice(value);
        self.entries.push_back(Entry {
            start,
            name_len: name.len(),
            value_len: value.len(),
        });
        self.size += entry_size;
    }

    fn evict_oldest(&mut self) {
        let Some(e) = self.entries.pop_front() else {
            return;
        };
        self.size -= e.name_len + e.value_len + ENTRY_OVERHEAD;
        self.head = e.start + e.name_len + e.value_len;
        if self.entries.is_empty() {
            self.bytes.clear();
            self.head = 0;
        }
    }

    /// The newest entry equal to `(name, value)`, and failing that the
    /// newest with `name`: `(full, name_only)`, as `get` indexes.
    pub(super) fn find(&self, name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
        let mut name_only = None;
        for i in 0..self.entries.len() {
            let Some((n, v)) = self.get(i) else { break };
            if n == name {
                if v == value {
                    return (Some(i), name_only.or(Some(i)));
                }
                name_only = name_only.or(Some(i));
            }
        }
        (None, name_only)
    }

    /// Bytes held, for the memory accounting of a connection.
    pub(super) fn capacity(&self) -> usize {
        self.bytes.capacity() + self.entries.capacity() * std::mem::size_of::<Entry>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_lookups_agree_with_the_table() {
        for (i, (name, value)) in STATIC.iter().enumerate() {
            let index = u8::try_from(i + 1).expect("61 entries");
            let first = static_name_index(name).expect("every static name");
            assert_eq!(STATIC[usize::from(first) - 1].0, *name);
            assert!(first <= index);
            for hint in 1..=61u8 {
                if !value.is_empty() && STATIC[usize::from(hint) - 1].0 == *name {
                    assert_eq!(static_field_index(hint, value), Some(index));
                }
            }
        }
        assert_eq!(static_name_index(b"x-custom"), None);
        assert_eq!(static_field_index(8, b"302"), None);
        assert_eq!(static_field_index(1, b""), None);
    }

    #[test]
    fn eviction_and_reclaiming_keep_entries_intact() {
        let mut t = DynamicTable::new(200);
        for k in 0..1000u32 {
            let value = format!("value-{k}");
            t.insert(b"name", value.as_bytes());
            assert!(t.size() <= 200);
            assert_eq!(t.get(0), Some((&b"name"[..], value.as_bytes())));
            if k > 0 {
                let before = format!("value-{}", k - 1);
                assert_eq!(t.get(1), Some((&b"name"[..], before.as_bytes())));
            }
            assert!(
                t.bytes.len() <= 2 * 200 + 64,
                "{} bytes held",
                t.bytes.len()
            );
        }
        // 4 + 9 + 32 = 45 octets an entry at this length: 4 fit in 200.
        assert_eq!(t.len(), 4);
        // Too large for the table: empties it.
        t.insert(&[b'x'; 200], b"");
        assert_eq!((t.len(), t.size()), (0, 0));
        t.insert(b"a", b"b");
        t.set_max_size(0);
        assert_eq!((t.len(), t.size()), (0, 0));
    }
}
