//! Working-set admission (the default mode) through the real core and the
//! blocking gate: capacity from the usage probe, FIFO hand-over to the
//! waiting session's own attempt, windows as core deadlines, withdrawal of
//! grants nobody collected, the turn report, and the figures.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvgate::core::{Attempt, Core, Step};
use kvgate::{AcquireError, Config, EngineCapacity, Gate, ManualClock, Probe, Reason, TurnReport};

#[path = "support/core_turns.rs"]
mod core_turns;
use core_turns::{admitted, engine};

const SEC: u64 = 1_000_000_000;
struct Driven<'c> {
    attempt: Attempt<&'c Core>,
    wakes: Arc<AtomicUsize>,
}

fn core() -> Core {
    Core::new(Config {
        wait_poll: Duration::from_secs(100),
        ..Config::default()
    })
    .unwrap()
}

/// Begins `session`'s turn of `prompt` tokens and answers its usage probe.
fn ask<'c>(core: &'c Core, session: &str, prompt: usize, now: u64) -> (Driven<'c>, Step) {
    let (attempt, wakes, step) = core_turns::ask(core, session, prompt, now);
    (Driven { attempt, wakes }, step)
}

#[test]
fn sessions_join_while_they_fit_and_the_next_is_handed_over_when_one_finishes() {
    let core = core();
    let a = admitted(ask(&core, "a", 600, 0).1);
    assert_eq!(a.admission().reason, Reason::EmptyWorkingSet);
    let b = admitted(ask(&core, "b", 300, 0).1);
    assert_eq!(b.admission().reason, Reason::FitsWorkingSet);
    // c does not fit beside them: it sleeps, without a prefix probe.
    let (mut c, step) = ask(&core, "c", 500, 0);
    assert!(matches!(step, Step::Sleep { .. }), "{step:?}");
    core.release_with(a, TurnReport::new(Some(0), Some(0)), SEC / 10);
    // a keeps its place in its window: c, asked again, sleeps on.
    assert!(matches!(
        c.attempt.on_wake(SEC / 10).unwrap(),
        Step::Sleep { .. }
    ));
    core.release_with(b, TurnReport::new(Some(0), Some(0)), SEC / 5);
    // a's session ends: its blocks are the oldest in the engine's free queue,
    // so c is handed the room, woken, and admitted on its next pass.
    core.finish_session(b"a", SEC / 5);
    assert!(c.wakes.load(Ordering::SeqCst) > 0);
    // Handed room while it slept, it is admitted on waking without asking
    // the engine again.
    let lease = admitted(c.attempt.on_wake(SEC / 5).unwrap());
    assert_eq!(lease.admission().reason, Reason::FitsWorkingSet);
    assert!(lease.admission().waited);
    let stats = core.stats(SEC / 5);
    assert_eq!(stats.admissions(Reason::FitsWorkingSet), 2);
    assert_eq!(
        stats.prefix_probe_calls, 0,
        "working-set admission never asks the prefix"
    );
    assert_eq!(stats.working_set.members, 2);
    assert_eq!(stats.working_set.capacity_tokens, 1000);
    core.release(lease, SEC);
}

#[test]
fn a_member_comes_back_within_its_window_and_the_window_end_is_a_core_deadline() {
    let core = core();
    let a = admitted(ask(&core, "a", 600, 0).1);
    let b = admitted(ask(&core, "b", 300, 0).1);
    core.release(b, SEC);
    // The refill window is 1000 tokens / 1000 tokens/s = 1 s.
    assert_eq!(core.next_deadline(), Some(2 * SEC));
    let again = admitted(ask(&core, "b", 350, SEC + SEC / 2).1);
    assert_eq!(again.admission().reason, Reason::ReservedSession);
    core.release(again, 2 * SEC);
    let (mut c, step) = ask(&core, "c", 400, 2 * SEC);
    assert!(matches!(step, Step::Sleep { .. }));
    // Nobody touches the gate until b's window ends; a driver that sleeps
    // until `next_deadline` and then purges lets c in.
    assert_eq!(core.next_deadline(), Some(3 * SEC));
    core.purge(3 * SEC);
    assert!(c.wakes.load(Ordering::SeqCst) > 0);
    let lease = admitted(c.attempt.on_wake(3 * SEC).unwrap());
    assert_eq!(lease.admission().reason, Reason::FitsWorkingSet);
    core.release(lease, 4 * SEC);
    core.release(a, 4 * SEC);
}

