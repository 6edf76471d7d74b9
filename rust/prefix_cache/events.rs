//! The KV event queue of a prefix cache: a bounded ring of [`CacheEvent`]s.
//!
//! A consumer (a KV-aware router, an offloading tier) drains it after each step. Events
//! it does not drain must not grow memory without limit, so the queue holds at most
//! `max_events`; when it is full a new event drops the *oldest* one and counts it in
//! `dropped`. Keeping the newest is what a consumer that lost events can still use (as
//! vLLM's event publisher keeps its newest batches for replay): the events it drains are
//! exact and current, and a growing `dropped_events` tells it that its mirror of the
//! cache missed the events before them, so it must resynchronise (e.g. treat the gap as
//! an `AllCleared`).

use std::collections::VecDeque;

use super::types::CacheEvent;

#[derive(Clone, Debug)]
pub(super) struct EventQueue {
    buf: VecDeque<CacheEvent>,
    cap: usize,
    dropped: u64,
}

impl EventQueue {
    /// A queue of at most `cap` events (`1..=MAX_EVENTS_LIMIT`, checked by the config).
    pub(super) fn new(cap: usize) -> Self {
        Self { buf: VecDeque::new(), cap, dropped: 0 }
    }

    pub(super) fn push(&mut self, e: CacheEvent) {
        if self.buf.len() >= self.cap {
            self.buf.pop_front();
            self.dropped += 1;
        }
        self.buf.push_back(e);
    }

    /// Move every queued event into `out`, oldest first.
    pub(super) fn drain_into(&mut self, out: &mut Vec<CacheEvent>) {
        out.extend(self.buf.drain(..));
    }

    pub(super) fn len(&self) -> usize {
        self.buf.len()
    }

    pub(super) fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefix_cache::types::CacheEventKind;

    fn ev(clock: u64) -> CacheEvent {
        CacheEvent { kind: CacheEventKind::Stored, block: None, key: clock as u128, parent_key: None, tokens: 1, clock, group: 0, medium: 0 }
    }

    #[test]
    fn keeps_the_newest_events_and_counts_the_dropped_ones() {
        let mut q = EventQueue::new(3);
        for t in 0..10 {
            q.push(ev(t));
            assert_eq!(q.len(), (t as usize + 1).min(3));
        }
        assert_eq!(q.dropped(), 7);
        let mut out = Vec::new();
        q.drain_into(&mut out);
        assert_eq!(out.iter().map(|e| e.clock).collect::<Vec<_>>(), vec![7, 8, 9]);
        assert_eq!(q.len(), 0);
        q.push(ev(10));
        q.drain_into(&mut out);
        assert_eq!((out.len(), q.dropped()), (4, 7), "draining in time drops nothing");
    }
}
