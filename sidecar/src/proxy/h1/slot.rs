//! The heap slot an exchange's state lives in while a request is on,
//! reused from request to request instead of coming from malloc each time.
//!
//! Why: the state is boxed per request (mod.rs: an idle connection must
//! not carry it), and with 64 requests in flight glibc's per-thread cache
//! (seven chunks a size) runs dry, so most of those boxes came from the
//! arena's bins and went back through them: `_int_malloc` and `_int_free`
//! were 3% of the sidecar's user-space instructions (bench/README.md,
//! "eighth pass"). A slot that goes back to a per-thread stack comes out again for
//! the next request, warm in the cache.
//!
//! Bounded as the spare buffers are (spare.rs): at most [`KEEP`] slots a
//! thread, never more than the connections open when the exchange began,
//! and trimmed with the buffers after a spike ([`release`]).

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

/// Slots kept per thread, at most: as many as spare buffers (spare.rs).
const KEEP: usize = 64;

/// This thread's free slots, all of one layout (that of the first slot
/// given back to an empty stack; a state of another layout meanwhile is
/// allocated and freed as a `Box` would be).
struct Slots {
    layout: Option<Layout>,
    free: Vec<NonNull<u8>>,
}

impl Slots {
    fn trim(&mut self, room: usize) {
        if let Some(layout) = self.layout {
            for slot in self.free.drain(room.min(self.free.len())..) {
                // SAFETY: every slot on the stack was allocated with
                // `layout` (see `take`), holds no value (its state was
                // dropped before it was given back) and is on the stack
                // once; drained, it is nowhere else.
                #[allow(unsafe_code)]
                unsafe {
                    dealloc(slot.as_ptr(), layout)
                };
            }
        }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.trim(0);
    }
}

thread_local! {
    static SLOTS: RefCell<Slots> = const {
        RefCell::new(Slots {
            layout: None,
            free: Vec::new(),
        })
    };
}

/// A future on the heap, in a reused slot: what `Box::pin(future)` is,
/// with the allocation kept for the next one.
pub(super) struct Pooled<F> {
    state: NonNull<F>,
    /// Connections open when it began: the stack's bound when it ends.
    open: usize,
}

// SAFETY: `Pooled` owns its `F` as a `Box<F>` would; the slot's memory is
// plain heap memory, freed or reused on whichever thread drops it.
#[allow(unsafe_code)]
unsafe impl<F: Send> Send for Pooled<F> {}
// SAFETY: as for `Send`; `&Pooled` gives no access to the state.
#[allow(unsafe_code)]
unsafe impl<F: Sync> Sync for Pooled<F> {}

impl<F> Pooled<F> {
    /// Moves `state` into a slot; `open`: the connections open now.
    pub(super) fn new(state: F, open: usize) -> Self {
        let layout = Layout::new::<F>();
        let slot: NonNull<F> = if layout.size() == 0 {
            NonNull::dangling()
        } else {
            take(layout)
                .unwrap_or_else(|| {
                    // SAFETY: the layout's size is not zero (checked above).
                    #[allow(unsafe_code)]
                    let fresh = unsafe { alloc(layout) };
                    NonNull::new(fresh).unwrap_or_else(|| handle_alloc_error(layout))
                })
                .cast()
        };
        // SAFETY: the slot is valid for writes of an `F` (allocated with
        // `F`'s layout, or dangling and `F` zero-sized) and holds nothing.
        #[allow(unsafe_code)]
        unsafe {
            slot.as_ptr().write(state)
        };
        Pooled { state: slot, open }
    }
}

impl<F: Future> Future for Pooled<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the state is never moved out of its slot: it is dropped
        // there (`drop` below) before the slot is reused or freed, so the
        // pin's guarantee holds for it though `Pooled` itself may move.
        #[allow(unsafe_code)]
        let state = unsafe { Pin::new_unchecked(&mut *self.state.as_ptr()) };
        state.poll(cx)
    }
}