#[test]
fn a_grant_its_attempt_never_collects_is_passed_on() {
    let core = core();
    let a = admitted(ask(&core, "a", 900, 0).1);
    let (mut b, _) = ask(&core, "b", 800, 0);
    let (mut c, _) = ask(&core, "c", 800, 0);
    core.release(a, SEC);
    core.finish_session(b"a", SEC);
    // b (first in line) was handed the room; it is cancelled before it looks.
    assert!(b.wakes.load(Ordering::SeqCst) > 0);
    assert!(core.cancel_session(b"b"));
    assert!(matches!(
        b.attempt.on_wake(SEC).unwrap(),
        Step::Failed(AcquireError::Cancelled)
    ));
    // Its grant went to c.
    assert!(c.wakes.load(Ordering::SeqCst) > 0);
    let lease = admitted(c.attempt.on_wake(SEC).unwrap());
    assert_eq!(lease.admission().reason, Reason::EmptyWorkingSet);
    assert_eq!(core.stats(SEC).cancelled, 1);
    core.release(lease, 2 * SEC);
}

#[test]
fn a_retry_keeps_its_place_in_line() {
    let core = core();
    let a = admitted(ask(&core, "a", 900, 0).1);
    let (mut b, _) = ask(&core, "b", 500, 0);
    let (mut c, _) = ask(&core, "c", 600, 1);
    // b's client retries: the older attempt is preempted, the newer one
    // keeps b's place ahead of c.
    let (mut b2, step) = ask(&core, "b", 500, 2);
    assert!(matches!(step, Step::Sleep { .. }));
    assert!(matches!(
        b.attempt.on_wake(2).unwrap(),
        Step::Failed(AcquireError::Preempted)
    ));
    core.release(a, SEC);
    core.finish_session(b"a", SEC);
    // b2 is first: handed the room; c, asked again, sleeps on.
    assert!(matches!(
        c.attempt.on_wake(SEC).unwrap(),
        Step::Sleep { .. }
    ));
    let lease = admitted(b2.attempt.on_wake(SEC).unwrap());
    core.release(lease, 2 * SEC);
}

#[test]
fn the_figures_reach_the_prometheus_text() {
    let core = core();
    let a = admitted(ask(&core, "a", 600, 0).1);
    core.release_with(a, TurnReport::new(Some(0), Some(40)), SEC);
    let text = core.stats(SEC).to_prometheus();
    for line in [
        "kvgate_admissions_total{reason=\"empty_working_set\"} 1",
        "kvgate_working_set_sessions 1",
        "kvgate_working_set_capacity_tokens 1000",
        "kvgate_working_set_tokens 640",
        "kvgate_working_set_window_seconds 1",
        // No tool gap seen yet: a 1 s turn against a 1 s window.
        "kvgate_working_set_horizon_turns 1",
    ] {
        assert!(text.contains(line), "missing `{line}` in\n{text}");
    }
}

/// An engine with a fixed capacity, through the `Probe` trait.
struct SmallEngine;

impl Probe for SmallEngine {
    fn kv_cache_usage(&self, _session: &[u8]) -> Option<f64> {
        Some(0.5)
    }
    fn prefix_hit_ratio(&self, _session: &[u8], _prompt: &[u32]) -> Option<f64> {
        unreachable!("working-set admission never asks the prefix")
    }
    fn kv_cache_capacity(&self, _session: &[u8]) -> Option<EngineCapacity> {
        Some(engine())
    }
}

#[test]
fn the_blocking_gate_waits_for_room_and_is_handed_it() {
    let clock = Arc::new(ManualClock::new(0));
    let gate = Gate::with_clock(
        Config {
            wait_poll: Duration::from_secs(1000),
            ..Config::default()
        },
        SmallEngine,
        clock.clone(),
    )
    .unwrap();
    // Two prompts with nothing in common: b cannot share a's blocks.
    let a = gate.acquire(b"a", &[1u32; 700]).unwrap();
    assert_eq!(a.reason(), Reason::EmptyWorkingSet);
    let waiter = {
        let gate = gate.clone();
        std::thread::spawn(move || gate.acquire(b"b", &[2u32; 700]).map(|l| l.reason()))
    };
    while gate.stats().waiting_attempts == 0 {
        std::thread::yield_now();
    }
    a.release_with(TurnReport::new(Some(0), Some(10)));
    assert!(gate.finish_session(b"a").is_some());
    assert_eq!(waiter.join().unwrap(), Ok(Reason::EmptyWorkingSet));
    assert_eq!(
        gate.stats().usage_probe_calls,
        2,
        "one per attempt: a, and b before it slept (handed room, b asks the ledger only)"
    );
}

