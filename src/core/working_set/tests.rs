//! Unit tests of the working set, one per rule kept.
use super::lifecycle::Gaps;
use super::tuning::{GAPS_TO_JUDGE, GAP_SAMPLES};
use super::window::keeps_window;
use super::*;

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// 1000 tokens of KV in blocks of 1; refill window 1 s (1000 tokens/s).
fn set() -> WorkingSet<&'static str> {
    let mut ws = WorkingSet::new(Tuning::default());
    ws.set_engine(EngineCapacity::new(1000, 1, 1000.0)).unwrap();
    ws
}

fn report(cached: u64, output: u64) -> TurnReport {
    TurnReport::new(Some(cached), Some(output))
}

#[test]
fn a_window_is_kept_while_the_median_of_the_last_eight_gaps_is_within_it() {
    let mut gaps = Gaps::default();
    let mut all = Vec::new();
    let mut x = 12345u64;
    let mut next = || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        // A small range, so that equal gaps (and refills) come often.
        (x >> 33) % 50
    };
    for _ in 0..300 {
        let gap = next();
        gaps.push(gap);
        all.push(gap);
        let mut last: Vec<u64> = all.iter().rev().take(GAP_SAMPLES).copied().collect();
        last.sort_unstable();
        assert_eq!(gaps.len(), last.len());
        let refill = next();
        let by_median = last.len() < GAPS_TO_JUDGE || last[last.len() / 2] <= refill;
        assert_eq!(keeps_window(&gaps, refill), by_median, "{last:?} {refill}");
    }
}

#[test]
fn sessions_join_while_they_fit_and_wait_in_order_after() {
    let mut ws = set();
    assert_eq!(ws.request(&"a", 400, 0), Verdict::Empty);
    assert_eq!(ws.request(&"b", 400, 0), Verdict::Fits);
    assert_eq!(ws.request(&"c", 400, 0), Verdict::Wait);
    assert_eq!(
        ws.request(&"d", 100, 0),
        Verdict::Wait,
        "FIFO: d fits but c is ahead"
    );
    assert_eq!(ws.load(), 800);
    // a's turn ends: it keeps its place for the window, so c still waits.
    ws.release(&"a", 400, report(0, 0), 0, S / 10);
    let mut out = Vec::new();
    ws.admit_waiting(S / 10, &mut out);
    assert!(out.is_empty());
    assert_eq!(ws.next_deadline(), Some(S / 10 + S));
    // Its window ends: c (then d) enter, handed over until they collect.
    ws.admit_waiting(S / 10 + S, &mut out);
    assert_eq!(out, vec![("c", Verdict::Fits), ("d", Verdict::Fits)]);
    assert_eq!(ws.request(&"c", 400, S / 10 + S), Verdict::Fits);
    assert_eq!(ws.request(&"d", 100, S / 10 + S), Verdict::Fits);
    assert_eq!(ws.stats().members, 3);
}

#[test]
fn a_member_comes_back_in_without_waiting() {
    let mut ws = set();
    ws.request(&"a", 400, 0);
    ws.request(&"b", 500, 0);
    ws.release(&"a", 400, report(0, 50), 0, S / 10);
    assert_eq!(ws.request(&"c", 100, S / 10), Verdict::Wait);
    assert_eq!(ws.request(&"a", 450, S / 5), Verdict::Member);
}

#[test]
fn a_retry_keeps_its_place_and_a_withdrawn_waiter_loses_it() {
    let mut ws = set();
    ws.request(&"a", 900, 0);
    assert_eq!(ws.request(&"b", 500, 0), Verdict::Wait);
    assert_eq!(ws.request(&"c", 600, 0), Verdict::Wait);
    assert_eq!(ws.request(&"b", 500, 1), Verdict::Wait, "retry");
    ws.finish(&"a", 2);
    let mut out = Vec::new();
    ws.admit_waiting(2, &mut out);
    assert_eq!(
        out,
        vec![("b", Verdict::Empty)],
        "b was first, its retry kept that"
    );
    ws.withdraw(&"b");
    assert_eq!(ws.stats().members, 0, "an uncollected grant is undone");
    ws.admit_waiting(3, &mut out);
    assert_eq!(out.last(), Some(&("c", Verdict::Empty)));
}

#[test]
fn a_session_larger_than_the_cache_still_runs_alone() {
    let mut ws = set();
    assert_eq!(ws.request(&"huge", 5000, 0), Verdict::Empty);
}

#[test]
fn the_shared_prefix_counts_once() {
    let mut ws = set();
    ws.request(&"a", 400, 0);
    ws.release(&"a", 400, report(0, 0), 0, 1);
    ws.request(&"b", 400, 2);
    // b's first turn hit the 300 tokens it shares with a.
    ws.release(&"b", 400, report(300, 0), 2, 3);
    assert_eq!(ws.stats().shared_prefix_tokens, 300);
    // a shared nothing on its first turn (it was first): 300 + 400 + 100.
    assert_eq!(ws.load(), 800);
    // c is expected to share the 300 as first turns have: it adds 300
    // of its own 600, and 1100 would not fit.
    assert_eq!(ws.request(&"c", 600, 4), Verdict::Wait);
    ws.finish(&"a", 5);
    let mut out = Vec::new();
    ws.admit_waiting(5, &mut out);
    assert_eq!(out, vec![("c", Verdict::Fits)]);
    assert_eq!(ws.load(), 300 + 100 + 300);
}

#[test]
fn a_new_session_is_counted_without_the_prefix_first_turns_shared() {
    // Single-turn sessions sharing a 300-token prompt: each is counted
    // for what it adds, not for the shared prompt again.
    let mut ws = set();
    ws.request(&"first", 400, 0);
    ws.release(&"first", 400, report(0, 0), 0, 1);
    ws.finish(&"first", 1);
    ws.request(&"second", 400, 2);
    ws.release(&"second", 400, report(300, 0), 2, 3);
    ws.finish(&"second", 3);
    for (i, key) in ["c", "d", "e", "f", "g", "h", "i"].iter().enumerate() {
        let verdict = ws.request(key, 400, 4);
        assert_ne!(verdict, Verdict::Wait, "{key}");
        assert_eq!(ws.load(), 300 + 100 * (i as u64 + 1));
    }
    // 1000 counted: the eighth waits.
    assert_eq!(ws.request(&"j", 400, 4), Verdict::Wait);
    // The first-turn report replaces the expectation: i shared nothing,
    // so 400 are its own, and the member released longest ago (i
    // itself, the only one between turns) is parked to make room.
    ws.release(&"i", 400, report(0, 0), 4, 5);
    assert_eq!(ws.stats().parked, 1);
    assert_eq!(ws.load(), 300 + 100 * 6);
}

