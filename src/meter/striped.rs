//! A counter that every forwarded event adds to, from whichever thread serves it: one cache
//! line per thread stripe, so adds from different cores never contend for one line and never
//! evict the read-mostly state beside the counter (the concurrency ladder every event reads).
//! A read sums the stripes; it is exact once the adds it should see have happened.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Stripes per counter: more than the cores a sidecar usually gets; threads beyond share.
const STRIPES: usize = 16;

/// One stripe on a cache line of its own (128 bytes: adjacent-line prefetchers pair lines).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

/// A monotonic counter striped by thread.
#[derive(Debug)]
pub struct StripedCounter {
    stripes: Box<[Stripe; STRIPES]>,
}

impl Default for StripedCounter {
    fn default() -> Self {
        Self {
            stripes: Box::new(std::array::from_fn(|_| Stripe::default())),
        }
    }
}

impl StripedCounter {
    /// Adds `n` on this thread's stripe: one uncontended atomic add.
    pub fn add(&self, n: u64) {
        if let Some(stripe) = self.stripes.get(this_threads_stripe()) {
            stripe.0.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The sum of every stripe.
    pub fn sum(&self) -> u64 {
        self.stripes.iter().fold(0u64, |sum, stripe| {
            sum.wrapping_add(stripe.0.load(Ordering::Relaxed))
        })
    }
}

/// This thread's stripe index, handed out round-robin at a thread's first add.
fn this_threads_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE.with(|stripe| {
        let mut index = stripe.get();
        if index == usize::MAX {
            index = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
            stripe.set(index);
        }
        index
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_from_many_threads_sum_exactly() {
        let counter = std::sync::Arc::new(StripedCounter::default());
        let threads: Vec<_> = (0..(STRIPES + 3))
            .map(|_| {
                let counter = std::sync::Arc::clone(&counter);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        counter.add(3);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        counter.add(1);
        assert_eq!(counter.sum(), (STRIPES as u64 + 3) * 3000 + 1);
    }

    #[test]
    fn each_stripe_has_a_cache_line_of_its_own() {
        assert!(std::mem::align_of::<Stripe>() >= 64);
        assert!(std::mem::size_of::<Stripe>() >= 64);
    }
}