#[test]
fn a_window_that_becomes_the_earliest_deadline_nudges_a_sleeper() {
    let core = core();
    let a = admitted(ask(&core, "a", 600, 0).1);
    let (mut c, step) = ask(&core, "c", 500, 0);
    let Step::Sleep { until_ns } = step else {
        panic!("{step:?}")
    };
    assert_eq!(until_ns, 100 * SEC, "its own poll");
    // The earliest deadline: c, at the head of the line, reaching the wait
    // bound (16 refill windows of 1 s).
    assert_eq!(core.next_deadline(), Some(16 * SEC));
    let before = c.wakes.load(Ordering::SeqCst);
    // a's turn ends: its window (1 s) is now the earliest deadline, and a
    // sleeper that folded in the later one is nudged to ask again.
    core.release(a, SEC);
    assert_eq!(core.next_deadline(), Some(2 * SEC));
    assert_eq!(c.wakes.load(Ordering::SeqCst), before + 1);
    assert!(matches!(
        c.attempt.on_wake(SEC).unwrap(),
        Step::Sleep { .. }
    ));
}

/// Admits a turn of `session`, whatever the reason, and ends it at `end`.
fn turn(core: &Core, session: &str, prompt: usize, start: u64, end: u64) {
    let token = admitted(ask(core, session, prompt, start).1);
    core.release_with(token, TurnReport::new(Some(0), Some(0)), end);
}

#[test]
fn with_tools_long_next_to_turns_the_waiters_go_in_for_running_cold() {
    // Two sessions of 400 tokens fill the 1000-token cache; turns of 0.1 s,
    // tools of 20 s. Holding the 2.5 that fit serves 2.5 / 20.1 s turns a
    // second; with five active sessions, running them all cold serves
    // 5 / 20.1 s, and the engine refills 400 tokens in 0.4 s: twice as many.
    let core = core();
    let mut t = 0;
    for _ in 0..4 {
        turn(&core, "a", 400, t, t + SEC / 10);
        turn(&core, "b", 400, t, t + SEC / 10);
        t += SEC / 10 + 20 * SEC;
    }
    let _a = admitted(ask(&core, "a", 400, t).1);
    let _b = admitted(ask(&core, "b", 400, t).1);
    // With c alone waiting, running three cold is not clearly ahead.
    let (mut c, step) = ask(&core, "c", 400, t);
    assert!(matches!(step, Step::Sleep { .. }), "{step:?}");
    assert!(core.stats(t).working_set.holding);
    let (mut d, step) = ask(&core, "d", 400, t);
    assert!(matches!(step, Step::Sleep { .. }), "{step:?}");
    // e makes five: nobody is held out any more. The hand-over its ask
    // sets off lets c, d and e in; e collects its grant at once.
    let (_e, step) = ask(&core, "e", 400, t);
    let mut reasons = vec![admitted(step).admission().reason];
    for driven in [&mut c, &mut d] {
        assert!(
            driven.wakes.load(Ordering::SeqCst) > 0,
            "woken for its grant"
        );
        let step = match driven.attempt.on_wake(t).unwrap() {
            Step::ProbeUsage => driven
                .attempt
                .on_cache_state(Some(0.1), Some(engine()), t)
                .unwrap(),
            other => other,
        };
        reasons.push(admitted(step).admission().reason);
    }
    assert_eq!(reasons, [Reason::RunningColdPays; 3]);
    let stats = core.stats(t);
    assert!(!stats.working_set.holding);
    assert_eq!(stats.admissions(Reason::RunningColdPays), 3);
    assert!(stats.working_set.load_tokens > stats.working_set.capacity_tokens);
    let text = stats.to_prometheus();
    for line in [
        "kvgate_admissions_total{reason=\"running_cold_pays\"} 3",
        "kvgate_working_set_holding 0",
    ] {
        assert!(text.contains(line), "missing `{line}` in\n{text}");
    }
}

#[test]
fn the_blocking_gate_sketches_first_prompts_to_learn_the_shared_prefix() {
    // Sessions whose first prompts share their first 300 tokens, behind an
    // engine that reports no cached tokens: the blocking gate has the ids,
    // sketches them, and the working set counts the prefix once while
    // they are members.
    let clock = Arc::new(ManualClock::new(0));
    let gate = Gate::with_clock(Config::default(), SmallEngine, clock.clone()).unwrap();
    let mut leases = Vec::new();
    for session in 0..3u32 {
        let prompt: Vec<u32> = (0..300)
            .chain((0..100).map(|i| 10_000 * (session + 1) + i))
            .collect();
        let id = format!("agent-{session}");
        let lease = gate.acquire(id.as_bytes(), &prompt).unwrap();
        clock.advance(Duration::from_millis(10));
        leases.push(lease);
    }
    let shared = gate.stats().working_set.shared_prefix_tokens;
    assert!((1..=300).contains(&shared), "{shared}");
    // Three 400-token prompts fit 1,000 tokens only because the prefix
    // counts once.
    assert_eq!(gate.stats().working_set.members, 3);
    for lease in leases {
        lease.release_with(TurnReport::new(None, Some(0)));
    }
}
