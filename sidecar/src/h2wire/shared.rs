//! What the server and client sides share: the stream map's hasher, the
//! field conversion for the encoder, the count of open connections the
//! spare buffer stacks are bounded by.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::hpack::FieldRef;

/// Stream ids as keys. Looked up for every frame and every handle call
/// (about 27 hashes a gRPC call), where SipHash cost about 100 instructions
/// each. The client picks the ids, but at most twice the concurrent-stream
/// limit are in the map at once, so even ids chosen to collide cost a
/// short scan, never more.
pub(crate) type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// One multiplication (Fibonacci hashing), its high half folded into the
/// low one so that both hashbrown's bucket bits and its tag bits vary.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b) ^ (self.0 as u32).rotate_left(8));
        }
    }

    fn write_u32(&mut self, n: u32) {
        let h = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Connections open, on all threads: the spare stacks keep no more of
/// these buffers than that (so the last connection to close leaves at most
/// one behind), and at most [`H2_SPARE`] each.
static OPEN: AtomicUsize = AtomicUsize::new(0);
/// A spare stack's most HTTP/2 buffers (16 KiB each): a few busy
/// connections turning idle and busy again reuse them; thousands of idle
/// ones hold none.
const H2_SPARE: usize = 16;

pub(crate) fn spare_room() -> usize {
    OPEN.load(Ordering::Relaxed).min(H2_SPARE)
}

/// Counts a connection in [`OPEN`] while it lives.
pub(crate) struct Counted(());

impl Counted {
    pub(crate) fn new() -> Self {
        OPEN.fetch_add(1, Ordering::Relaxed);
        Counted(())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) fn field<'a>(name: &'a http::HeaderName, value: &'a http::HeaderValue) -> FieldRef<'a> {
    let f = FieldRef::new(name.as_str().as_bytes(), value.as_bytes());
    if value.is_sensitive() {
        f.sensitive()
    } else {
        f
    }
}