#[test]
fn without_cached_reports_first_prompts_sketches_give_the_shared_prefix() {
    // As above, from a host whose engine reports no cached tokens but
    // which passes token ids: single-turn sessions whose 400-token
    // prompts share their first 300 (the sketches see 257 of them:
    // the sample at 255 is the last before 300; blocks of one token).
    let mut ws = set();
    let prompt = |seed: u32| -> Vec<u32> {
        (0..300)
            .chain((0..100).map(|i| 1_000_000 * (seed + 1) + i))
            .collect()
    };
    let no_cached = TurnReport::new(None, Some(0));
    for (seed, key) in [(0, "first"), (1, "second")] {
        let sketch = PromptSketch::of(&prompt(seed));
        assert_ne!(
            ws.request_sketched(&key, 400, Some(&sketch), 0),
            Verdict::Wait
        );
        ws.release(&key, 400, no_cached, 0, 1);
    }
    assert_eq!(ws.stats().shared_prefix_tokens, 257);
    assert_eq!(ws.load(), 257 + 2 * 143);
    // A new session is counted for the 143 tokens it adds.
    let sketch = PromptSketch::of(&prompt(2));
    assert_ne!(
        ws.request_sketched(&"c", 400, Some(&sketch), 2),
        Verdict::Wait
    );
    assert_eq!(ws.load(), 257 + 3 * 143);
    // Once nobody else is left, c's prompt is all its own.
    for key in ["first", "second"] {
        ws.finish(&key, 3);
    }
    assert_eq!(ws.load(), 400);
    // Told lengths only, nothing is learned: the prefix counts as c's own.
    let mut lengths = set();
    for key in ["first", "second"] {
        lengths.request(&key, 400, 0);
        lengths.release(&key, 400, no_cached, 0, 1);
        lengths.finish(&key, 1);
    }
    assert_eq!(lengths.stats().shared_prefix_tokens, 0);
    lengths.request(&"c", 400, 2);
    assert_eq!(lengths.load(), 400);
    ws.audit().unwrap();
}

#[test]
fn a_waiter_asking_again_is_not_compared_with_itself() {
    // 10,000 tokens of KV; 2,000-token first prompts sharing their
    // first 300 (the sketches see 257), no cached tokens reported.
    let mut ws = WorkingSet::new(Tuning::default());
    ws.set_engine(EngineCapacity::new(10_000, 1, 1000.0))
        .unwrap();
    let prompt = |seed: u32| -> Vec<u32> {
        (0..300)
            .chain((0..1700).map(|i| 1_000_000 * (seed + 1) + i))
            .collect()
    };
    let no_cached = TurnReport::new(None, Some(0));
    let ask = |ws: &mut WorkingSet<&'static str>, key, seed, t| {
        let sketch = PromptSketch::of(&prompt(seed));
        ws.request_sketched(&key, 2000, Some(&sketch), t)
    };
    assert_eq!(ask(&mut ws, "a", 0, 0), Verdict::Empty);
    // b, c, d, e fill the cache beside a (each counted whole until a
    // first turn teaches the shared prefix); f waits, and asks again.
    for (seed, key) in [(1, "b"), (2, "c"), (3, "d"), (4, "e")] {
        assert_ne!(ask(&mut ws, key, seed, 0), Verdict::Wait, "{key}");
    }
    assert_eq!(ask(&mut ws, "f", 5, 0), Verdict::Wait);
    assert_eq!(ask(&mut ws, "f", 5, 1), Verdict::Wait);
    for key in ["a", "b", "c", "d", "e"] {
        ws.release(&key, 2000, no_cached, 0, 2);
        ws.finish(&key, 2);
    }
    assert_eq!(ws.stats().shared_prefix_tokens, 0, "no member uses it");
    let mut out = Vec::new();
    ws.admit_waiting(2, &mut out);
    assert_eq!(ask(&mut ws, "f", 5, 2), Verdict::Empty);
    assert_eq!(ws.stats().shared_prefix_tokens, 257);
    ws.release(&"f", 2000, no_cached, 2, 3);
    // Compared with itself on asking again, f would have taught 1,537.
    assert_eq!(ws.stats().shared_prefix_tokens, 257);
    ws.audit().unwrap();
}

#[test]
fn members_that_outgrow_the_cache_park_the_least_recently_released() {
    let mut ws = set();
    // Turns of 600 ms next to a 1 s window: the members are seen one turn
    // ahead, so only the overflow itself parks anyone.
    ws.request(&"a", 300, 0);
    ws.request(&"b", 300, 0);
    ws.request(&"c", 300, 0);
    ws.release(&"a", 300, report(0, 0), 0, 600 * MS);
    ws.release(&"b", 300, report(0, 0), 0, 610 * MS);
    ws.release(&"c", 300, report(0, 0), 0, 620 * MS);
    // b grows to 500: 300 + 500 + 300 > 1000, so a (released first) leaves.
    assert_eq!(ws.request(&"b", 500, 700 * MS), Verdict::Member);
    assert_eq!(ws.stats().members, 2);
    assert_eq!(ws.stats().parked, 1);
    // a queues again behind a session that asked first (once c is gone,
    // n fits beside b and the 200 tokens b's next turn adds: 500 + 200 +
    // 300; a then waits for room).
    assert_eq!(ws.request(&"n", 300, 710 * MS), Verdict::Wait);
    assert_eq!(ws.request(&"a", 300, 720 * MS), Verdict::Wait);
    ws.finish(&"c", 730 * MS);
    let mut out = Vec::new();
    ws.admit_waiting(730 * MS, &mut out);
    assert_eq!(out, vec![("n", Verdict::Fits)]);
    assert!(ws.is_waiting(&"a"));
}

