//! Shared by the bench targets: the naive baseline, the probes, helpers.
//!
//! Each bench target includes this module and uses a different part of it.
#![allow(dead_code)]

pub mod naive;

use std::sync::atomic::{AtomicU64, Ordering};

use kvgate::Probe;

/// Usage below the default watermark (0.85): the open path.
pub const LOW_USAGE: f64 = 0.40;
/// Usage above the default watermark: pressure.
pub const HIGH_USAGE: f64 = 0.95;
/// A prompt of realistic length for the prefix probe to receive.
pub const PROMPT: &[u32] = &[7; 64];

/// Whether the target runs as a benchmark (`cargo bench` passes `--bench`)
/// rather than as a test (`cargo test --all-targets` passes nothing), in
/// which case it runs a small smoke version that checks behaviour only.
pub fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// `n` distinct session ids of one length (`session-000042`), so that the
/// id bytes per session are known exactly.
pub fn session_ids(prefix: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("{prefix}-{i:06}").into_bytes())
        .collect()
}

/// The trivial probe: fixed answers, nothing else.
#[derive(Debug, Clone, Copy)]
pub struct Fixed {
    pub usage: Option<f64>,
    pub hit: Option<f64>,
}

impl Fixed {
    /// Below the watermark.
    pub const OPEN: Fixed = Fixed {
        usage: Some(LOW_USAGE),
        hit: None,
    };
    /// Under pressure, every prefix resident.
    pub const HOT: Fixed = Fixed {
        usage: Some(HIGH_USAGE),
        hit: Some(1.0),
    };
}

impl Probe for Fixed {
    fn kv_cache_usage(&self, _session: &[u8]) -> Option<f64> {
        self.usage
    }
    fn prefix_hit_ratio(&self, _session: &[u8], _prompt: &[u32]) -> Option<f64> {
        self.hit
    }
}

/// A [`Fixed`] probe that also answers the capacity probe, as a vLLM host
/// does (working-set admission asks it with every usage probe).
#[derive(Debug, Clone, Copy)]
pub struct WithCapacity {
    pub fixed: Fixed,
    pub capacity: kvgate::EngineCapacity,
}

impl WithCapacity {
    /// Below the watermark, and an engine whose KV cache holds every
    /// session the bench uses, so working-set admission makes nobody wait:
    /// 2^40 tokens in blocks of 16, refilled at 1 token/s, so that no
    /// member's window (capacity / prefill rate) ends during a run and the
    /// admission reasons, hence the counts, do not depend on the clock.
    pub fn open() -> Self {
        Self {
            fixed: Fixed::OPEN,
            capacity: kvgate::EngineCapacity::new(1 << 40, 16, 1.0),
        }
    }
}

impl Probe for WithCapacity {
    fn kv_cache_usage(&self, session: &[u8]) -> Option<f64> {
        self.fixed.kv_cache_usage(session)
    }
    fn prefix_hit_ratio(&self, session: &[u8], prompt: &[u32]) -> Option<f64> {
        self.fixed.prefix_hit_ratio(session, prompt)
    }
    fn kv_cache_capacity(&self, _session: &[u8]) -> Option<kvgate::EngineCapacity> {
        Some(self.capacity)
    }
}

/// Session ids starting with this are the bench's controller: its replica
/// is not under pressure, so it is admitted `open` and its release is the
/// capacity event whose wake-up is measured.
pub const CONTROLLER: &[u8] = b"ctl";

/// The engine of the wake-up and preemption benches.
///
/// Every session but the controller sees pressure. Capacity is a count of
/// free units that the bench adds before a release: a prefix probe claims
/// one if there is one (answering "resident", so that attempt is admitted)
/// and otherwise answers "cold" (the attempt waits). So exactly one waiter
/// can proceed per unit, whatever the design wakes, and every probe call a
/// design makes is counted.
#[derive(Debug, Default)]
pub struct TokenEngine {
    free: AtomicU64,
    usage_calls: AtomicU64,
    prefix_calls: AtomicU64,
}

impl TokenEngine {
    /// One waiter may now proceed.
    pub fn free_one(&self) {
        self.free.fetch_add(1, Ordering::SeqCst);
    }

    /// Probe calls made for waiter sessions (the controller's are not counted).
    pub fn probe_calls(&self) -> u64 {
        self.usage_calls.load(Ordering::SeqCst) + self.prefix_calls.load(Ordering::SeqCst)
    }
}

impl Probe for TokenEngine {
    fn kv_cache_usage(&self, session: &[u8]) -> Option<f64> {
        if session.starts_with(CONTROLLER) {
            return Some(LOW_USAGE);
        }
        self.usage_calls.fetch_add(1, Ordering::SeqCst);
        Some(HIGH_USAGE)
    }

    fn prefix_hit_ratio(&self, _session: &[u8], _prompt: &[u32]) -> Option<f64> {
        self.prefix_calls.fetch_add(1, Ordering::SeqCst);
        let claimed = self
            .free
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
            .is_ok();
        Some(if claimed { 1.0 } else { 0.0 })
    }
}

/// Latency percentiles of a set of samples, in nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    pub samples: usize,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

impl Percentiles {
    pub fn of(samples: &mut [u64]) -> Self {
        assert!(!samples.is_empty(), "no samples");
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Self {
            samples: samples.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: *samples.last().expect("not empty"),
        }
    }
}

