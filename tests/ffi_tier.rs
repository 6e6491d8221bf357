//! The engine's host tier of KV through the C ABI, as a C host would tell
//! it: `kvgate_attempt_answer_usage_tiered`, the tier probe
//! (`kvgate_config_set_tier_probe`), `kvgate_release_with_tier_report`, and
//! the three figures they feed (`kvgate_stats`, `kvgate_metrics_text`).
//!
//! What the header promises of each refusal is checked here, one test per
//! promise: the status and its message, that nothing changed (the attempt
//! answers again, the lease releases again, the figures the gate knew are
//! kept) and that the refusal is counted.

use std::ffi::c_void;
use std::mem::{size_of, MaybeUninit};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use kvgate::ffi::kvgate_status::*;
use kvgate::ffi::kvgate_step_kind::*;
use kvgate::ffi::*;

#[path = "support/ffi_support.rs"]
mod ffi_support;
use ffi_support::{gate_with, last_error, metrics, stats, waker};

const CAPACITY: u64 = 1000;
const TIER: u64 = 4000;
const RELOAD: f64 = 1e5;

fn gate(reference: bool) -> *mut kvgate_gate {
    gate_with(reference, |_| {})
}

fn free(gate: *mut kvgate_gate, w: *mut kvgate_waker) {
    // SAFETY: live handles, freed once, nothing else in progress.
    unsafe {
        kvgate_free(gate);
        kvgate_waker_free(w);
    }
}

/// The tier figures of the stats: (tier tokens, refused answers, tier hits).
fn tier_figures(gate: *mut kvgate_gate) -> (u64, u64, u64) {
    let s = stats(gate);
    (
        s.working_set_tier_tokens,
        s.working_set_refused_answers,
        s.working_set_tier_cached_tokens,
    )
}

/// An event-loop attempt and its latest step.
struct Driven {
    attempt: *mut kvgate_attempt,
    step: kvgate_step,
}

fn begin(gate: *mut kvgate_gate, session: &str, w: *mut kvgate_waker) -> Driven {
    let mut attempt = ptr::null_mut();
    let mut step = MaybeUninit::uninit();
    // SAFETY: live gate and waker, a session slice, writable outs.
    let status = unsafe {
        kvgate_attempt_begin(
            gate,
            session.as_ptr(),
            session.len(),
            100,
            -1,
            w,
            1,
            &mut attempt,
            step.as_mut_ptr(),
        )
    };
    assert_eq!(status, KVGATE_OK, "{}", last_error());
    Driven {
        attempt,
        // SAFETY: written on KVGATE_OK.
        step: unsafe { step.assume_init() },
    }
}

/// A step no call writes: a refused answer must leave it as it is.
const UNTOUCHED: kvgate_step = kvgate_step {
    kind: KVGATE_STEP_FAILED,
    status: KVGATE_PANIC,
    until_ns: 7,
    sleep_ns: 7,
    admission: kvgate_admission {
        lease: 7,
        reason: kvgate_reason::KVGATE_REASON_OPEN,
        wait_sec: 7.0,
        usage: 7.0,
        hit_ratio: 7.0,
        retain_session: true,
        waited: true,
    },
};

impl Driven {
    /// `kvgate_attempt_answer_usage_tiered` at usage 0; the step is kept
    /// on `KVGATE_OK`, and must be untouched otherwise.
    fn tiered(&mut self, capacity: u64, tier: u64, reload: f64) -> kvgate_status {
        let mut step = UNTOUCHED;
        // SAFETY: a live attempt and a writable out.
        let status = unsafe {
            kvgate_attempt_answer_usage_tiered(
                self.attempt,
                0.0,
                capacity,
                if capacity > 0 { 16 } else { 0 },
                0.0,
                tier,
                reload,
                &mut step,
            )
        };
        if status == KVGATE_OK {
            self.step = step;
        } else {
            assert_eq!(step, UNTOUCHED, "a refused answer wrote its out_step");
        }
        status
    }