#[test]
fn after_an_overflow_the_members_that_will_not_fit_a_window_ahead_are_parked_too() {
    let mut ws = set();
    // x has run 10 turns of 10 ms, 10 ms apart, at 50 tokens, and its
    // 11th is in flight: turns 20 ms apart make a 1 s window 50 turns,
    // and sessions are known to run at least 11.
    let mut now = 0;
    for _ in 0..10 {
        ws.request(&"x", 50, now);
        ws.release(&"x", 50, report(50, 0), now, now + 10 * MS);
        now += 20 * MS;
    }
    ws.request(&"x", 50, now);
    now += 10 * MS;
    for k in ["a", "b", "c", "d"] {
        ws.request(&k, 100, now);
    }
    now += 10 * MS;
    for k in ["a", "b", "c", "d"] {
        ws.release(&k, 100, report(0, 0), now - 10 * MS, now);
    }
    now += 10 * MS;
    for k in ["a", "b", "c", "d"] {
        assert_eq!(ws.request(&k, 200, now), Verdict::Member);
    }
    now += 10 * MS;
    for k in ["a", "b", "c", "d"] {
        ws.release(&k, 200, report(100, 0), now - 10 * MS, now);
    }
    // d's third turn brings a long tool result: 50 + 200 * 3 + 500 >
    // 1000, so a, released longest ago, is parked. The rest would not fit
    // their next turns (each 100 more, d more), so b and c are parked
    // with it now, while their histories are short, rather than one at
    // each overflow to come. d, whose turn asks, is never parked.
    now += 10 * MS;
    assert_eq!(ws.request(&"d", 500, now), Verdict::Member);
    assert!(!ws.is_member(&"a"));
    assert!(!ws.is_member(&"b"));
    assert!(!ws.is_member(&"c"));
    assert!(ws.is_member(&"d"));
    assert_eq!(ws.stats().parked, 3);
    ws.audit().unwrap();
}

/// Runs `turns` turns of `key` from `start`: prompts of 100, 200, ...
/// tokens (100 of tool result a turn, no output), each turn lasting
/// `turn` and followed by a tool gap as long, each prefilling
/// `prefilled` tokens (at most its prompt). Returns when its last turn
/// ended.
fn run_turns(
    ws: &mut WorkingSet<&'static str>,
    key: &'static str,
    turns: u64,
    start: u64,
    turn: u64,
    prefilled: u64,
) -> u64 {
    let mut t = start;
    for i in 1..=turns {
        let prompt = 100 * i;
        assert_ne!(ws.request(&key, prompt, t), Verdict::Wait, "{key} turn {i}");
        let cached = prompt.saturating_sub(prefilled);
        ws.release(&key, prompt, report(cached, 0), t, t + turn);
        t += 2 * turn;
    }
    t - turn
}

/// Two sessions of `lifetime` turns finish (turns of `turn`, tool gaps
/// as long, each prefilling its 100 new tokens); then `a` runs `a_turns` turns, and a newcomer with a
/// `prompt`-token prompt asks while `a` is between turns.
fn newcomer_beside_a_growing_member(
    lifetime: u64,
    a_turns: u64,
    prompt: u64,
    turn: u64,
) -> Verdict {
    let mut ws = set();
    let mut t = 0;
    for key in ["x", "y"] {
        t = run_turns(&mut ws, key, lifetime, t, turn, 100);
        ws.finish(&key, t);
    }
    t = run_turns(&mut ws, "a", a_turns, t, turn, 100);
    assert_eq!(ws.stats().members, 1);
    let v = ws.request(&"n", prompt, t + turn / 2);
    ws.audit().unwrap();
    v
}

#[test]
fn a_newcomer_waits_when_the_members_would_outgrow_the_cache_within_a_window() {
    // Turns and gaps of 100 ms against a 1 s refill window, half of
    // the engine's time prefilling: 10 turns ahead. Sessions ran 6
    // turns: `a` (200 tokens, 100 more a turn) has 4 more to run, the 300-token newcomer 5. It fits beside a's
    // next turn (200 + 100 + 300), but 3 turns ahead they would hold
    // 500 + 600 > 1000.
    assert_eq!(
        newcomer_beside_a_growing_member(6, 2, 300, S / 10),
        Verdict::Wait
    );
}

#[test]
fn a_newcomer_joins_beside_members_that_are_about_to_finish() {
    // Sessions ran 3 turns: `a` has one more to run, the newcomer 2.
    // Counted as growing regardless, they would hold 500 + 600 three
    // turns ahead; a will have finished by then.
    assert_eq!(
        newcomer_beside_a_growing_member(3, 2, 300, S / 10),
        Verdict::Fits
    );
}

#[test]
fn a_member_that_outlived_every_finished_session_still_counts() {
    // Sessions ran 3 turns, `a` has run 4 (400 tokens): nothing says
    // when it ends, so it counts as after its next turn (500), and the
    // 350-token newcomer, expected to run 3 turns, would hold 550 two
    // turns ahead: 1050 > 1000.
    assert_eq!(
        newcomer_beside_a_growing_member(3, 4, 350, S / 10),
        Verdict::Wait
    );
}

#[test]
fn a_newcomer_that_fits_one_turn_ahead_joins_when_a_window_is_a_turn() {
    // Turns and gaps of 600 ms against a 1 s window (a twelfth of the
    // engine's time prefilling): the horizon is a single turn, so only
    // the members' next turns are counted.
    assert_eq!(
        newcomer_beside_a_growing_member(6, 2, 300, 6 * S / 10),
        Verdict::Fits
    );
}

#[test]
fn sessions_that_finish_teach_how_long_sessions_run() {
    let mut ws = set();
    let t = run_turns(&mut ws, "x", 3, 0, S / 10, 0);
    assert!(ws.lifetimes.is_empty());
    ws.finish(&"x", t);
    assert_eq!(ws.lifetimes.longest(), 3);
    assert_eq!(
        ws.lifetimes.survival(std::iter::empty()).continuing(2, 1),
        Some(1.0)
    );
}