impl<F> Drop for Pooled<F> {
    fn drop(&mut self) {
        // SAFETY: the slot holds the `F` written in `new`, dropped only
        // here, once.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::drop_in_place(self.state.as_ptr())
        };
        let layout = Layout::new::<F>();
        if layout.size() != 0 {
            give(self.state.cast(), layout, self.open);
        }
    }
}

/// A free slot of `layout`, if this thread keeps one.
fn take(layout: Layout) -> Option<NonNull<u8>> {
    SLOTS
        .try_with(|slots| {
            let mut slots = slots.borrow_mut();
            if slots.layout == Some(layout) {
                slots.free.pop()
            } else {
                None
            }
        })
        .ok()
        .flatten()
}

/// Keeps an emptied slot for the next exchange, or frees it.
fn give(slot: NonNull<u8>, layout: Layout, open: usize) {
    let kept = SLOTS
        .try_with(|slots| {
            let mut slots = slots.borrow_mut();
            let room = KEEP.min(open);
            // An empty stack takes the layout of whatever comes back.
            if slots.free.is_empty() {
                slots.layout = Some(layout);
            }
            if slots.layout == Some(layout) && slots.free.len() < room {
                slots.free.push(slot);
                true
            } else {
                slots.trim(room);
                false
            }
        })
        .unwrap_or(false);
    if !kept {
        // SAFETY: the slot was allocated with `layout` (by `new`, or kept
        // by `give` under the same layout), holds no value, and is
        // referenced nowhere else.
        #[allow(unsafe_code)]
        unsafe {
            dealloc(slot.as_ptr(), layout)
        };
    }
}

/// Frees this thread's slots beyond `open` (spare.rs's `release`).
pub(super) fn release(open: usize) {
    let _ = SLOTS.try_with(|slots| {
        let mut slots = slots.borrow_mut();
        slots.trim(KEEP.min(open));
        slots.free.shrink_to_fit();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn kept() -> usize {
        SLOTS.with(|s| s.borrow().free.len())
    }

    /// Counts its drops, so a state dropped twice or never shows.
    struct State {
        drops: Arc<AtomicUsize>,
        payload: [u64; 16],
    }

    impl Drop for State {
        fn drop(&mut self) {
            self.drops.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Future for State {
        type Output = u64;
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<u64> {
            Poll::Ready(self.payload.iter().sum())
        }
    }

    #[tokio::test]
    async fn a_slot_is_reused_its_state_dropped_once_and_the_stack_bounded() {
        release(0);
        let drops = Arc::new(AtomicUsize::new(0));
        let state = |n| State {
            drops: drops.clone(),
            payload: [n; 16],
        };
        let first = Pooled::new(state(1), 4);
        let addr = first.state.as_ptr() as usize;
        assert_eq!(first.await, 16);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(kept(), 1);
        let second = Pooled::new(state(2), 4);
        assert_eq!(second.state.as_ptr() as usize, addr, "the same slot");
        assert_eq!(kept(), 0);
        // Dropped unpolled: the state is dropped all the same.
        drop(second);
        assert_eq!(drops.load(Ordering::SeqCst), 2);

        // Never more than the connections open, nor than KEEP.
        let many: Vec<_> = (0..KEEP as u64 + 5)
            .map(|n| Pooled::new(state(n), 1000))
            .collect();
        drop(many);
        assert_eq!(kept(), KEEP);
        drop(Pooled::new(state(0), 3));
        assert_eq!(kept(), 3, "trimmed to the connections open");
        release(1);
        assert_eq!(kept(), 1);
        release(0);
        assert_eq!(kept(), 0);
        assert_eq!(drops.load(Ordering::SeqCst), 2 + KEEP + 5 + 1);

        // A state of another layout is not kept beside them; an empty
        // stack takes whichever comes back first.
        drop(Pooled::new(state(0), 10));
        drop(Pooled::new(async { 1u8 }, 10));
        assert_eq!(kept(), 1);
        release(0);
        drop(Pooled::new(async { 1u8 }, 10));
        assert_eq!(kept(), 1);
        assert!(take(Layout::new::<State>()).is_none());
        release(0);
    }
}
