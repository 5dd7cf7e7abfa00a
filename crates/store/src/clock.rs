//! Store clock: seconds since the store started ("relative time", as memcached keeps it), plus
//! the Unix time of the start, so absolute exptimes can be converted.
//!
//! Not for: wall-clock formatting or timers. A manual clock lets tests move time without sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[derive(Clone, Debug)]
pub struct Clock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Unix seconds when the clock started (memcached's `process_started`).
    started_unix_s: i64,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    System(Instant),
    /// Manually advanced relative seconds.
    Manual(AtomicU64),
}

impl Clock {
    pub fn system() -> Clock {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        // memcached sets process_started two seconds in the past so that relative time 0/1 are
        // never confused with "never" and "expired"; we keep the same offset for identical math.
        Clock { inner: Arc::new(Inner { started_unix_s: now - 2, kind: Kind::System(Instant::now()) }) }
    }

    /// A clock that only moves when `advance` is called; starts at relative second 2.
    pub fn manual(started_unix_s: i64) -> Clock {
        Clock { inner: Arc::new(Inner { started_unix_s, kind: Kind::Manual(AtomicU64::new(2)) }) }
    }

    /// Seconds since the start (memcached's `current_time`).
    pub fn now_rel_s(&self) -> u32 {
        match &self.inner.kind {
            Kind::System(start) => (start.elapsed().as_secs() + 2) as u32,
            Kind::Manual(s) => s.load(Ordering::Relaxed) as u32,
        }
    }

    pub fn started_unix_s(&self) -> i64 {
        self.inner.started_unix_s
    }

    /// Current Unix time in seconds as this clock sees it.
    pub fn now_unix_s(&self) -> i64 {
        self.inner.started_unix_s + self.now_rel_s() as i64
    }

    /// Advance a manual clock; no effect on a system clock.
    pub fn advance(&self, secs: u64) {
        if let Kind::Manual(s) = &self.inner.kind {
            s.fetch_add(secs, Ordering::Relaxed);
        }
    }
}
