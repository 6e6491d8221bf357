//! Property tests of the working-set ledger (`kvgate::core::working_set`):
//! random sequences of turns, releases, finishes, withdrawals and time
//! against a model of what each session is doing, with the ledger's rules
//! checked after every step: once with the fit and parking rules alone (the
//! rule that stops holding sessions out when running cold pays turned off),
//! once with the defaults, where that rule may fire and its admissions must
//! still keep the order and the ledger's consistency; and once with a host
//! tier behind the cache, where sessions parked in the tier go before
//! newcomers (so the queue's order is not first come, first served).

use std::collections::BTreeMap;

use kvgate::core::working_set::{EngineCapacity, KvTier, Tuning, TurnReport, Verdict, WorkingSet};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// Session asks for its next turn with this much prompt growth.
    Request(u8, u16),
    /// Session's turn in flight ends; cached tokens reported as a fraction.
    Release(u8, u8),
    Finish(u8),
    Withdraw(u8),
    Advance(u16),
    Capacity(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..5, 0u16..600).prop_map(|(s, g)| Op::Request(s, g)),
        4 => (0u8..5, 0u8..=100).prop_map(|(s, c)| Op::Release(s, c)),
        1 => (0u8..5).prop_map(Op::Finish),
        1 => (0u8..5).prop_map(Op::Withdraw),
        3 => (0u16..3000).prop_map(Op::Advance),
        1 => (500u16..3000).prop_map(Op::Capacity),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Doing {
    Idle,
    Waiting { since_seq: u64 },
    InFlight { admitted_at: u64 },
}

struct Model {
    doing: BTreeMap<u8, Doing>,
    prompt: BTreeMap<u8, u64>,
    seq: u64,
    /// With a host tier the queue is not first come, first served (the
    /// tier's own unit tests hold its order).
    fifo: bool,
}

fn admitted(
    ws: &WorkingSet<u8>,
    m: &mut Model,
    s: u8,
    v: Verdict,
    now: u64,
) -> Result<(), TestCaseError> {
    let was = m.doing[&s];
    if let (Doing::Waiting { since_seq }, true) = (was, v != Verdict::Member && m.fifo) {
        // First come, first served: nobody waiting queued before it.
        for (o, d) in &m.doing {
            if let Doing::Waiting { since_seq: other } = d {
                prop_assert!(
                    !(*o != s && *other < since_seq),
                    "{} admitted ({:?}) ahead of {}",
                    s,
                    v,
                    o
                );
            }
        }
    }
    prop_assert!(ws.is_member(&s));
    m.doing.insert(s, Doing::InFlight { admitted_at: now });
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_ledger_keeps_its_rules(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops, Tuning::always_holding())?;
    }

    /// A host that never says a session ended (a proxy): ends are presumed
    /// after long quiets and taken back when the session asks again.
    #[test]
    fn the_ledger_keeps_its_rules_when_the_host_tells_no_ends(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let untold = ops.into_iter().filter(|o| !matches!(o, Op::Finish(_))).collect();
        run(untold, Tuning::default())?;
    }

    #[test]
    fn the_ledger_keeps_its_rules_when_running_cold_may_pay(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(ops, Tuning::default())?;
    }

    /// A host tier of 3,000 tokens (no smaller than any capacity the ops
    /// set) copied back at 20,000 tokens/s: windows are the copy's, and
    /// the sessions' histories outgrow the tier.
    #[test]
    fn the_ledger_keeps_its_rules_with_a_host_tier(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run_with(ops, Tuning::default(), Some(3000))?;
    }
}

fn run(ops: Vec<Op>, tuning: Tuning) -> Result<(), TestCaseError> {
    run_with(ops, tuning, None)
}

fn engine(capacity: u64, tier: Option<u64>) -> EngineCapacity {
    let e = EngineCapacity::new(capacity, 16, 2000.0);
    match tier {
        Some(t) => e.with_tier(KvTier::new(t, 20_000.0).unwrap()).unwrap(),
        None => e,
    }
}

