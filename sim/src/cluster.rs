//! Replicas that are not all alike: one replica of a deployment given half
//! the KV cache or twice the step cost, or lost partway through, to see
//! whether a placement that reads each gate's room steers sessions away
//! from it (or, after a loss, where its sessions go).
//!
//! A fleet is rarely uniform for long: a replica shares its GPU with
//! another model (less memory for KV), runs on an older card, or has a
//! noisy neighbour (slower steps). Replica 0 is the odd one: which one does
//! not matter to a router that places by load or room, and the lowest
//! index is the one every tie-break favours, so it is the hardest case.

use crate::engine::{EngineConfig, StepCost};

/// How replica 0 differs from the others (the scenario's `cluster`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cluster {
    /// Every replica as the `[engine]` table says.
    #[default]
    Uniform,
    /// Replica 0 has half the KV blocks.
    ReplicaKvHalf,
    /// Replica 0's steps cost twice as much: every step-cost term doubled.
    ReplicaSlow,
    /// Replica 0 is lost once a third of the workload's turns have ended
    /// (a point in the work, not in time, so that every policy loses it
    /// equally far in): its sessions start over elsewhere as new ones.
    ReplicaLost,
}

impl Cluster {
    /// Parses `uniform`, `replica-kv-half`, `replica-slow` or `replica-lost`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "uniform" => Ok(Self::Uniform),
            "replica-kv-half" => Ok(Self::ReplicaKvHalf),
            "replica-slow" => Ok(Self::ReplicaSlow),
            "replica-lost" => Ok(Self::ReplicaLost),
            other => Err(format!(
                "cluster `{other}`: expected uniform, replica-kv-half, replica-slow or replica-lost"
            )),
        }
    }

    /// The replica lost, and after how many of `turns` ended turns.
    pub fn loss(self, turns: usize) -> Option<(usize, usize)> {
        (self == Self::ReplicaLost).then_some((0, turns / 3))
    }

    /// Replica `replica`'s engine in a deployment of `base` engines.
    pub fn engine(self, base: &EngineConfig, replica: usize) -> EngineConfig {
        let mut e = *base;
        if replica != 0 {
            return e;
        }
        match self {
            Self::Uniform | Self::ReplicaLost => {}
            Self::ReplicaKvHalf => e.num_gpu_blocks = (e.num_gpu_blocks / 2).max(2),
            Self::ReplicaSlow => {
                let c = e.cost;
                e.cost = StepCost {
                    beta0_ms: 2.0 * c.beta0_ms,
                    beta1_us: 2.0 * c.beta1_us,
                    beta2_us: 2.0 * c.beta2_us,
                    beta3_us: 2.0 * c.beta3_us,
                    beta4_us: 2.0 * c.beta4_us,
                };
            }
        }
        e
    }

    /// The smallest KV cache among `replicas` replicas, blocks: the one a
    /// request must fit (vLLM rejects a request its engine cannot hold).
    pub fn min_blocks(self, base: &EngineConfig, replicas: usize) -> usize {
        (0..replicas.max(1))
            .map(|r| self.engine(base, r).num_gpu_blocks)
            .min()
            .expect("at least one replica")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_replica_zero_differs() {
        let base = EngineConfig::default();
        for c in [
            Cluster::Uniform,
            Cluster::ReplicaKvHalf,
            Cluster::ReplicaSlow,
        ] {
            assert_eq!(c.engine(&base, 1), base);
            assert_eq!(c.engine(&base, 7), base);
        }
        assert_eq!(Cluster::Uniform.engine(&base, 0), base);
        let half = Cluster::ReplicaKvHalf.engine(&base, 0);
        assert_eq!(half.num_gpu_blocks, base.num_gpu_blocks / 2);
        assert_eq!(half.cost, base.cost);
        assert_eq!(
            Cluster::ReplicaKvHalf.min_blocks(&base, 4),
            base.num_gpu_blocks / 2
        );
        let slow = Cluster::ReplicaSlow.engine(&base, 0);
        assert_eq!(slow.num_gpu_blocks, base.num_gpu_blocks);
        assert_eq!(slow.cost.beta0_ms, 2.0 * base.cost.beta0_ms);
        assert_eq!(slow.cost.beta4_us, 2.0 * base.cost.beta4_us);
        assert_eq!(Cluster::ReplicaLost.engine(&base, 0), base);
        assert_eq!(Cluster::ReplicaLost.loss(300), Some((0, 100)));
        assert_eq!(Cluster::ReplicaSlow.loss(300), None);
        assert!(Cluster::parse("replica-slow").is_ok());
        assert!(Cluster::parse("slow").is_err());
    }
}
