//! Spare buffers: the HTTP/1 fast path's and the HTTP/2 codec's read and
//! write buffers go back to a small per-thread stack when a connection ends
//! or goes idle, and the next connection takes them from there instead of
//! from malloc.
//!
//! Why: a one-request connection used to allocate and free a 4 KiB read
//! buffer, a 1 KiB write buffer and the app connection's 16 KiB read
//! buffer. Chunks that size are past glibc's per-thread cache, so each
//! free went through the bins (coalescing with its neighbours, and at the
//! top of the heap giving pages back to be faulted in again): about 6% of
//! a connection's CPU time under `perf` (bench/README.md, "Issue #14,
//! third pass"), where nginx keeps its buffers in per-connection pools.
//!
//! Only buffers of exactly a class's size are kept (one that grew for a
//! big head or body goes back to malloc). A stack holds at most [`KEEP`]
//! buffers, and never more than there are connections open (the caller
//! says how many): a stack grows only while connections come and go, and
//! the last connection to close leaves at most one buffer of each class
//! behind, so an idle sidecar holds what it held before (memory.rs gives
//! the rest back to the system after a spike).

use std::cell::RefCell;

use bytes::BytesMut;

/// Buffers kept per class per thread, at most. With 64 connections at a
/// time the number of buffers in use swings by about as many: one batch
/// of events from epoll accepts dozens of connections (each takes its
/// buffers), a later one ends them. A stack of 8 missed five takes in six
/// there; 64 misses almost none (bench/README.md). It is bounded by the
/// connections open as well (see the module's doc).
const KEEP: usize = 64;

/// The buffer classes of `BytesMut`s: capacities in bytes.
#[derive(Clone, Copy)]
pub(crate) enum ReadClass {
    /// An HTTP/1 client connection's read buffer
    /// ([`crate::proxy::h1::READ_BUF`]).
    Http1Client,
    /// An HTTP/1 app connection's read buffer (16 KiB: what a body relay
    /// reads at a time).
    Http1App,
    /// An HTTP/2 client connection's read buffer while it reads (16 KiB:
    /// one frame of the size the sidecar announces, and its header).
    Http2Client,
}

/// [`ReadClass::Http1App`]'s size.
pub(crate) const APP_READ: usize = 16 * 1024;
/// [`ReadClass::Http2Client`]'s size.
pub(crate) const H2_READ: usize = 16 * 1024;

impl ReadClass {
    const fn size(self) -> usize {
        match self {
            ReadClass::Http1Client => crate::proxy::h1::READ_BUF,
            ReadClass::Http1App => APP_READ,
            ReadClass::Http2Client => H2_READ,
        }
    }
}

/// The write buffer classes (`Vec<u8>`).
#[derive(Clone, Copy)]
pub(crate) enum OutClass {
    /// An HTTP/1 request's first write buffer (the rewritten head).
    Http1,
    /// An HTTP/2 client connection's frames being written.
    Http2,
}

/// [`OutClass::Http1`]'s size.
pub(crate) const H1_OUT: usize = 1024;
/// [`OutClass::Http2`]'s size: a frame of 16 KiB and a few small ones.
pub(crate) const H2_OUT: usize = 16 * 1024 + 256;

impl OutClass {
    const fn size(self) -> usize {
        match self {
            OutClass::Http1 => H1_OUT,
            OutClass::Http2 => H2_OUT,
        }
    }
}

/// The spare stacks of one thread.
struct Spare {
    client_read: Vec<BytesMut>,
    app_read: Vec<BytesMut>,
    h2_read: Vec<BytesMut>,
    h1_out: Vec<Vec<u8>>,
    h2_out: Vec<Vec<u8>>,
}

impl Spare {
    fn stack(&mut self, class: ReadClass) -> &mut Vec<BytesMut> {
        match class {
            ReadClass::Http1Client => &mut self.client_read,
            ReadClass::Http1App => &mut self.app_read,
            ReadClass::Http2Client => &mut self.h2_read,
        }
    }

    fn out(&mut self, class: OutClass) -> &mut Vec<Vec<u8>> {
        match class {
            OutClass::Http1 => &mut self.h1_out,
            OutClass::Http2 => &mut self.h2_out,
        }
    }
}

thread_local! {
    static SPARE: RefCell<Spare> = const {
        RefCell::new(Spare {
            client_read: Vec::new(),
            app_read: Vec::new(),
            h2_read: Vec::new(),
            h1_out: Vec::new(),
            h2_out: Vec::new(),
        })
    };
}

/// An empty buffer of the class's capacity: a spare one if there is one.
pub(crate) fn take_bytes(class: ReadClass) -> BytesMut {
    SPARE
        .try_with(|spare| spare.borrow_mut().stack(class).pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| BytesMut::with_capacity(class.size()))
}

/// Keeps `buf`'s allocation for the next [`take_bytes`] if it is of the
/// class's size and there is room with `open` connections open; frees it
/// otherwise.
pub(crate) fn give_bytes(class: ReadClass, mut buf: BytesMut, open: usize) {
    if buf.capacity() == 0 {
        return;
    }
    buf.clear();
    // Emptied, this moves nothing: it only takes back the room in front
    // that reading consumed, so the capacity is the allocation's again.
    // (A buffer still shared with a `Bytes` gets a fresh allocation of the
    // class's size instead, never the shared one.)
    buf.reserve(class.size());
    if buf.capacity() != class.size() {
        return;
    }
    let _ = SPARE.try_with(|spare| keep(spare.borrow_mut().stack(class), buf, open));
}