#[test]
fn while_no_end_is_told_a_long_quiet_is_presumed_an_end_and_taken_back_on_return() {
    let mut ws = set();
    let t = run_turns(&mut ws, "x", 3, 0, S / 10, 0);
    // It leaves when its window (1 s here) ends, and must be quiet for
    // two windows from its release (no longer gap seen).
    ws.expire(t + 2 * S - 1);
    assert_eq!(ws.stats().members, 0);
    assert!(ws.lifetimes.is_empty());
    ws.expire(t + 2 * S);
    assert_eq!(ws.lifetimes.longest(), 3, "presumed ended after 3 turns");
    // It asks again: it had not ended.
    ws.request(&"x", 400, t + 3 * S);
    assert!(ws.lifetimes.is_empty(), "taken back");
    ws.release(&"x", 400, report(300, 0), t + 3 * S, t + 4 * S);
    // The gap it took (3 s) now sets the quiet needed: 6 s.
    ws.expire(t + 4 * S + 6 * S - 1);
    assert!(ws.lifetimes.is_empty());
    ws.expire(t + 4 * S + 6 * S);
    assert_eq!(ws.lifetimes.longest(), 4);
    // Told ends count once, presumed or not.
    ws.finish(&"x", t + 40 * S);
    assert_eq!(ws.lifetimes.by_finish_len(), 1);
    ws.audit().unwrap();
}

#[test]
fn once_the_host_tells_an_end_nothing_is_presumed() {
    let mut ws = set();
    let t = run_turns(&mut ws, "x", 2, 0, S / 10, 0);
    ws.finish(&"x", t);
    let t = run_turns(&mut ws, "y", 2, t, S / 10, 0);
    ws.expire(t + 100 * S);
    assert_eq!(ws.lifetimes.by_finish_len(), 1, "only x's told end");
}

#[test]
fn while_ends_are_presumed_a_session_at_the_usual_last_turn_keeps_no_window() {
    // Turns of 0.1 s, tools of 0.1 s: windows are kept.
    let mut ws = set();
    let mut t = 0;
    for key in ["x", "y"] {
        t = run_turns(&mut ws, key, 2, t, S / 10, 0);
        ws.expire(t + 4 * S);
        t += 4 * S;
    }
    assert!(ws.lifetimes.ends_after(2));
    t = run_turns(&mut ws, "a", 1, t, S / 10, 0);
    assert_eq!(
        ws.stats().members,
        1,
        "a keeps its window after its first turn"
    );
    t = run_turns(&mut ws, "a", 1, t + S / 10, S / 10, 0) + 1;
    ws.expire(t);
    assert_eq!(
        ws.stats().members,
        0,
        "after its second, sessions end: no window"
    );
    // A host that tells ends gets the window kept until it says so.
    let mut told = set();
    let mut t = run_turns(&mut told, "x", 2, 0, S / 10, 0);
    told.finish(&"x", t);
    t = run_turns(&mut told, "a", 2, t, S / 10, 0) + 1;
    told.expire(t);
    assert_eq!(told.stats().members, 1);
    told.audit().unwrap();
    ws.audit().unwrap();
}

#[test]
fn the_horizon_is_the_turns_a_session_runs_in_a_window() {
    let mut ws = set();
    assert_eq!(ws.stats().horizon_turns, 1, "no turn measured yet");
    run_turns(&mut ws, "x", 3, 0, S * 9 / 100, 0);
    // A cycle of 180 ms (a 90 ms turn, a 90 ms gap) against a 1 s window:
    // 5 whole turns.
    assert_eq!(ws.stats().horizon_turns, 5);
}

#[test]
fn a_newcomer_waits_for_the_room_the_members_next_turns_need() {
    // Turns of 600 ms next to a 1 s window: one turn ahead.
    let mut ws = set();
    assert_eq!(ws.request(&"a", 300, 0), Verdict::Empty);
    ws.release(&"a", 300, report(0, 50), 0, 600 * MS);
    // a's next turn shows its tool result: 300 + 50 + 150 = 500.
    assert_eq!(ws.request(&"a", 500, 700 * MS), Verdict::Member);
    // It hit all it should (350).
    ws.release(&"a", 500, report(350, 50), 700 * MS, 1300 * MS);
    // a keeps 550 and its next turn adds ~200 (150 tool result, 50 output):
    // a 300-token newcomer (+50 output) would fit now (900) but not
    // after a's next turn (1100), so it waits rather than be parked or
    // park a at once.
    assert_eq!(ws.stats().members, 1);
    assert_eq!(ws.request(&"n", 300, 1400 * MS), Verdict::Wait);
    // A smaller one fits beside both: 550 + 200 + 200 + 50 = 1000.
    ws.withdraw(&"n");
    assert_eq!(ws.request(&"m", 200, 1500 * MS), Verdict::Fits);
    ws.audit().unwrap();
}

#[test]
fn a_members_next_turn_is_reserved_in_full() {
    let mut ws = set();
    assert_eq!(ws.request(&"a", 100, 0), Verdict::Empty);
    // In flight, before anything is measured: nothing to reserve.
    assert_eq!(ws.reserve_sum, 0);
    ws.release(&"a", 100, report(0, 40), 0, 10);
    // Its next turn repeats its 40 of output (no growth measured yet).
    assert_eq!(ws.reserve_sum, 40);
    // Its second turn shows 60 of tool result: 40 + 60 reserved since.
    assert_eq!(ws.request(&"a", 200, 20), Verdict::Member);
    assert_eq!(ws.reserve_sum, 100);
    ws.finish(&"a", 30);
    assert_eq!(ws.reserve_sum, 0);
    ws.audit().unwrap();
}

#[test]
fn equal_release_times_park_in_joining_order_whatever_the_release_order() {
    // Turns of 600 ms next to a 1 s window: one turn ahead.
    let mut ws = set();
    for k in ["a", "b", "c", "d"] {
        ws.request(&k, 200, 0);
    }
    // Released at the same instant in the reverse of their joining order,
    // and a after them though its clock said earlier (two threads).
    for k in ["d", "c", "b"] {
        ws.release(&k, 200, report(0, 0), 0, 600 * MS);
    }
    ws.release(&"a", 200, report(0, 0), 0, 595 * MS);
    ws.audit().unwrap();
    // d grows to 600: 1200 tokens, so the least recently released
    // other than d leaves: a (595 ms), then nobody (1000 fit).
    assert_eq!(ws.request(&"d", 600, 700 * MS), Verdict::Member);
    assert!(!ws.is_member(&"a"));
    // A retry of d's turn asks for 800: 1200 again. b and c were
    // released at the same time, c first; b joined first and leaves.
    assert_eq!(ws.request(&"d", 800, 710 * MS), Verdict::Member);
    assert!(!ws.is_member(&"b"));
    assert!(ws.is_member(&"c"));
    assert_eq!(ws.stats().parked, 2);
    ws.audit().unwrap();
}