    /// The plain `kvgate_attempt_answer_usage`, which says nothing of a tier.
    fn plain(&mut self, capacity: u64) -> kvgate_status {
        let mut step = MaybeUninit::uninit();
        // SAFETY: a live attempt and a writable out.
        let status = unsafe {
            kvgate_attempt_answer_usage(self.attempt, 0.0, capacity, 16, 0.0, step.as_mut_ptr())
        };
        if status == KVGATE_OK {
            // SAFETY: written on KVGATE_OK.
            self.step = unsafe { step.assume_init() };
        }
        status
    }

    fn lease(&self) -> u64 {
        assert_eq!(self.step.kind, KVGATE_STEP_ADMITTED, "{:?}", self.step);
        self.step.admission.lease
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        // SAFETY: the attempt is live and freed once, here.
        unsafe { kvgate_attempt_free(self.attempt) };
    }
}

fn release(gate: *mut kvgate_gate, lease: u64) {
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_release(gate, lease) }, KVGATE_OK);
}

/// A working-set gate told `CAPACITY` tokens and a tier of `TIER`.
fn tiered_gate(w: *mut kvgate_waker) -> *mut kvgate_gate {
    let g = gate(false);
    let mut a = begin(g, "first", w);
    assert_eq!(
        a.tiered(CAPACITY, TIER, RELOAD),
        KVGATE_OK,
        "{}",
        last_error()
    );
    release(g, a.lease());
    assert_eq!(tier_figures(g), (TIER, 0, 0));
    assert_eq!(stats(g).working_set_capacity_tokens, CAPACITY);
    g
}