/// An empty write buffer of the class's capacity.
pub(crate) fn take_out(class: OutClass) -> Vec<u8> {
    SPARE
        .try_with(|spare| spare.borrow_mut().out(class).pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| Vec::with_capacity(class.size()))
}

/// [`give_bytes`] for a write buffer.
pub(crate) fn give_out(class: OutClass, mut out: Vec<u8>, open: usize) {
    if out.capacity() != class.size() {
        return;
    }
    out.clear();
    let _ = SPARE.try_with(|spare| keep(spare.borrow_mut().out(class), out, open));
}

/// Trims this thread's stacks to `open` buffers each (the connections
/// open now): called after a spike, when no buffer may come back for a
/// long time to trim them.
pub(crate) fn release(open: usize) {
    let room = KEEP.min(open);
    let _ = SPARE.try_with(|spare| {
        let mut guard = spare.borrow_mut();
        let spare = &mut *guard;
        for stack in [
            &mut spare.client_read,
            &mut spare.app_read,
            &mut spare.h2_read,
        ] {
            stack.truncate(room);
            stack.shrink_to_fit();
        }
        for stack in [&mut spare.h1_out, &mut spare.h2_out] {
            stack.truncate(room);
            stack.shrink_to_fit();
        }
    });
}

/// Pushes `buf` on `stack` if the stack is below both bounds, and trims
/// it to the open connections (fewer than it holds: they closed).
fn keep<B>(stack: &mut Vec<B>, buf: B, open: usize) {
    let room = KEEP.min(open);
    if stack.len() < room {
        stack.push(buf);
    } else {
        stack.truncate(room);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spares(class: ReadClass) -> usize {
        SPARE.with(|s| s.borrow_mut().stack(class).len())
    }

    #[test]
    fn a_given_buffer_is_taken_again_and_the_stacks_are_bounded() {
        let mut a = take_bytes(ReadClass::Http1Client);
        assert_eq!(a.capacity(), crate::proxy::h1::READ_BUF);
        a.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        // Consumed from the front, as the exchange does: still the whole
        // allocation when it comes back.
        bytes::Buf::advance(&mut a, 5);
        let start = a.as_ptr() as usize - 5;
        give_bytes(ReadClass::Http1Client, a, 1);
        let b = take_bytes(ReadClass::Http1Client);
        assert_eq!(b.as_ptr() as usize, start, "the same allocation");
        assert!(b.is_empty());
        assert_eq!(b.capacity(), crate::proxy::h1::READ_BUF);

        // A grown buffer goes back to malloc.
        let mut grown = take_bytes(ReadClass::Http1App);
        grown.reserve(APP_READ * 2);
        give_bytes(ReadClass::Http1App, grown, 10);
        assert_eq!(spares(ReadClass::Http1App), 0);
        let mut grown = take_out(OutClass::Http1);
        grown.reserve(H1_OUT * 4);
        give_out(OutClass::Http1, grown, 10);
        SPARE.with(|s| assert!(s.borrow().h1_out.is_empty()));

        for _ in 0..KEEP + 3 {
            give_bytes(ReadClass::Http1App, BytesMut::with_capacity(APP_READ), 1000);
            give_out(OutClass::Http1, Vec::with_capacity(H1_OUT), 1000);
        }
        assert_eq!(spares(ReadClass::Http1App), KEEP);
        SPARE.with(|s| assert_eq!(s.borrow().h1_out.len(), KEEP));

        // The connections close: the stacks shrink with them, down to one
        // buffer when the last one gives its own back.
        give_bytes(ReadClass::Http1App, BytesMut::with_capacity(APP_READ), 5);
        assert_eq!(spares(ReadClass::Http1App), 5);
        give_out(OutClass::Http1, Vec::with_capacity(H1_OUT), 1);
        SPARE.with(|s| assert_eq!(s.borrow().h1_out.len(), 1));
        assert_eq!(take_out(OutClass::Http1).capacity(), H1_OUT);
        SPARE.with(|s| assert!(s.borrow().h1_out.is_empty()));
    }

    #[test]
    fn a_release_after_a_spike_empties_the_stacks_down_to_the_open_connections() {
        for _ in 0..10 {
            give_bytes(ReadClass::Http1App, BytesMut::with_capacity(APP_READ), 1000);
            give_bytes(
                ReadClass::Http1Client,
                BytesMut::with_capacity(crate::proxy::h1::READ_BUF),
                1000,
            );
            give_out(OutClass::Http1, Vec::with_capacity(H1_OUT), 1000);
        }
        assert_eq!(spares(ReadClass::Http1App), 10);
        release(2);
        assert_eq!(spares(ReadClass::Http1App), 2);
        assert_eq!(spares(ReadClass::Http1Client), 2);
        SPARE.with(|s| assert_eq!(s.borrow().h1_out.len(), 2));
        release(0);
        assert_eq!(spares(ReadClass::Http1App), 0);
        assert_eq!(spares(ReadClass::Http1Client), 0);
        SPARE.with(|s| assert!(s.borrow().h1_out.is_empty()));
    }

    #[test]
    fn a_buffer_shared_with_bytes_is_never_handed_out_again() {
        let mut buf = take_bytes(ReadClass::Http1Client);
        buf.extend_from_slice(b"abcdef");
        let shared = buf.split_to(3).freeze();
        give_bytes(ReadClass::Http1Client, buf, 1);
        let mut next = take_bytes(ReadClass::Http1Client);
        next.extend_from_slice(b"xyz");
        assert_eq!(&shared[..], b"abc", "the frozen bytes are untouched");
        let range = shared.as_ptr() as usize..shared.as_ptr() as usize + 4096;
        assert!(!range.contains(&(next.as_ptr() as usize)));
    }
}
