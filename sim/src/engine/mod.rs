//! A model of one vLLM v1 replica, one concern per module:
//! [`hashing`] (block keys), [`block_pool`] (free queue, cache map, usage),
//! [`kv_manager`] (prefix lookup, slot allocation), [`scheduler`] (the
//! continuous-batching step loop), [`step_time`] (cost model), [`profile`] (its coefficients as data), [`host_tier`]
//! (KV offloaded to host memory), [`noise`] (other load slowing steps) and [`pins`] (the `ttl-pin` policy's engine half).

pub mod block_pool;
pub mod hashing;
pub mod host_tier;
pub mod kv_manager;
pub mod noise;
pub mod pins;
pub mod profile;
pub mod scheduler;
pub mod step_time;

pub use host_tier::{HostTier, TierConfig};
pub use noise::{Cotenant, Noise};
pub use profile::Profile;
pub use scheduler::{EngineStats, Finished, FirstScheduled, NewRequest, Replica, ReqId, StepPlan};
pub use step_time::{StepCost, StepLoad};

/// A replica's shape and costs (a scenario's `[engine]` table).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    /// KV blocks per replica, the null block included (vLLM's `num_gpu_blocks`).
    pub num_gpu_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Token budget of one step.
    pub max_num_batched_tokens: usize,
    /// Most requests running at once.
    pub max_num_seqs: usize,
    /// Largest prefill chunk of one request per step (0: no limit beyond the budget).
    pub long_prefill_token_threshold: usize,
    /// Step-time coefficients.
    pub cost: StepCost,
    /// The host tier behind the GPU cache, if the engine offloads KV.
    pub tier: Option<TierConfig>,
    /// Step-time noise: other load on the machine (none by default).
    pub noise: Noise,
}

impl Default for EngineConfig {
    /// Llama-3.1-8B on one H100-80GB (vLLM 0.8.4 figures: 29,205 blocks of
    /// 16 tokens ≈ 467k tokens) with the API server's batch defaults and
    /// the [`profile::DEFAULT`] step costs.
    fn default() -> Self {
        Self {
            num_gpu_blocks: 29_205,
            block_size: 16,
            max_num_batched_tokens: 8192,
            max_num_seqs: 1024,
            long_prefill_token_threshold: 0,
            cost: Profile::load(profile::DEFAULT)
                .expect("the built-in default profile parses")
                .cost,
            tier: None,
            noise: Noise::default(),
        }
    }
}

impl EngineConfig {
    /// Usable KV capacity in tokens (the null block excluded).
    pub fn capacity_tokens(&self) -> usize {
        (self.num_gpu_blocks - 1) * self.block_size
    }

    /// Refuses shapes the model cannot run.
    pub fn validate(&self) -> Result<(), String> {
        if self.num_gpu_blocks < 2 || self.num_gpu_blocks >= u32::MAX as usize {
            return Err(format!(
                "num_gpu_blocks out of range: {}",
                self.num_gpu_blocks
            ));
        }
        if self.block_size == 0 {
            return Err("block_size must be > 0".into());
        }
        if self.max_num_batched_tokens == 0 || self.max_num_seqs == 0 {
            return Err("max_num_batched_tokens and max_num_seqs must be > 0".into());
        }
        if let Some(t) = &self.tier {
            t.validate(self.num_gpu_blocks - 1)?;
        }
        self.noise.validate()?;
        self.cost.validate()
    }

    /// Usable host-tier capacity in tokens (0 without a tier).
    pub fn tier_tokens(&self) -> usize {
        self.tier.map_or(0, |t| t.blocks * self.block_size)
    }
}