/// Nanoseconds rendered for humans.
pub fn human_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.1} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Leaves a custom-harness bench's figures (a JSON document) where
/// `benches/report.py` reads them: `target/kvgate-bench/NAME.json`, next to
/// criterion's own results.
pub fn write_results(name: &str, json: &str) {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("kvgate-bench");
    std::fs::create_dir_all(&dir).expect("create target/kvgate-bench");
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, json).expect("write results");
    println!("written to {}", path.display());
}

/// A JSON object with one field, `key`, holding the array of `rows`.
pub fn json_rows(key: &str, rows: &[String]) -> String {
    format!("{{\n  \"{key}\": [\n{}\n  ]\n}}\n", rows.join(",\n"))
}

/// One `acquire` + `release` on the blocking gate (debug builds check the reason).
pub fn gate_cycle(gate: &kvgate::Gate, session: &[u8], expect: kvgate::Reason) {
    let lease = gate.acquire(session, PROMPT).expect("admitted");
    debug_assert_eq!(lease.reason(), expect);
    std::hint::black_box(lease.admission().lease_id);
    lease.release();
}

/// One `acquire` + `release` on the naive gate.
pub fn naive_cycle(naive: &naive::NaiveGate<Fixed>, session: &[u8], expect: kvgate::Reason) {
    let lease = naive.acquire(session, PROMPT).expect("admitted");
    debug_assert_eq!(lease.reason, expect);
    lease.release();
}

/// A notifier for sans-IO runs that never sleep.
pub struct NoWake;

impl kvgate::core::Notify for NoWake {
    fn notify(&self) {}
}

/// One open-path attempt on the sans-IO core at `now`: begin, usage answer
/// below the watermark, admitted, released. No clock, no sleeper.
pub fn core_cycle(core: &kvgate::core::Core, session: &[u8], now: u64) {
    use kvgate::core::Step;
    let mut attempt = core
        .begin(session, PROMPT.len(), now, None, Box::new(NoWake))
        .expect("not closed");
    let Step::ProbeUsage = attempt.start(now).unwrap() else {
        unreachable!("a pass starts with the usage probe")
    };
    let Step::Admitted(lease) = attempt.on_usage(Some(LOW_USAGE), now).unwrap() else {
        unreachable!("below the watermark: open")
    };
    core.release(lease, now);
}

/// The open path through the C ABI: the probes are C callbacks, the gate a
/// `kvgate_gate *`, an admission `kvgate_acquire` + `kvgate_release`: what a
/// C host pays.
pub mod c_abi {
    use std::ffi::c_void;

    use kvgate::ffi::kvgate_status::KVGATE_OK;
    use kvgate::ffi::*;

    unsafe extern "C" fn low_usage(
        _user_data: *mut c_void,
        _session: *const u8,
        _len: usize,
        out: *mut f64,
    ) -> bool {
        // SAFETY: the gate passes a writable out.
        unsafe { *out = super::LOW_USAGE };
        true
    }

    /// A `kvgate_gate *` (freed on drop) whose usage probe says "open".
    pub struct CGate(*mut kvgate_gate);

    // SAFETY: the header makes every call but `kvgate_free` thread-safe;
    // `kvgate_free` runs in `Drop`, after every thread that used it ended.
    unsafe impl Send for CGate {}
    // SAFETY: as above.
    unsafe impl Sync for CGate {}

    impl CGate {
        pub fn open() -> Self {
            let mut gate = std::ptr::null_mut();
            // SAFETY: a live builder, a writable out, a probe that obeys the header.
            unsafe {
                let config = kvgate_config_new();
                assert_eq!(
                    kvgate_config_set_probes(config, Some(low_usage), None, std::ptr::null_mut()),
                    KVGATE_OK
                );
                // Compared with the naive design, which is the seed's table.
                assert_eq!(
                    kvgate_config_set_admission_mode(
                        config,
                        kvgate_admission_mode::KVGATE_ADMISSION_MODE_REFERENCE as u32
                    ),
                    KVGATE_OK
                );
                assert_eq!(kvgate_new(config, &mut gate), KVGATE_OK);
                kvgate_config_free(config);
            }
            Self(gate)
        }

        /// One acquire + release of `session`, admitted `open`.
        pub fn cycle(&self, session: &[u8]) {
            let mut out = std::mem::MaybeUninit::<kvgate_admission>::uninit();
            let prompt = super::PROMPT;
            // SAFETY: a live gate, live arrays with their lengths, a writable out.
            let status = unsafe {
                kvgate_acquire(
                    self.0,
                    session.as_ptr(),
                    session.len(),
                    prompt.as_ptr(),
                    prompt.len(),
                    -1,
                    out.as_mut_ptr(),
                )
            };
            assert_eq!(status, KVGATE_OK);
            // SAFETY: written on KVGATE_OK; a live gate.
            unsafe {
                let lease = out.assume_init().lease;
                assert_eq!(kvgate_release(self.0, lease), KVGATE_OK);
            }
        }
    }

    impl Drop for CGate {
        fn drop(&mut self) {
            // SAFETY: freed once, after every call on it returned.
            unsafe { kvgate_free(self.0) };
        }
    }
}
