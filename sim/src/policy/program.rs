//! What the peers' program schedulers (ThunderAgent, vllm-router's
//! Progress-TTL) have in common, as the event loop drives them: a proxy in
//! front of the engines that sees each program's (session's) requests and
//! responses, keeps a logical token ledger per engine, and holds a request
//! until its program may run. Time and engine state are inputs; the
//! scheduler reads no clock and never touches the engine.

/// What a scheduler may read of one engine (what its metrics endpoint says).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineView {
    /// Requests in the engine's waiting queue.
    pub waiting: usize,
    /// Requests running (`num_requests_running`).
    pub running: usize,
    /// KV usage (`kv_cache_usage_perc`: running requests' blocks only).
    pub usage: f64,
    /// Preemptions so far (`num_preemptions_total`).
    pub preemptions: u64,
}

/// Counters every program scheduler keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct ProgramStats {
    /// Requests held before going to an engine.
    pub held: u64,
    /// Programs paused (their reservation or ledger entry dropped).
    pub pauses: u64,
    /// Held requests let go by a timeout rather than by capacity.
    pub forced: u64,
}

/// A program-level admission policy in front of the engines.
pub trait ProgramScheduler: std::fmt::Debug {
    /// A turn of `session` with a `prompt_len`-token prompt arrives at
    /// `now`; `routed` is the replica the sticky router chose. Returns the
    /// replica to send it to now, or `None` to hold it (a later
    /// [`poll`](Self::poll) lets it go).
    fn arrive(
        &mut self,
        session: usize,
        prompt_len: usize,
        routed: usize,
        now: u64,
        engines: &[EngineView],
    ) -> Option<usize>;

    /// `session`'s request ended at `now` with `total_tokens` (prompt +
    /// output, vLLM's `usage.total_tokens`); `last` if the session is done.
    fn turn_done(&mut self, session: usize, total_tokens: usize, now: u64, last: bool);

    /// Lets go of every held request that may now run: `(session, replica)`.
    fn poll(&mut self, now: u64, engines: &[EngineView], out: &mut Vec<(usize, usize)>);

    /// When `poll` must run again even if nothing else happens.
    fn next_deadline(&self) -> Option<u64>;

    /// Counters so far.
    fn stats(&self) -> ProgramStats;

    /// Engine `replica` is gone: nothing goes there again, and its
    /// programs come back as new ones (their next request, or the one in
    /// flight, which the event loop re-sends). `Err` if this scheduler
    /// does not model a lost engine.
    fn lose_replica(&mut self, replica: usize) -> Result<(), String> {
        Err(format!(
            "this program scheduler does not model a lost engine (replica {replica})"
        ))
    }
}