#[test]
fn a_valid_tier_shows_in_the_stats_and_the_metrics() {
    let w = waker();
    let g = tiered_gate(w);
    let text = metrics(g);
    for line in [
        "# TYPE kvgate_working_set_tier_tokens gauge\nkvgate_working_set_tier_tokens 4000\n",
        "# TYPE kvgate_refused_answers_total counter\nkvgate_refused_answers_total 0\n",
        "# TYPE kvgate_tier_cached_tokens_total counter\nkvgate_tier_cached_tokens_total 0\n",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    // A tier as large as the GPU cache is the smallest one accepted.
    let g2 = gate(false);
    let mut a = begin(g2, "s", w);
    assert_eq!(a.tiered(CAPACITY, CAPACITY, RELOAD), KVGATE_OK);
    assert_eq!(tier_figures(g2), (CAPACITY, 0, 0));
    drop(a);
    // SAFETY: a live gate, freed once.
    unsafe { kvgate_free(g2) };
    free(g, w);
}

#[test]
fn a_refused_tiered_answer_changes_nothing_and_the_attempt_answers_again() {
    let w = waker();
    let g = tiered_gate(w);
    let mut a = begin(g, "s", w);
    assert_eq!(a.step.kind, KVGATE_STEP_PROBE_USAGE);
    let cases: [(u64, u64, f64, &str); 7] = [
        (
            CAPACITY,
            500,
            RELOAD,
            "is smaller than the GPU cache (1000 tokens)",
        ),
        // The answer's own capacity, larger than its tier.
        (
            8000,
            6000,
            RELOAD,
            "(6000 tokens) is smaller than the GPU cache (8000",
        ),
        (
            CAPACITY,
            TIER,
            f64::NAN,
            "reload rate must be finite and > 0",
        ),
        (CAPACITY, TIER, 0.0, "reload rate must be finite and > 0"),
        (CAPACITY, TIER, -1.0, "reload rate must be finite and > 0"),
        (
            CAPACITY,
            TIER,
            f64::INFINITY,
            "reload rate must be finite and > 0",
        ),
        // No tier after one was told.
        (CAPACITY, 0, 0.0, "told a KV tier before and none now"),
    ];
    for (n, (capacity, tier, reload, why)) in cases.into_iter().enumerate() {
        assert_eq!(a.tiered(capacity, tier, reload), KVGATE_INVALID_ARGUMENT);
        let message = last_error();
        assert!(
            message.starts_with("kvgate_attempt_answer_usage_tiered: ") && message.contains(why),
            "{message}"
        );
        // Counted, and nothing else changed.
        assert_eq!(tier_figures(g), (TIER, n as u64 + 1, 0));
        let s = stats(g);
        assert_eq!(s.working_set_capacity_tokens, CAPACITY);
        assert_eq!((s.pending_attempts, s.cancelled), (1, 0));
    }
    // The attempt still waits for its usage answer, and takes a good one.
    assert_eq!(a.step.kind, KVGATE_STEP_PROBE_USAGE);
    assert_eq!(a.tiered(CAPACITY, TIER, RELOAD), KVGATE_OK);
    release(g, a.lease());
    assert_eq!(tier_figures(g), (TIER, 7, 0));
    drop(a);
    free(g, w);
}

#[test]
fn after_a_refused_answer_the_plain_answer_keeps_the_tier() {
    let w = waker();
    let g = tiered_gate(w);
    let mut a = begin(g, "s", w);
    assert_eq!(a.tiered(CAPACITY, 0, 0.0), KVGATE_INVALID_ARGUMENT);
    // The plain answer says nothing of a tier: accepted, the tier kept.
    assert_eq!(a.plain(CAPACITY), KVGATE_OK);
    release(g, a.lease());
    assert_eq!(tier_figures(g), (TIER, 1, 0));
    drop(a);
    free(g, w);
}

#[test]
fn an_answer_that_cannot_say_is_not_a_tier_that_disappeared() {
    let w = waker();
    let g = tiered_gate(w);
    let mut a = begin(g, "s", w);
    // Every figure 0: the engine cannot say.
    assert_eq!(a.tiered(0, 0, 0.0), KVGATE_OK, "{}", last_error());
    release(g, a.lease());
    assert_eq!(tier_figures(g), (TIER, 0, 0));
    assert_eq!(stats(g).working_set_capacity_tokens, CAPACITY);
    // A tier with the capacity unknown is checked against the known one.
    let mut b = begin(g, "t", w);
    assert_eq!(b.tiered(0, 999, RELOAD), KVGATE_INVALID_ARGUMENT);
    assert!(last_error().contains("smaller than the GPU cache (1000"));
    assert_eq!(b.tiered(0, 2 * TIER, RELOAD), KVGATE_OK);
    release(g, b.lease());
    assert_eq!(tier_figures(g), (2 * TIER, 1, 0));
    drop((a, b));
    free(g, w);
}

#[test]
fn a_refused_answer_is_refused_whatever_the_attempts_step() {
    let w = waker();
    let g = tiered_gate(w);
    let mut a = begin(g, "s", w);
    assert_eq!(a.tiered(CAPACITY, TIER, RELOAD), KVGATE_OK);
    let lease = a.lease();
    // Ended: a bad answer is still a bad answer (and counted) ...
    assert_eq!(a.tiered(CAPACITY, 1, RELOAD), KVGATE_INVALID_ARGUMENT);
    // ... and a good one is out of order.
    assert_eq!(a.tiered(CAPACITY, TIER, RELOAD), KVGATE_OUT_OF_ORDER);
    assert_eq!(tier_figures(g), (TIER, 1, 0));
    release(g, lease);
    drop(a);
    free(g, w);
}

#[test]
fn a_gpu_cache_grown_past_the_tier_in_a_plain_answer_is_counted_and_ignored() {
    let w = waker();
    let g = tiered_gate(w);
    let mut a = begin(g, "s", w);
    // The plain answer cannot be refused to the host: the working set
    // refuses the capacity, counts it, and the attempt goes on.
    assert_eq!(a.plain(2 * TIER), KVGATE_OK);
    release(g, a.lease());
    assert_eq!(tier_figures(g), (TIER, 1, 0));
    assert_eq!(stats(g).working_set_capacity_tokens, CAPACITY);
    drop(a);
    free(g, w);
}

#[test]
fn reference_mode_refuses_an_inconsistent_answer_and_counts_nothing() {
    let (g, w) = (gate(true), waker());
    let mut a = begin(g, "s", w);
    assert_eq!(a.tiered(CAPACITY, TIER, f64::NAN), KVGATE_INVALID_ARGUMENT);
    assert_eq!(a.tiered(CAPACITY, 10, RELOAD), KVGATE_INVALID_ARGUMENT);
    assert_eq!(a.tiered(CAPACITY, TIER, RELOAD), KVGATE_OK);
    assert_eq!(a.step.kind, KVGATE_STEP_ADMITTED);
    release(g, a.lease());
    // A tier gone is nothing to reference mode, which reads no capacity.
    let mut b = begin(g, "t", w);
    assert_eq!(b.tiered(CAPACITY, 0, 0.0), KVGATE_OK);
    release(g, b.lease());
    assert_eq!(tier_figures(g), (0, 0, 0));
    drop((a, b));
    free(g, w);
}

// ---------------------------------------------------------------------------
// kvgate_release_with_tier_report
// ---------------------------------------------------------------------------

fn admitted(gate: *mut kvgate_gate, session: &str, w: *mut kvgate_waker) -> u64 {
    let mut a = begin(gate, session, w);
    assert_eq!(a.tiered(CAPACITY, TIER, RELOAD), KVGATE_OK);
    a.lease()
}

fn release_tiered(gate: *mut kvgate_gate, lease: u64, cached: i64, tier: i64) -> kvgate_status {
    // SAFETY: a live gate (or NULL, refused).
    unsafe { kvgate_release_with_tier_report(gate, lease, cached, 10, tier) }
}

#[test]
fn a_refused_tier_report_keeps_the_lease_held_and_it_releases_afterwards() {
    let w = waker();
    let g = tiered_gate(w);
    let lease = admitted(g, "s", w);
    let releases = stats(g).releases;
    for (n, (cached, tier, why)) in [
        (
            100,
            101,
            "tier hits (101 tokens) exceed its cached tokens (100)",
        ),
        (-1, 5, "tier hits (5 tokens) exceed its cached tokens (0)"),
        (0, 1, "tier hits (1 tokens) exceed its cached tokens (0)"),
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(
            release_tiered(g, lease, cached, tier),
            KVGATE_INVALID_ARGUMENT
        );
        assert_eq!(
            last_error(),
            format!("kvgate_release_with_tier_report: the turn's {why}")
        );
        let s = stats(g);
        assert_eq!((s.active_leases, s.releases), (1, releases));
        assert_eq!(tier_figures(g), (TIER, n as u64 + 1, 0));
    }
    // Still held and valid: a consistent report releases it, once.
    assert_eq!(release_tiered(g, lease, 100, 60), KVGATE_OK);
    assert_eq!(release_tiered(g, lease, 100, 60), KVGATE_UNKNOWN_LEASE);
    let s = stats(g);
    assert_eq!((s.active_leases, s.releases), (0, releases + 1));
    assert_eq!(tier_figures(g), (TIER, 3, 60));
    free(g, w);
}

#[test]
fn a_refused_tier_report_lease_releases_plainly_too() {
    let w = waker();
    let g = tiered_gate(w);
    let lease = admitted(g, "s", w);
    assert_eq!(release_tiered(g, lease, 10, 11), KVGATE_INVALID_ARGUMENT);
    release(g, lease);
    assert_eq!(stats(g).active_leases, 0);
    free(g, w);
}

#[test]
fn tier_hits_are_summed_and_unknown_ones_say_nothing() {
    let w = waker();
    let g = tiered_gate(w);
    let a = admitted(g, "a", w);
    assert_eq!(release_tiered(g, a, 300, 300), KVGATE_OK);
    let b = admitted(g, "b", w);
    assert_eq!(release_tiered(g, b, 300, 0), KVGATE_OK);
    let c = admitted(g, "c", w);
    assert_eq!(release_tiered(g, c, -1, -1), KVGATE_OK);
    assert_eq!(tier_figures(g), (TIER, 0, 300));
    assert!(metrics(g).contains("\nkvgate_tier_cached_tokens_total 300\n"));
    free(g, w);
}

#[test]
fn the_tier_report_checks_its_pointer_and_its_lease() {
    assert_eq!(
        release_tiered(ptr::null_mut(), 1, 10, 5),
        KVGATE_INVALID_ARGUMENT
    );
    assert_eq!(
        last_error(),
        "kvgate_release_with_tier_report: gate is NULL"
    );
    assert_eq!(
        release_tiered(ptr::null_mut(), 1, 10, 50),
        KVGATE_INVALID_ARGUMENT
    );
    let w = waker();
    let g = tiered_gate(w);
    assert_eq!(release_tiered(g, 12345, 10, 5), KVGATE_UNKNOWN_LEASE);
    assert_eq!(
        release_tiered(g, KVGATE_NO_LEASE, 10, 5),
        KVGATE_UNKNOWN_LEASE
    );
    free(g, w);
}

#[test]
fn reference_mode_refuses_a_tier_report_and_counts_nothing() {
    let (g, w) = (gate(true), waker());
    let lease = admitted(g, "s", w);
    assert_eq!(release_tiered(g, lease, 1, 2), KVGATE_INVALID_ARGUMENT);
    assert_eq!(release_tiered(g, lease, 2, 1), KVGATE_OK);
    assert_eq!(tier_figures(g), (0, 0, 0));
    free(g, w);
}

// ---------------------------------------------------------------------------
// The tier probe (blocking kvgate_acquire with C callbacks)
// ---------------------------------------------------------------------------

/// What the probes answer; `user_data` points to one of these.
struct Engine {
    capacity: AtomicU64,
    /// The tier probe's answer: tokens, and the rate's bits.
    tier: AtomicU64,
    reload: AtomicU64,
    /// Whether the tier probe returns true.
    tier_says: AtomicBool,
    tier_calls: AtomicUsize,
    /// A gate the capacity probe closes (0: none).
    close_from_capacity: AtomicUsize,
}

impl Engine {
    fn new() -> Box<Self> {
        Box::new(Self {
            capacity: AtomicU64::new(CAPACITY),
            tier: AtomicU64::new(0),
            reload: AtomicU64::new(RELOAD.to_bits()),
            tier_says: AtomicBool::new(false),
            tier_calls: AtomicUsize::new(0),
            close_from_capacity: AtomicUsize::new(0),
        })
    }

    fn answer_tier(&self, says: bool, tokens: u64, reload: f64) {
        self.tier_says.store(says, Ordering::SeqCst);
        self.tier.store(tokens, Ordering::SeqCst);
        self.reload.store(reload.to_bits(), Ordering::SeqCst);
    }
}

unsafe fn engine<'a>(user_data: *mut c_void) -> &'a Engine {
    // SAFETY: every gate here gets a live `Engine`, kept past `kvgate_free`.
    unsafe { &*user_data.cast::<Engine>() }
}

unsafe extern "C" fn usage_probe(
    _user_data: *mut c_void,
    _session: *const u8,
    _len: usize,
    out: *mut f64,
) -> bool {
    // SAFETY: the gate passes a writable f64.
    unsafe { *out = 0.0 };
    true
}

unsafe extern "C" fn capacity_probe(
    user_data: *mut c_void,
    _session: *const u8,
    _len: usize,
    out_tokens: *mut u64,
    out_block_tokens: *mut u32,
    out_rate: *mut f64,
) -> bool {
    // SAFETY: see `engine`.
    let e = unsafe { engine(user_data) };
    let gate = e.close_from_capacity.swap(0, Ordering::SeqCst);
    if gate != 0 {
        // SAFETY: the test's live gate; closing is allowed from a probe.
        assert_eq!(unsafe { kvgate_close(gate as *mut kvgate_gate) }, KVGATE_OK);
    }
    // SAFETY: the gate passes three writable outputs.
    unsafe {
        *out_tokens = e.capacity.load(Ordering::SeqCst);
        *out_block_tokens = 16;
        *out_rate = 0.0;
    }
    true
}

unsafe extern "C" fn tier_probe(
    user_data: *mut c_void,
    _session: *const u8,
    _len: usize,
    out_tier_tokens: *mut u64,
    out_reload: *mut f64,
) -> bool {
    // SAFETY: see `engine`.
    let e = unsafe { engine(user_data) };
    e.tier_calls.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the gate passes two writable outputs.
    unsafe {
        *out_tier_tokens = e.tier.load(Ordering::SeqCst);
        *out_reload = f64::from_bits(e.reload.load(Ordering::SeqCst));
    }
    e.tier_says.load(Ordering::SeqCst)
}

fn probed_gate(engine: &Engine, reference: bool) -> *mut kvgate_gate {
    gate_with(reference, |config| {
        let user_data = (engine as *const Engine).cast_mut().cast();
        // SAFETY: a live builder; the probes obey the header.
        unsafe {
            assert_eq!(
                kvgate_config_set_probes(config, Some(usage_probe), None, user_data),
                KVGATE_OK
            );
            assert_eq!(
                kvgate_config_set_capacity_probe(config, Some(capacity_probe)),
                KVGATE_OK
            );
            assert_eq!(
                kvgate_config_set_tier_probe(config, Some(tier_probe)),
                KVGATE_OK
            );
        }
    })
}

/// One blocking turn: acquired (the probes asked) and released.
fn turn(gate: *mut kvgate_gate) -> kvgate_status {
    let mut out = MaybeUninit::uninit();
    let session = b"s";
    // SAFETY: a live gate, a session slice, no prompt, a writable out.
    let status = unsafe {
        kvgate_acquire(
            gate,
            session.as_ptr(),
            session.len(),
            ptr::null(),
            0,
            -1,
            out.as_mut_ptr(),
        )
    };
    if status == KVGATE_OK {
        // SAFETY: written on KVGATE_OK.
        release(gate, unsafe { out.assume_init() }.lease);
    }
    status
}

#[test]
fn the_tier_probe_tells_the_tier_and_bad_answers_are_counted_and_ignored() {
    let e = Engine::new();
    let g = probed_gate(&e, false);
    e.answer_tier(true, TIER, RELOAD);
    assert_eq!(turn(g), KVGATE_OK);
    assert_eq!(tier_figures(g), (TIER, 0, 0));
    let bad: [(bool, u64, f64, u64); 7] = [
        (true, 500, RELOAD, CAPACITY),        // smaller than the GPU cache
        (true, 2 * TIER, f64::NAN, CAPACITY), // a rate that is no rate
        (true, 2 * TIER, -1.0, CAPACITY),
        (true, 2 * TIER, 0.0, CAPACITY),
        (false, 0, RELOAD, CAPACITY),   // no tier after a tier was told
        (true, 0, RELOAD, CAPACITY),    // the same, said with 0 tokens
        (true, TIER, RELOAD, 3 * TIER), // a GPU cache grown past it
    ];
    for (n, (says, tokens, reload, capacity)) in bad.into_iter().enumerate() {
        e.answer_tier(says, tokens, reload);
        e.capacity.store(capacity, Ordering::SeqCst);
        // The turn goes on; the whole answer is ignored.
        assert_eq!(turn(g), KVGATE_OK);
        assert_eq!(tier_figures(g), (TIER, n as u64 + 1, 0));
        assert_eq!(stats(g).working_set_capacity_tokens, CAPACITY);
    }
    // A good answer afterwards is taken.
    e.capacity.store(2 * CAPACITY, Ordering::SeqCst);
    e.answer_tier(true, 2 * TIER, RELOAD);
    assert_eq!(turn(g), KVGATE_OK);
    assert_eq!(tier_figures(g), (2 * TIER, 7, 0));
    assert_eq!(stats(g).working_set_capacity_tokens, 2 * CAPACITY);
    assert_eq!(e.tier_calls.load(Ordering::SeqCst), 9);
    // SAFETY: a live gate, freed once; the engine outlives it.
    unsafe { kvgate_free(g) };
}

#[test]
fn a_tier_probe_without_a_tier_refuses_nothing() {
    let e = Engine::new();
    let g = probed_gate(&e, false);
    for says in [false, true] {
        e.answer_tier(says, 0, 0.0);
        assert_eq!(turn(g), KVGATE_OK);
    }
    assert_eq!(tier_figures(g), (0, 0, 0));
    assert_eq!(stats(g).working_set_capacity_tokens, CAPACITY);
    // SAFETY: a live gate, freed once; the engine outlives it.
    unsafe { kvgate_free(g) };
}

#[test]
fn the_tier_probe_is_not_asked_once_the_capacity_probe_closed_the_gate() {
    let e = Engine::new();
    let g = probed_gate(&e, false);
    e.answer_tier(true, TIER, RELOAD);
    e.close_from_capacity.store(g as usize, Ordering::SeqCst);
    assert_eq!(turn(g), KVGATE_CLOSED);
    assert_eq!(e.tier_calls.load(Ordering::SeqCst), 0);
    // SAFETY: a live gate, freed once; the engine outlives it.
    unsafe { kvgate_free(g) };
}

#[test]
fn reference_mode_never_asks_the_tier_probe() {
    let e = Engine::new();
    let g = probed_gate(&e, true);
    e.answer_tier(true, 1, f64::NAN);
    assert_eq!(turn(g), KVGATE_OK);
    assert_eq!(e.tier_calls.load(Ordering::SeqCst), 0);
    assert_eq!(tier_figures(g), (0, 0, 0));
    // SAFETY: a live gate, freed once; the engine outlives it.
    unsafe { kvgate_free(g) };
}

#[test]
fn the_tier_probe_setter_checks_its_builder() {
    // SAFETY: NULL is refused before anything is read.
    let status = unsafe { kvgate_config_set_tier_probe(ptr::null_mut(), Some(tier_probe)) };
    assert_eq!(status, KVGATE_INVALID_ARGUMENT);
    assert_eq!(last_error(), "kvgate_config_set_tier_probe: config is NULL");
    // NULL, the default, is a valid probe: no tier.
    let g = gate_with(false, |config| {
        // SAFETY: a live builder.
        assert_eq!(
            unsafe { kvgate_config_set_tier_probe(config, None) },
            KVGATE_OK
        );
    });
    // SAFETY: a live gate, freed once.
    unsafe { kvgate_free(g) };
}

#[test]
fn a_host_built_against_the_older_stats_gets_the_fields_it_knows() {
    let w = waker();
    let g = tiered_gate(w);
    let old = size_of::<kvgate_stats>() - 3 * size_of::<u64>();
    let mut out = MaybeUninit::<kvgate_stats>::zeroed();
    // SAFETY: a live gate; `old` writable bytes.
    assert_eq!(
        unsafe { kvgate_get_stats(g, out.as_mut_ptr(), old) },
        KVGATE_OK
    );
    // SAFETY: zeroed, then partly written: every byte is initialised.
    let s = unsafe { out.assume_init() };
    assert_eq!(s.size, old);
    assert_eq!(s.working_set_capacity_tokens, CAPACITY);
    assert_eq!(s.working_set_tier_tokens, 0);
    free(g, w);
}