#[test]
fn a_ghost_counts_while_a_member_between_turns_is_older() {
    let mut ws = set();
    ws.request(&"old", 300, 0);
    ws.request(&"gone", 300, 0);
    ws.release(&"old", 300, report(0, 0), 0, 10);
    ws.release(&"gone", 300, report(0, 0), 0, 20);
    ws.finish(&"gone", 20);
    // gone's blocks were freed after old's: they are evicted after them.
    assert_eq!(ws.load(), 600);
    // Once old runs again its blocks are the newest: the ghost stops counting.
    ws.request(&"old", 300, 30);
    ws.release(&"old", 300, report(300, 0), 30, 40);
    assert_eq!(ws.load(), 300);
}

#[test]
fn sessions_whose_tools_outlast_the_window_get_none() {
    let mut ws = set();
    let mut t = 0;
    for _ in 0..3 {
        ws.request(&"slow", 100, t);
        ws.release(&"slow", 100, report(0, 0), t, t + 1);
        t += 1 + 5 * S; // 5 s tools against a 1 s window
    }
    ws.request(&"slow", 100, t);
    ws.release(&"slow", 100, report(0, 0), t, t + 1);
    ws.expire(t + 1);
    assert_eq!(ws.stats().members, 0, "no window at all");
}

#[test]
fn a_window_never_outlasts_the_refill_window_known_now() {
    // The engine says its capacity but not its prefill rate: the window
    // comes from what turns report.
    let mut ws = WorkingSet::new(Tuning::default());
    ws.set_engine(EngineCapacity::new(1000, 1, 0.0)).unwrap();
    ws.request(&"a", 500, 0);
    // a's first turn queued in the engine behind a whole batch: 500
    // tokens in 100 s, a 200 s window when it was released.
    ws.release(&"a", 500, report(0, 0), 0, 100 * S);
    assert_eq!(ws.window_ns(), 200 * S);
    assert_eq!(ws.request(&"b", 400, 100 * S), Verdict::Fits);
    // b shows the real rate: 400 tokens in 0.4 s, a 1 s window.
    ws.release(&"b", 400, report(0, 0), 100 * S, 100 * S + 4 * S / 10);
    assert_eq!(ws.window_ns(), S);
    assert_eq!(
        ws.next_deadline(),
        Some(101 * S),
        "a's window ends a refill window after its release"
    );
    ws.expire(101 * S);
    assert!(!ws.is_member(&"a"), "a kept its 200 s window");
    assert!(ws.is_member(&"b"));
}

