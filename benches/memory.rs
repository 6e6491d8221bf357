//! Memory per tracked session: 100,000 sessions holding grace windows,
//! counted by a global allocator that tracks live heap bytes, and whether
//! the figure returns to the baseline once the windows expire (and the
//! records' retention passes) or the sessions finish. The naive baseline is
//! measured the same way in the same run.
//!
//! `cargo bench --bench memory`. Under `cargo test` it runs with 2,000
//! sessions and checks the return to baseline (no timing involved).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvgate::{Config, Gate, ManualClock, Reason};

use common::naive::NaiveGate;
use common::{gate_cycle, naive_cycle, session_ids, Fixed};

/// Live heap bytes as requested by the program (not the allocator's
/// rounding or its own bookkeeping, which depend on the allocator).
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are the caller's; the counter is a
// side effect that allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is (see the impl).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is (see the impl).
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is (see the impl).
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is (see the impl).
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::SeqCst)
}

/// Live bytes at each stage, relative to the baseline (the empty gate).
#[derive(Debug)]
struct Stages {
    design: &'static str,
    sessions: usize,
    id_len: usize,
    in_grace: isize,
    after_expiry: isize,
    after_retention: isize,
    after_finish: isize,
    /// After the finished sessions' windows would have ended: their timer
    /// entries (hints, left in place by a finish) have fired.
    after_finish_grace: isize,
}

impl Stages {
    fn per_session(&self) -> f64 {
        self.in_grace as f64 / self.sessions as f64 - self.id_len as f64
    }
}

fn kvgate(n: usize) -> Stages {
    let config = Config::reference();
    let ids = session_ids("session", n);
    let clock = Arc::new(ManualClock::new(0));
    let gate = Gate::with_clock(config.clone(), Fixed::HOT, clock.clone()).expect("valid config");
    // One turn first: this thread's first acquire creates its spare sleeper
    // and attempt waiter (96 bytes, kept for the thread's next acquire).
    gate_cycle(&gate, b"warm-up", Reason::ResidentPrefix);
    assert!(gate.finish_session(b"warm-up").is_some());
    clock.advance(config.idle_grace + Duration::from_secs(1));
    gate.stats(); // the warm-up window's timer entry fires
    let base = live();

    // Every session admitted under pressure (resident) and released: each
    // now holds an idle grace window.
    for id in &ids {
        gate_cycle(&gate, id, Reason::ResidentPrefix);
    }
    let s = gate.stats();
    assert_eq!(
        (s.reserved_in_grace, s.tracked_sessions),
        (n as u64, n as u64)
    );
    let in_grace = live() - base;

    // The windows expire: reservations end; each record is kept for its
    // per-session stats until `session_retention` has passed.
    clock.advance(config.idle_grace + Duration::from_secs(1));
    let s = gate.stats(); // fires every due expiry
    assert_eq!((s.reserved_in_grace, s.grace_expired), (0, n as u64));
    let after_expiry = live() - base;

    clock.advance(config.session_retention);
    let s = gate.stats();
    assert_eq!(s.tracked_sessions, 0, "retention passed: records dropped");
    let after_retention = live() - base;

    // Again, and this time the sessions finish.
    for id in &ids {
        gate_cycle(&gate, id, Reason::ResidentPrefix);
    }
    for id in &ids {
        assert!(gate.finish_session(id).is_some());
    }
    assert_eq!(gate.stats().tracked_sessions, 0);
    let after_finish = live() - base;
    clock.advance(config.idle_grace + Duration::from_secs(1));
    gate.stats(); // fires every due timer entry, stale ones included
    let after_finish_grace = live() - base;
    Stages {
        design: "kvgate",
        sessions: n,
        id_len: ids[0].len(),
        in_grace,
        after_expiry,
        after_retention,
        after_finish,
        after_finish_grace,
    }
}

fn naive(n: usize) -> Stages {
    let config = Config::reference();
    let ids = session_ids("session", n);
    let naive = NaiveGate::new(&config, Fixed::HOT);
    let base = live();
    for id in &ids {
        naive_cycle(&naive, id, Reason::ResidentPrefix);
    }
    assert_eq!(naive.reserved_count(), n);
    let in_grace = live() - base;
    naive.advance(config.idle_grace + Duration::from_secs(1));
    assert_eq!(naive.reserved_count(), 0); // purged
    let after_expiry = live() - base;
    for id in &ids {
        naive_cycle(&naive, id, Reason::ResidentPrefix);
    }
    for id in &ids {
        naive.finish_session(id);
    }
    assert_eq!(naive.reserved_count(), 0);
    let after_finish = live() - base;
    Stages {
        design: "naive",
        sessions: n,
        id_len: ids[0].len(),
        in_grace,
        after_expiry,
        // The naive design keeps nothing past expiry, and nothing after a finish.
        after_retention: after_expiry,
        after_finish,
        after_finish_grace: after_finish,
    }
}

fn main() {
    let bench = common::bench_mode();
    let n = if bench { 100_000 } else { 2_000 };
    let rows = [kvgate(n), naive(n)];
    let naive_per = rows[1].per_session();
    println!("memory: {n} sessions in grace windows (live heap bytes, id bytes excluded)");
    println!(
        "  {:<7} {:>12} {:>8} {:>14} {:>16} {:>14} {:>14}",
        "design",
        "per session",
        "x naive",
        "after expiry",
        "after retention",
        "after finish",
        "+ grace"
    );
    for r in &rows {
        println!(
            "  {:<7} {:>10.1} B {:>8.2} {:>12} B {:>14} B {:>12} B {:>12} B",
            r.design,
            r.per_session(),
            r.per_session() / naive_per,
            r.after_expiry,
            r.after_retention,
            r.after_finish,
            r.after_finish_grace
        );
    }
    // kvgate gives every byte back: once the records' retention has passed,
    // and once the finished sessions' timer hints have fired.
    assert_eq!(rows[0].after_retention, 0, "kvgate after retention");
    assert_eq!(rows[0].after_finish_grace, 0, "kvgate after finish + grace");
    if bench {
        let rows: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "    {{\"design\": \"{}\", \"sessions\": {}, \"id_len\": {}, \
                     \"bytes_per_session\": {:.1}, \"in_grace\": {}, \"after_expiry\": {}, \
                     \"after_retention\": {}, \"after_finish\": {}, \"after_finish_grace\": {}}}",
                    r.design,
                    r.sessions,
                    r.id_len,
                    r.per_session(),
                    r.in_grace,
                    r.after_expiry,
                    r.after_retention,
                    r.after_finish,
                    r.after_finish_grace
                )
            })
            .collect();
        common::write_results("memory", &common::json_rows("memory", &rows));
    }
}