fn run_with(ops: Vec<Op>, tuning: Tuning, tier: Option<u64>) -> Result<(), TestCaseError> {
    let mut ws: WorkingSet<u8> = WorkingSet::new(tuning);
    let mut capacity = 2000u64;
    ws.set_engine(engine(capacity, tier)).unwrap();
    let mut m = Model {
        doing: (0..5).map(|s| (s, Doing::Idle)).collect(),
        prompt: BTreeMap::new(),
        seq: 0,
        fifo: tier.is_none(),
    };
    let mut now = 0u64;
    for op in ops {
        match op {
            Op::Request(s, growth) => {
                let doing = m.doing[&s];
                if matches!(doing, Doing::InFlight { .. }) {
                    continue;
                }
                let p = m.prompt.entry(s).or_insert(100);
                if doing == Doing::Idle {
                    *p += u64::from(growth);
                }
                let p = *p;
                let before = ws.queue_position(&s);
                let v = ws.request(&s, p, now);
                if v == Verdict::Wait {
                    let pos = ws.queue_position(&s);
                    prop_assert!(pos.is_some());
                    if let Doing::Waiting { .. } = doing {
                        prop_assert_eq!(pos, before, "a retry keeps its place");
                    } else {
                        m.seq += 1;
                        m.doing.insert(s, Doing::Waiting { since_seq: m.seq });
                    }
                } else {
                    running_cold(&ws, v)?;
                    let parked_for_it = v == Verdict::WaitBound;
                    if v == Verdict::Fits || (parked_for_it && ws.stats().members > 1) {
                        prop_assert!(
                            ws.load() <= capacity,
                            "an admission overcommits: {} > {}",
                            ws.load(),
                            capacity
                        );
                    }
                    admitted(&ws, &mut m, s, v, now)?;
                }
            }
            Op::Release(s, cached) => {
                let Doing::InFlight { admitted_at } = m.doing[&s] else {
                    continue;
                };
                let p = m.prompt[&s];
                ws.release(
                    &s,
                    p,
                    TurnReport::new(Some(p * u64::from(cached) / 100), Some(20)),
                    admitted_at,
                    now,
                );
                m.doing.insert(s, Doing::Idle);
            }
            Op::Finish(s) => {
                if matches!(m.doing[&s], Doing::InFlight { .. }) {
                    continue;
                }
                ws.finish(&s, now);
                prop_assert!(!ws.is_member(&s));
                // Finishing cancels no attempt: one waiting keeps its place.
                let waiting = matches!(m.doing[&s], Doing::Waiting { .. });
                prop_assert_eq!(ws.is_waiting(&s), waiting);
                if !waiting {
                    m.doing.insert(s, Doing::Idle);
                    m.prompt.remove(&s);
                }
            }
            Op::Withdraw(s) => {
                if !matches!(m.doing[&s], Doing::Waiting { .. }) {
                    continue;
                }
                ws.withdraw(&s);
                prop_assert!(!ws.is_waiting(&s));
                m.doing.insert(s, Doing::Idle);
            }
            Op::Advance(ms) => now += u64::from(ms) * 1_000_000,
            Op::Capacity(c) => {
                capacity = u64::from(c);
                ws.set_engine(engine(capacity, tier)).unwrap();
            }
        }
        // Whatever may enter now is handed over (and collected, as an attempt would).
        let mut out = Vec::new();
        let over_before = ws.load() > capacity;
        ws.admit_waiting(now, &mut out);
        let alone = ws.stats().members == 1;
        if !out.is_empty()
            && !over_before
            && !alone
            && out
                .iter()
                .all(|(_, v)| !matches!(v, Verdict::Empty | Verdict::RunningColdPays))
        {
            prop_assert!(
                ws.load() <= capacity,
                "admissions overcommit: {} > {}",
                ws.load(),
                capacity
            );
        }
        for (s, v) in out {
            prop_assert_ne!(v, Verdict::Member);
            running_cold(&ws, v)?;
            let p = m.prompt[&s];
            prop_assert_eq!(ws.request(&s, p, now), v, "the grant is collected as made");
            admitted(&ws, &mut m, s, v, now)?;
        }
        if let Err(e) = ws.audit() {
            return Err(TestCaseError::fail(e));
        }
        // Liveness: nobody waits while the working set is empty.
        if ws.stats().members == 0 {
            prop_assert_eq!(ws.stats().waiting, 0);
        }
        // Everyone the model has waiting is queued, and no one else.
        for (s, d) in &m.doing {
            prop_assert_eq!(
                ws.is_waiting(s),
                matches!(d, Doing::Waiting { .. }),
                "session {}",
                s
            );
        }
        // Once what is due has fired, the next deadline is in the future:
        // a driver that sleeps until it never spins at the same instant.
        if let Some(deadline) = ws.next_deadline() {
            prop_assert!(
                deadline > now,
                "deadline {} is not after now {}",
                deadline,
                now
            );
        }
        // A waiter always has a deadline to come back at, or a member whose release will wake it.
        if ws.stats().waiting > 0 {
            let in_flight = m
                .doing
                .values()
                .any(|d| matches!(d, Doing::InFlight { .. }));
            prop_assert!(
                in_flight || ws.next_deadline().is_some(),
                "a waiter nobody will wake"
            );
        }
    }
    Ok(())
}

/// An admission for running cold paying comes only while holding does not
/// pay, and only with the rule on.
fn running_cold(ws: &WorkingSet<u8>, v: Verdict) -> Result<(), TestCaseError> {
    if v == Verdict::RunningColdPays {
        prop_assert!(
            !ws.holding_pays(),
            "admitted running_cold_pays while holding"
        );
        prop_assert!(!ws.stats().holding);
    }
    Ok(())
}
