//! Every constant of the working set, with what it means. None is a
//! capacity or a duration fitted to a workload: the durations are in units
//! of the refill window, which is measured.

/// The constants a host may set (tests set them to check a rule exactly).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Tuning {
    /// How long a session may wait, from queueing, before members between
    /// turns are parked for it once it heads the queue, in refill windows.
    /// One parked member costs at most one window of the engine's time
    /// (its re-prefill), so parks forced by the bound cost at most `1 / B`
    /// of the engine's time while every wait stays bounded.
    pub wait_bound_windows: f64,
    /// The refill window used until the engine's prefill rate is known, ns
    /// (a prior: replaced by `C / r` as soon as a rate is told or measured).
    pub initial_window_ns: u64,
    /// How much more turn throughput running every session with a cold
    /// cache must promise than holding the cache for the sessions that fit
    /// before nobody is held out (`WorkingSet::holding_pays`); infinite:
    /// always hold. The promise is a first-order bound that flatters
    /// running cold (its turns are taken to last as long as hot ones), so
    /// it must be clearly ahead.
    pub cold_margin: f64,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            wait_bound_windows: 16.0,
            initial_window_ns: 2_000_000_000,
            cold_margin: 1.5,
        }
    }
}

impl Tuning {
    /// The defaults with the wait bound set to `windows` refill windows.
    pub fn with_wait_bound_windows(windows: f64) -> Self {
        Self {
            wait_bound_windows: windows,
            ..Self::default()
        }
    }

    /// The defaults with the cold rule off: the working set always holds
    /// sessions out that do not fit.
    pub fn always_holding() -> Self {
        Self {
            cold_margin: f64::INFINITY,
            ..Self::default()
        }
    }
}

/// Weight of a new sample in the working set's running means (output,
/// growth, turn time, tool gap): a slow drift over about twenty turns,
/// not one turn's noise.
pub(crate) const RUNNING_MEAN_WEIGHT: f64 = 0.05;

/// Weight of a session's newest growth in its own mean: a session's tool
/// results change from turn to turn, so its own mean follows it faster
/// than the working set's does.
pub(crate) const SESSION_GROWTH_WEIGHT: f64 = 0.3;

/// Usage answers below this fraction say too little about capacity or
/// sharing to use.
pub(crate) const USAGE_SAMPLE_FLOOR: f64 = 0.05;

/// Usage answers kept for an estimate taken from the gauge (the least of
/// them is used: every error of a sample is upward).
pub(crate) const USAGE_SAMPLES: usize = 16;

/// Tool gaps remembered per session for its window decision.
pub(crate) const GAP_SAMPLES: usize = 8;

/// Gaps a session needs before its own median decides its window.
pub(crate) const GAPS_TO_JUDGE: usize = 3;

/// The shortest tool gap counted in the mean of logs (a host that asks
/// again at once would make the log infinite), ns.
pub(crate) const SHORTEST_GAP_NS: u64 = 1_000_000;

/// How many times the longer of the refill window and the longest recent
/// tool gap a session must stay quiet to be presumed ended, while the host
/// tells no ends. A session that returns after that long is rare, and its
/// presumed end is taken back when it does.
pub(crate) const QUIET_FACTOR: u64 = 2;

/// The longest recent tool gap forgets this share of itself per gap seen,
/// so that one very long call does not delay presumed ends for ever.
pub(crate) const LONGEST_GAP_DECAY: u64 = 64;

/// Finished sessions whose turn counts are remembered: enough for a steady
/// survival estimate, few enough to follow a workload that changes.
pub(crate) const LIFETIMES_REMEMBERED: usize = 64;
