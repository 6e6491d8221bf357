//! What an engine answers for its prefill rate: the median throughput of
//! its recent steps that were mostly prefill, as the vLLM plugin measures it
//! (`integrations/vllm/kvgate_vllm/prefill_rate.py`).
//!
//! The median, not the best: on the CPU engine a step's prefill throughput
//! scatters threefold (6.5k-20.5k tokens/s over one run's steps of at least
//! a quarter of the budget, median 13.6k), and the best step set the gate's
//! refill window at 0.5 s where the typical step gives 0.9 s. Measured on
//! the engine, four interleaved runs each (`real_engine.py`, 24 sessions x
//! 10 turns): with the best rate kvgate ran 1.066x the best cap, 68-71%
//! hits, 39-46 parks; answering 0.6 of it (about the median) 0.996x,
//! 77% hits, 26-30 parks.

use std::collections::VecDeque;

/// Steps remembered: enough for a steady median, few enough to follow a
/// change of load.
const REMEMBERED: usize = 64;

/// The prefill throughput of the last `REMEMBERED` (64) steps that were
/// mostly prefill, tokens/s, and their median, kept up to date as steps
/// are recorded (the plugin does the same): every capacity probe reads it,
/// and probes come far more often than such steps.
#[derive(Debug, Default, Clone)]
pub struct StepRates {
    recent: VecDeque<f64>,
    median: f64,
}

impl StepRates {
    /// A step that was mostly prefill ran at `rate` tokens/s.
    pub fn record(&mut self, rate: f64) {
        if self.recent.len() == REMEMBERED {
            self.recent.pop_front();
        }
        self.recent.push_back(rate);
        let mut sorted: Vec<f64> = self.recent.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        self.median = sorted[sorted.len() / 2];
    }

    /// The median of the steps remembered (the upper one of an even
    /// count); 0 before any.
    pub fn median(&self) -> f64 {
        self.median
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_recent_steps_ignores_one_lucky_step() {
        let mut r = StepRates::default();
        assert_eq!(r.median(), 0.0);
        for rate in [10.0, 12.0, 11.0, 40.0] {
            r.record(rate);
        }
        assert_eq!(r.median(), 12.0);
        for _ in 0..REMEMBERED {
            r.record(5.0);
        }
        assert_eq!(r.median(), 5.0, "only the last steps count");
        assert_eq!(r.recent.len(), REMEMBERED);
    }
}