/// The members' turns end at `t + 1` ns; at `t + 2` whoever may enter
/// is let in (nobody is in flight then); their next turns ask at
/// `t + 0.5 s`. Repeated from `from` while before `to`; returns the
/// time reached and what was let in.
fn cycle_members(
    ws: &mut WorkingSet<&'static str>,
    members: &[(&'static str, u64)],
    from: u64,
    to: u64,
) -> (u64, Vec<(&'static str, Verdict, u64)>) {
    let mut t = from;
    let mut let_in = Vec::new();
    while t < to {
        for (k, prompt) in members {
            ws.release(k, *prompt, TurnReport::new(None, Some(0)), t, t + 1);
        }
        let mut out = Vec::new();
        ws.admit_waiting(t + 2, &mut out);
        let_in.extend(out.into_iter().map(|(k, v)| (k, v, t + 2)));
        t += S / 2;
        for (k, prompt) in members {
            ws.request(k, *prompt, t);
        }
    }
    (t, let_in)
}

#[test]
fn a_head_waiting_past_the_bound_parks_a_member_for_itself() {
    let mut ws = set();
    ws.request(&"a", 600, 0);
    ws.request(&"b", 300, 0);
    assert_eq!(ws.request(&"c", 500, 0), Verdict::Wait);
    // a and b keep coming back within their windows; c is not let in
    // before the bound (16 windows of 1 s).
    let (t, let_in) = cycle_members(&mut ws, &[("a", 600), ("b", 300)], 0, 16 * S);
    assert!(let_in.is_empty(), "{let_in:?}");
    let mut out = Vec::new();
    ws.admit_waiting(t, &mut out);
    assert!(
        out.is_empty(),
        "a and b are in flight: nobody can be parked"
    );
    ws.release(&"b", 300, TurnReport::new(None, Some(0)), t, t + 1);
    ws.admit_waiting(t + 2, &mut out);
    assert!(
        out.is_empty(),
        "parking b alone leaves no room beside a in flight"
    );
    ws.release(&"a", 600, TurnReport::new(None, Some(0)), t, t + 3);
    ws.admit_waiting(t + 3, &mut out);
    assert_eq!(out, vec![("c", Verdict::WaitBound)]);
    // b (released first) went, then a: c is alone with 500 tokens.
    assert_eq!(ws.stats().parked, 2);
    assert_eq!(ws.load(), 500);
}

#[test]
fn the_wait_bound_counts_from_queueing() {
    let mut ws = set();
    ws.request(&"a", 600, 0);
    ws.request(&"b", 300, 0);
    assert_eq!(ws.request(&"c", 500, 0), Verdict::Wait);
    assert_eq!(ws.request(&"d", 500, S), Verdict::Wait);
    // a and b keep coming back within their windows (1 s; the bound is
    // 16 of them); at 8 s a ends and c, the head, goes in.
    let (t, let_in) = cycle_members(&mut ws, &[("a", 600), ("b", 300)], 0, 8 * S);
    assert!(let_in.is_empty(), "{let_in:?}");
    ws.release(&"a", 600, TurnReport::new(None, Some(0)), t, t + 1);
    ws.finish(&"a", t + 1);
    let mut out = Vec::new();
    ws.admit_waiting(t + 2, &mut out);
    assert_eq!(out, vec![("c", Verdict::Fits)]);
    ws.request(&"c", 500, t + 2);
    // d queued at 1 s and heads the line since 8 s: room is made for it
    // 16 windows after it queued, not after it reached the head.
    let (_, let_in) = cycle_members(&mut ws, &[("b", 300), ("c", 500)], t + S / 2, 30 * S);
    assert_eq!(let_in.len(), 1, "{let_in:?}");
    let (who, why, when) = let_in[0];
    assert_eq!((who, why), ("d", Verdict::WaitBound));
    assert!((17 * S..18 * S).contains(&when), "{when}");
}

#[test]
fn a_gate_blind_to_sharing_learns_it_from_the_usage_gauge() {
    // Lengths only, no cached tokens: three 300-token turns count 900.
    let mut ws = set();
    assert_eq!(ws.request(&"a", 300, 0), Verdict::Empty);
    assert_eq!(ws.request(&"b", 300, 0), Verdict::Fits);
    assert_eq!(ws.request(&"c", 300, 0), Verdict::Fits);
    assert_eq!(ws.load(), 900);
    // The engine holds 500: each turn beyond the first shares 200.
    ws.observe_usage(0.5);
    assert_eq!(ws.shared.tokens, 200);
    assert_eq!(ws.load(), 500);
    ws.audit().unwrap();
    // A newcomer is counted without it: 500 + 100 fits.
    assert_eq!(ws.request(&"d", 300, 0), Verdict::Fits);
    assert_eq!(ws.load(), 600);
    // An answer that says more sharing (1200 in prompts, 350 held: 283
    // each) moves nothing: the least of the recent answers stands.
    ws.observe_usage(0.35);
    assert_eq!(ws.shared.tokens, 200);
    ws.audit().unwrap();
}

#[test]
fn a_usage_answer_below_the_longest_prompt_in_flight_teaches_no_sharing() {
    let mut ws = set();
    assert_eq!(ws.request(&"a", 300, 0), Verdict::Empty);
    assert_eq!(ws.request(&"b", 200, 0), Verdict::Fits);
    // 250 held while a alone holds 300: a turn is not in the engine yet.
    ws.observe_usage(0.25);
    assert_eq!(ws.shared.tokens, 0);
    // 400 held: b shares 100 with a.
    ws.observe_usage(0.4);
    assert_eq!(ws.shared.tokens, 100);
}

#[test]
fn a_gate_that_sees_cached_tokens_or_prompt_ids_does_not_ask_the_gauge() {
    let mut ws = set();
    assert_eq!(ws.request(&"a", 300, 0), Verdict::Empty);
    ws.release(&"a", 300, report(0, 0), 0, 10);
    assert_eq!(ws.request(&"b", 300, 20), Verdict::Fits);
    assert_eq!(ws.request(&"a", 300, 20), Verdict::Member);
    ws.observe_usage(0.3);
    assert_eq!(ws.shared.tokens, 0);
    let mut ws = set();
    let ids: Vec<u32> = (0..300).collect();
    let sketch = PromptSketch::of(&ids);
    ws.request_sketched(&"a", 300, Some(&sketch), 0);
    ws.request_sketched(&"b", 300, Some(&sketch), 0);
    ws.observe_usage(0.3);
    assert_eq!(ws.shared.tokens, 0);
}

#[test]
fn without_the_engine_capacity_usage_answers_estimate_it() {
    let mut ws: WorkingSet<u32> = WorkingSet::new(Tuning::default());
    ws.request(&1, 300, 0);
    ws.request(&2, 300, 0);
    // 600 tokens in flight hold 60% of the blocks: about 1000 in all.
    ws.observe_usage(0.6);
    assert_eq!(ws.capacity(), 1000.0);
    // One of them still queued in the engine: 600 tokens counted, 30%
    // held. That says 2000, which is wrong; the estimate keeps 1000.
    ws.observe_usage(0.3);
    assert_eq!(ws.capacity(), 1000.0);
    assert_eq!(ws.request(&3, 500, 1), Verdict::Wait);
    // The engine's own figure wins over the estimate.
    ws.set_engine(EngineCapacity::new(5000, 1, 0.0)).unwrap();
    ws.observe_usage(0.01);
    assert_eq!(ws.capacity(), 5000.0);
}

#[test]
fn with_no_capacity_known_everyone_fits() {
    let mut ws: WorkingSet<u32> = WorkingSet::new(Tuning::default());
    for k in 0..100 {
        assert_ne!(ws.request(&k, 1_000_000, 0), Verdict::Wait);
    }
}

/// Sessions a and b, of `prompt` tokens each, in a 1000-token cache
/// whose engine prefills 1000 tokens/s: each round both take a turn of
/// 0.1 s, then their tools run for the round's gap. Returns the set with
/// both in flight again, and the time.
fn two_sessions_after(prompt: u64, gaps: &[u64]) -> (WorkingSet<&'static str>, u64) {
    let mut ws = set();
    let mut t = 0;
    for gap in gaps {
        for k in ["a", "b"] {
            ws.request(&k, prompt, t);
            ws.release(&k, prompt, report(0, 0), t, t + S / 10);
        }
        t += S / 10 + gap;
    }
    for k in ["a", "b"] {
        ws.request(&k, prompt, t);
    }
    (ws, t)
}

/// Two sessions of 400 tokens fill the cache, after four rounds with
/// tools of `gap`. Returns the verdict for a third session.
fn third_session_after_cycles(gap: u64) -> (Verdict, WorkingSet<&'static str>) {
    let (mut ws, t) = two_sessions_after(400, &[gap; 4]);
    (ws.request(&"c", 400, t), ws)
}

#[test]
fn with_tools_long_next_to_turns_nobody_is_held_out() {
    // Tools of 0.5 s: holding 2 hot sessions serves 2 / 0.6 s = 3.3
    // turns/s; cold, the engine refills 400 tokens in 0.4 s (2.5/s):
    // holding pays, c waits.
    let (v, ws) = third_session_after_cycles(S / 2);
    assert!(ws.holding_pays());
    assert_eq!(v, Verdict::Wait);
    // Tools of 20 s: hot, the 2.5 sessions that fit serve 2.5 / 20.1 s
    // = 0.12 turns/s. With c waiting, cold could serve 3 / 20.1 s =
    // 0.15 (not clearly more: c waits); with d and e waiting too,
    // 5 / 20.1 s = 0.25, twice as many (the engine could do 2.5/s):
    // holding no longer pays, and the waiters go in beyond the cache.
    let (v, mut ws) = third_session_after_cycles(20 * S);
    assert_eq!(v, Verdict::Wait);
    let t = 4 * (S / 10 + 20 * S);
    assert_eq!(ws.request(&"d", 400, t), Verdict::Wait);
    assert_eq!(ws.request(&"e", 400, t), Verdict::Wait);
    assert!(
        ws.holding_pays(),
        "decided again when the head is looked at"
    );
    let mut out = Vec::new();
    ws.admit_waiting(t, &mut out);
    assert!(!ws.holding_pays());
    assert!(!ws.stats().holding);
    assert_eq!(
        out,
        vec![
            ("c", Verdict::RunningColdPays),
            ("d", Verdict::RunningColdPays),
            ("e", Verdict::RunningColdPays)
        ]
    );
    assert!(ws.load() as f64 > ws.capacity());
}

#[test]
fn turns_let_in_cold_do_not_teach_a_hot_turns_time() {
    // As above: with tools of 20 s next to turns of 0.1 s, c, d and e
    // go in beyond the cache for running cold.
    let (_, mut ws) = third_session_after_cycles(20 * S);
    let mut t = 4 * (S / 10 + 20 * S);
    for k in ["d", "e"] {
        ws.request(&k, 400, t);
    }
    let mut out = Vec::new();
    ws.admit_waiting(t, &mut out);
    assert_eq!(out.len(), 3);
    for k in ["c", "d", "e"] {
        assert_eq!(ws.request(&k, 400, t), Verdict::RunningColdPays);
    }
    let hot_turn = ws.means.turn_ns();
    // Their turns run cold and long (50 s: the re-prefill, the engine's
    // queue) and come back within the window.
    for _ in 0..4 {
        for k in ["c", "d", "e"] {
            ws.release(&k, 400, report(0, 0), t, t + 50 * S);
        }
        t += 50 * S + S / 2;
        for k in ["c", "d", "e"] {
            assert_eq!(ws.request(&k, 400, t), Verdict::Member);
        }
    }
    assert_eq!(ws.means.turn_ns(), hot_turn, "a cold turn is not a hot one");
    // So running cold still looks as far ahead to the next head.
    ws.release(&"c", 400, report(0, 0), t, t + 50 * S);
    ws.finish(&"c", t + 50 * S);
    assert_eq!(ws.request(&"f", 400, t + 50 * S), Verdict::RunningColdPays);
}

#[test]
fn one_long_tool_call_does_not_make_running_cold_look_ahead() {
    // As above, with tools of 0.5 s but for one round of 200 s: the
    // arithmetic mean of the gaps would be over 10 s, and running five
    // sessions cold would look twice as good as holding; the usual
    // cycle is 0.6 s, where the engine cannot refill them in time.
    let (mut ws, t) = two_sessions_after(400, &[S / 2, S / 2, S / 2, 200 * S, S / 2]);
    for k in ["c", "d", "e"] {
        assert_eq!(ws.request(&k, 400, t), Verdict::Wait);
    }
    let mut out = Vec::new();
    ws.admit_waiting(t, &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert!(ws.holding_pays());
}

#[test]
fn parks_forced_by_the_wait_bound_are_paid_off_before_the_next() {
    // 1000 tokens refilled at 1000/s: 1 s windows, a 16 s bound, and a
    // rotation budget refilled at 1000 / 16 = 62.5 tokens a second up
    // to 1000. Three sessions as large as a's queue behind it.
    let mut ws = set();
    ws.request(&"a", 900, 0);
    for k in ["c", "d", "e"] {
        assert_eq!(ws.request(&k, 900, 0), Verdict::Wait);
    }
    let (t, let_in) = cycle_members(&mut ws, &[("a", 900)], 0, 16 * S);
    assert!(let_in.is_empty(), "{let_in:?}");
    let ended = TurnReport::new(None, Some(0));
    let mut out = Vec::new();
    // c, past its bound, has a parked: 900 of the 1000 spent.
    ws.release(&"a", 900, ended, t, t + 1);
    ws.admit_waiting(t + 2, &mut out);
    assert_eq!(out, vec![("c", Verdict::WaitBound)]);
    ws.request(&"c", 900, t + 3);
    ws.release(&"c", 900, ended, t + 3, t + 4);
    // d, past its bound too, finds 100 left: c is parked, 800 owed.
    out.clear();
    ws.admit_waiting(t + 5, &mut out);
    assert_eq!(out, vec![("d", Verdict::WaitBound)]);
    assert_eq!(ws.stats().parked, 2);
    ws.request(&"d", 900, t + 6);
    // e waits past its bound until the 800 are paid off, 12.8 s later,
    // though d is between turns (and could be parked) every 0.5 s.
    let paid_off = t + 5 + 12_800_000_000;
    let next = ws.next_deadline().expect("e's wait ends");
    assert!((paid_off - 10..=paid_off).contains(&next), "{next}");
    let (_, let_in) = cycle_members(&mut ws, &[("d", 900)], t + 6, paid_off + S);
    assert_eq!(let_in.len(), 1, "{let_in:?}");
    let (who, why, when) = let_in[0];
    assert_eq!((who, why), ("e", Verdict::WaitBound));
    assert!((paid_off..paid_off + S / 2 + 3).contains(&when), "{when}");
}

#[test]
fn a_members_reserve_follows_its_own_growth() {
    // a's prompts grow by 200 tokens a turn, b's by 20 (no output): each
    // keeps its own growth free for its next turn, not the mean of both.
    let mut ws = set();
    let mut t = 0;
    for turn in 0..4u64 {
        for (key, growth) in [("a", 200), ("b", 20)] {
            let prompt = 100 + growth * turn;
            assert_ne!(ws.request(&key, prompt, t), Verdict::Wait);
            ws.release(&key, prompt, report(0, 0), t, t + 10);
        }
        t += 20;
    }
    assert_eq!(ws.reserve_sum, 220);
    ws.audit().unwrap();
}

#[test]
fn a_told_rebuild_cost_prices_attention_and_a_measured_rate_the_tokens() {
    let mut ws: WorkingSet<&str> = WorkingSet::new(Tuning::default());
    let cost = RebuildCost::new(2e-5, 1.5e-9).unwrap();
    // No rate measured: the told per-token term stands.
    ws.set_engine(EngineCapacity::new(1000, 1, 0.0).with_rebuild_cost(cost))
        .unwrap();
    let s = ws.stats();
    assert_eq!(
        (s.rebuild_secs_per_token, s.rebuild_secs_per_pair),
        (2e-5, 1.5e-9)
    );
    // A measured rate prices the tokens; an answer without a cost keeps it.
    ws.set_engine(EngineCapacity::new(1000, 1, 40_000.0))
        .unwrap();
    let s = ws.stats();
    assert_eq!(
        (s.rebuild_secs_per_token, s.rebuild_secs_per_pair),
        (1.0 / 40_000.0, 1.5e-9)
    );
}

#[test]
fn a_group_task_is_counted_once_while_any_sample_of_the_group_is_a_member() {
    // A GRPO step: a 1,024-token system prompt, then each task's 2,048
    // tokens; a1 and a2 sample task A, b1 task B. Blocks of 16 tokens.
    let mut ws: WorkingSet<&'static str> = WorkingSet::new(Tuning::default());
    ws.set_engine(EngineCapacity::new(1_000_000, 16, 1000.0))
        .unwrap();
    let system: Vec<u32> = (0..1024).collect();
    let first_prompt = |task: u32| -> Vec<u32> {
        let task = (0..2048).map(move |i| 100_000 * (task + 1) + i);
        system.iter().copied().chain(task).collect()
    };
    let (a, b) = (first_prompt(0), first_prompt(1));
    let ask = |ws: &mut WorkingSet<&'static str>, key, prompt: &[u32]| {
        let sketch = PromptSketch::of(prompt);
        ws.request_sketched(&key, prompt.len() as u64, Some(&sketch), 0)
    };
    assert_eq!(ask(&mut ws, "a1", &a), Verdict::Empty);
    assert_eq!(ws.stats().shared_prefix_tokens, 0, "a1 shares nothing yet");
    assert_eq!(ask(&mut ws, "a2", &a), Verdict::Fits);
    assert_eq!(ask(&mut ws, "b1", &b), Verdict::Fits);
    // The engine served each from its cache as far as the prefixes go.
    ws.release(&"a1", 3072, report(0, 16), 0, 1);
    ws.release(&"a2", 3072, report(3056, 16), 0, 1);
    ws.release(&"b1", 3072, report(1024, 16), 0, 1);
    let with_task = ws.stats().shared_prefix_tokens;
    assert_eq!(with_task, 3056, "the system prompt and task A, each once");
    // Each member's own tokens are what lies beyond its node: the load is
    // every cached block once.
    // (Each footprint is its 3,072-token prompt and 16 tokens of output.)
    assert_eq!(ws.load(), 3056 + 32 + 32 + (3088 - 1024));
    ws.audit().unwrap();
    // a1, which sent task A first, ends: a2 still uses the task.
    ws.finish(&"a1", 2);
    assert_eq!(ws.stats().shared_prefix_tokens, with_task);
    ws.audit().unwrap();
    // a2 ends too: only b1 is in, below the system prompt.
    ws.finish(&"a2", 3);
    assert_eq!(ws.stats().shared_prefix_tokens, 1024);
    ws.audit().unwrap();
}

#[test]
fn a_session_that_compacts_its_history_hangs_again() {
    let mut ws: WorkingSet<&'static str> = WorkingSet::new(Tuning::default());
    ws.set_engine(EngineCapacity::new(1_000_000, 1, 1000.0))
        .unwrap();
    let system: Vec<u32> = (0..2048).collect();
    let with = |seed: u32, len: u32| -> Vec<u32> {
        let own = (0..len).map(move |i| 100_000 * (seed + 1) + i);
        system.iter().copied().chain(own).collect()
    };
    let ask = |ws: &mut WorkingSet<&'static str>, key, prompt: &[u32], t| {
        let sketch = PromptSketch::of(prompt);
        ws.request_sketched(&key, prompt.len() as u64, Some(&sketch), t)
    };
    ask(&mut ws, "a", &with(0, 4096), 0);
    ask(&mut ws, "b", &with(1, 4096), 0);
    let shared = ws.stats().shared_prefix_tokens;
    assert!(
        shared > 1024,
        "{shared}: the system prompt, as far as sampled"
    );
    ws.release(&"a", 6144, report(0, 0), 0, 1);
    // a's next prompt keeps nothing of the system prompt (a summary
    // replaced its history): it no longer shares it.
    let compacted: Vec<u32> = (0..3000).map(|i| 900_000 + i).collect();
    assert_eq!(ask(&mut ws, "a", &compacted, 2), Verdict::Member);
    ws.audit().unwrap();
    assert_eq!(ws.stats().shared_prefix_tokens, shared, "b still uses it");
    // Until the turn ends a's old blocks are still its own; then only the
    // new prompt is.
    ws.release(&"a", 3000, report(0, 0), 2, 3);
    assert_eq!(ws.load(), 3000 + 6144, "a's prompt all its own, b's whole");
}

#[test]
fn the_hosts_budgets_bound_how_far_the_members_are_projected() {
    // Sessions run 10 turns; each turn adds 500 tokens; a turn takes 1 s
    // and a window is 10 s, so a newcomer must fit 7 turns on, when m and
    // it would hold 5,500 tokens each, past the 10,000. With budgets that
    // end them sooner or keep them smaller, it fits.
    let ask = |budget: Budget| {
        let mut ws = WorkingSet::new(Tuning::default());
        ws.set_engine(EngineCapacity::new(10_000, 1, 1000.0))
            .unwrap();
        for _ in 0..4 {
            ws.lifetimes.record(10);
        }
        ws.means.growth = 500.0;
        ws.set_budget(&"m", budget).unwrap();
        ws.set_budget(&"new", budget).unwrap();
        assert_eq!(ws.request(&"m", 2000, 0), Verdict::Empty);
        ws.release(&"m", 2000, report(0, 0), 0, 1_000_000_000);
        assert!(ws.stats().horizon_turns >= 7);
        ws.request(&"new", 2000, 1_000_000_000)
    };
    assert_eq!(ask(Budget::default()), Verdict::Wait);
    assert_eq!(ask(Budget::new(None, Some(4000))), Verdict::Fits);
    assert_eq!(ask(Budget::new(Some(4), None)), Verdict::Fits);
    assert_eq!(ask(Budget::new(Some(9), None)), Verdict::Wait);
}
