//! The session table: one record per tracked session, in lock-sharded maps.
//!
//! A session's record lives in the shard its id hashes to and is only ever
//! touched under that shard's lock, so operations on different sessions run
//! in parallel and operations on one session are linearised by one lock.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc as StdArc;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use hashbrown::hash_table::{Entry, HashTable};

use crate::core::shrink::sparse;
use crate::core::stats::{ReservationState, SessionStats, ShardCounters};
use crate::core::timers::NEVER;
use crate::core::waiters::Waiter;
use crate::sync::{Arc, Mutex, MutexGuard, TableHasher};

/// A session id with its precomputed hash: the one key every layer of the
/// core names a session by (the session table, attempts, leases, timers,
/// the working set). Cloning shares the bytes.
#[derive(Debug, Clone)]
pub(crate) struct SessionKey {
    pub(crate) hash: u64,
    // std Arc: immutable bytes need no model checking.
    pub(crate) bytes: StdArc<[u8]>,
}

impl SessionKey {
    /// Whether both are keys of one record: the key of a record is the
    /// same record only as its own clones (the keys an attempt, a lease or
    /// a timer carry), never as the key of another record with the same
    /// id bytes. A session can be forgotten and tracked again while an
    /// attempt of its old record is still on its way out; that attempt's
    /// figures belong to the old record, not to the new one (a bug once
    /// fixed: a cancelled attempt was charged to the newer record). The
    /// bytes cannot be reused by another record while a clone is alive, so
    /// the pointer is a sound identity. Looking a session up *by its id*
    /// is [`ShardMap::find_mut`].
    pub(crate) fn same_record(&self, other: &Self) -> bool {
        self.hash == other.hash && StdArc::ptr_eq(&self.bytes, &other.bytes)
    }
}

/// Keys are equal when their ids are: the working set knows a session by
/// its id, not by its record, which retention may drop and recreate while
/// the session is still in the working set.
impl PartialEq for SessionKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && (StdArc::ptr_eq(&self.bytes, &other.bytes) || self.bytes == other.bytes)
    }
}

impl Eq for SessionKey {}

/// The table's keyed hash, computed once per call (the working set's maps
/// hash with FxHash over it).
impl Hash for SessionKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// A session's ownership window.
///
/// State table (all transitions under the shard lock); each row is carried
/// out by exactly one of the pure functions below, and nowhere else:
///
/// | from       | event                                   | to                          | function |
/// |------------|-----------------------------------------|-----------------------------|----------|
/// | `None`     | retaining admission                     | `InFlight{holders: 1}` (new window) | [`Reservation::admit`] |
/// | `InFlight` | retaining admission (overlapping retry) | `InFlight{holders + 1}`     | [`Reservation::admit`] |
/// | `Grace`    | retaining admission before `until`      | `InFlight{holders: 1}` (same window) | [`Reservation::admit`] |
/// | `Grace`    | retaining admission at or after `until` | `InFlight{holders: 1}` (new window; the old one counts as expired) | [`Reservation::admit`] |
/// | `InFlight` | release of a retaining lease, holders>1 | `InFlight{holders - 1}`     | [`Reservation::release`] |
/// | `InFlight` | release of the last retaining lease     | `Grace{until: now + grace}` (`None` if grace is 0) | [`Reservation::release`] |
/// | any        | release of a lease of another window    | unchanged                   | [`Reservation::release`] |
/// | `Grace`    | purge at or after `until`               | `None` (counts as expired)  | [`Reservation::expire`] |
/// | `Grace`    | purge before `until` (window renewed)   | unchanged, look again at `until` | [`Reservation::expire`] |
/// | any        | `finish_session`                        | `None`                      | [`Reservation::finish`] |
///
/// `id` names one window; a lease remembers the window it holds, so a lease
/// released after `finish_session` cannot bring a finished window back.
/// The functions only compute: gauges, timers and counters are the
/// caller's (`reference::Table`), driven by what they return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reservation {
    None,
    InFlight { holders: u32, id: u64 },
    Grace { until: u64, id: u64 },
}

/// The outcome of a retaining admission ([`Reservation::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admitted {
    pub(crate) next: Reservation,
    /// The window the new lease holds.
    pub(crate) window: u64,
    /// A grace window that was over (ending at this time) but not purged
    /// yet: it ended by expiry and is counted as such.
    pub(crate) expired: Option<u64>,
}

/// The outcome of a purge looking at a record ([`Reservation::expire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// The grace window ending at `until` is over: the reservation is `None`.
    Expired { until: u64 },
    /// The window was renewed after the entry was armed: look again at `until`.
    NotYet { until: u64 },
    /// No grace window: nothing to expire.
    NoWindow,
}

impl Reservation {
    /// Whether the session owns the reservation at `now`.
    pub(crate) fn held_at(self, now: u64) -> bool {
        match self {
            Reservation::None => false,
            Reservation::InFlight { .. } => true,
            // A window ending at `until` is over at `until` (the reference purges `expiry <= now`).
            Reservation::Grace { until, .. } => now < until,
        }
    }

    /// A retaining admission at `now`. `fresh` names a new window, and is
    /// called only when one is opened.
    pub(crate) fn admit(self, now: u64, fresh: impl FnOnce() -> u64) -> Admitted {
        let (holders, window, expired) = match self {
            Reservation::InFlight { holders, id } => (holders.saturating_add(1), id, None),
            // Renewing a live window keeps its identity.
            Reservation::Grace { until, id } if now < until => (1, id, None),
            Reservation::Grace { until, .. } => (1, fresh(), Some(until)),
            Reservation::None => (1, fresh(), None),
        };
        Admitted {
            next: Reservation::InFlight {
                holders,
                id: window,
            },
            window,
            expired,
        }
    }

    /// The release at `now` of a retaining lease that holds `window`.
    pub(crate) fn release(self, window: u64, now: u64, grace_ns: u64) -> Reservation {
        match self {
            Reservation::InFlight { holders, id } if id == window => {
                if holders > 1 {
                    Reservation::InFlight {
                        holders: holders - 1,
                        id,
                    }
                } else if grace_ns == 0 {
                    Reservation::None
                } else {
                    Reservation::Grace {
                        until: now.saturating_add(grace_ns),
                        id,
                    }
                }
            }
            // A lease of a window that is over (finished, or finished and
            // reopened) changes nothing.
            other => other,
        }
    }

    /// A purge at `now` looking at this reservation.
    pub(crate) fn expire(self, now: u64) -> Expiry {
        match self {
            Reservation::Grace { until, .. } if until <= now => Expiry::Expired { until },
            Reservation::Grace { until, .. } => Expiry::NotYet { until },
            Reservation::None | Reservation::InFlight { .. } => Expiry::NoWindow,
        }
    }

    /// `finish_session`: whatever the window was, it is over.
    pub(crate) fn finish(self) -> Reservation {
        Reservation::None
    }
}

/// Per-session counters, reported by `session_stats`.
///
/// Counts are `u32` and saturate (see [`bump`]): a session does not come
/// near four billion attempts, and the narrow fields are part of what keeps
/// a tracked session under 256 bytes (benches/README.md, memory). The wait
/// total stays in `u64` nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SessionCounters {
    pub(crate) attempts: u32,
    pub(crate) admissions: u32,
    pub(crate) preempted: u32,
    pub(crate) waits: u32,
    pub(crate) timed_out: u32,
    pub(crate) cancelled: u32,
    pub(crate) wait_ns: u64,
}

/// Adds one to a per-session count, saturating at `u32::MAX`.
pub(crate) fn bump(count: &mut u32) {
    *count = count.saturating_add(1);
}

/// One tracked session. Its size is the table's cost per session; keep new
/// fields narrow (`tests::record_stays_small`).
#[derive(Debug)]
pub(crate) struct SessionRecord {
    pub(crate) key: SessionKey,
    /// The attempt currently competing for admission (probing or waiting);
    /// only the newest attempt begun can be here, so an older one is never
    /// admitted.
    pub(crate) pending: Option<Arc<Waiter>>,
    pub(crate) active_leases: u32,
    pub(crate) reservation: Reservation,
    /// Set by `finish_session` while leases or an attempt still exist; the
    /// record is dropped as soon as it becomes idle.
    pub(crate) finished: bool,
    /// Deadline of this record's live entry in the grace queue, or [`NEVER`].
    pub(crate) grace_timer: u64,
    /// Deadline of this record's live entry in the retire queue, or [`NEVER`].
    pub(crate) retire_timer: u64,
    pub(crate) counters: SessionCounters,
    /// Prompt length of the newest admitted attempt (saturating) and when the
    /// session was last active: what a footprint-aware pressure signal needs.
    pub(crate) last_admitted_prompt_len: u32,
    pub(crate) last_activity: u64,
    /// When the last grace window ran out: idleness (and so retention)
    /// starts at the later of this and `last_activity`.
    pub(crate) window_ended: u64,
}

impl SessionRecord {
    fn new(key: SessionKey, now: u64) -> Self {
        Self {
            key,
            pending: None,
            active_leases: 0,
            reservation: Reservation::None,
            finished: false,
            grace_timer: NEVER,
            retire_timer: NEVER,
            counters: SessionCounters::default(),
            last_admitted_prompt_len: 0,
            last_activity: now,
            window_ended: 0,
        }
    }

    /// No lease, no competing attempt, no reservation: nothing to protect.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_none() && self.active_leases == 0 && self.reservation == Reservation::None
    }
}

/// The map half of a shard, guarded by the shard lock.
///
/// A `HashTable` rather than a `HashMap`: the id is hashed once, when an
/// attempt begins (or a host call names a session), and every later lookup
/// of the same session (admission, release, settle, timers) reuses the hash
/// carried in its [`SessionKey`]. With a `HashMap` each lookup would re-run
/// SipHash over the id, seven times per open-path acquire + release, most
/// of the core's cost. The record holds its own key, so the map stores no
/// second copy of it (16 bytes per session).
#[derive(Debug, Default)]
pub(crate) struct ShardMap {
    pub(crate) sessions: HashTable<SessionRecord>,
    /// Source of attempt, lease and window ids minted in this shard.
    pub(crate) ids: IdMint,
}

/// Mints ids unique across the gate without a shared counter: a per-shard
/// sequence number with the shard index in the low bits. Ids of one session
/// (always in one shard) grow over time.
#[derive(Debug, Default)]
pub(crate) struct IdMint {
    next_seq: u64,
}

impl IdMint {
    pub(crate) fn mint(&mut self, shard_index: usize, shard_bits: u32) -> u64 {
        self.next_seq += 1;
        (self.next_seq << shard_bits) | shard_index as u64
    }
}

/// Whether `record` is the session `bytes` whose hash is `hash` (the full
/// hash is compared first: it is at hand and settles most mismatches).
fn is_session(record: &SessionRecord, hash: u64, bytes: &[u8]) -> bool {
    record.key.hash == hash && *record.key.bytes == *bytes
}

impl ShardMap {
    /// The record `key` was cloned from, if it is still tracked.
    pub(crate) fn get_mut(&mut self, key: &SessionKey) -> Option<&mut SessionRecord> {
        self.sessions.find_mut(key.hash, |r| r.key.same_record(key))
    }

    /// The record `key` was cloned from, in `sessions` (a field of a
    /// `ShardMap` borrowed apart from its `ids`).
    pub(crate) fn own_record<'a>(
        sessions: &'a mut HashTable<SessionRecord>,
        key: &SessionKey,
    ) -> Option<&'a mut SessionRecord> {
        sessions.find_mut(key.hash, |r| r.key.same_record(key))
    }

    /// The record of session `bytes`, whose hash (by [`SessionTable::hash`]) is `hash`.
    pub(crate) fn find_mut(&mut self, hash: u64, bytes: &[u8]) -> Option<&mut SessionRecord> {
        self.sessions.find_mut(hash, |r| is_session(r, hash, bytes))
    }

    /// A record whose id hashes to `hash` and that satisfies `pick` (timer
    /// entries name their record by hash and deadline only).
    pub(crate) fn find_by_hash(
        &mut self,
        hash: u64,
        mut pick: impl FnMut(&SessionRecord) -> bool,
    ) -> Option<&mut SessionRecord> {
        self.sessions
            .find_mut(hash, |r| r.key.hash == hash && pick(r))
    }

    /// Drops the record of `key`, if any, and gives memory back once the
    /// table is mostly empty (see [`sparse`]).
    pub(crate) fn remove(&mut self, key: &SessionKey) -> Option<SessionRecord> {
        let entry = self
            .sessions
            .find_entry(key.hash, |r| r.key.same_record(key));
        let removed = entry.ok().map(|e| e.remove().0);
        if let Some(keep) = sparse(self.sessions.len(), self.sessions.capacity()) {
            self.sessions.shrink_to(keep, |r| r.key.hash);
        }
        removed
    }

    /// Returns the record for `bytes`, creating it (and counting it) if new.
    /// One probe of the table either way; only a new session allocates.
    pub(crate) fn get_or_insert(
        &mut self,
        bytes: &[u8],
        hash: u64,
        now: u64,
        counters: &ShardCounters,
    ) -> &mut SessionRecord {
        let entry = self.sessions.entry(
            hash,
            |r| is_session(r, hash, bytes),
            |r| r.key.hash, // rehashing on growth reuses the stored hashes
        );
        match entry {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => {
                let key = SessionKey {
                    hash,
                    bytes: StdArc::from(bytes),
                };
                counters.tracked_sessions.add_locked(1);
                v.insert(SessionRecord::new(key, now)).into_mut()
            }
        }
    }
}

/// One lock-sharded slice of the session table with its own counters.
#[derive(Debug)]
pub(crate) struct Shard {
    map: Mutex<ShardMap>,
    pub(crate) counters: ShardCounters,
}

impl Shard {
    pub(crate) fn lock(&self) -> MutexGuard<'_, ShardMap> {
        self.map.lock()
    }
}

/// The whole table: a power-of-two number of shards.
#[derive(Debug)]
pub(crate) struct SessionTable {
    hasher: TableHasher,
    shards: Box<[CachePadded<Shard>]>,
    shard_bits: u32,
}

impl SessionTable {
    pub(crate) fn new(shard_bits: u32) -> Self {
        let shards = (0..1usize << shard_bits)
            .map(|_| {
                CachePadded::new(Shard {
                    map: Mutex::new(ShardMap::default()),
                    counters: ShardCounters::default(),
                })
            })
            .collect();
        Self {
            hasher: TableHasher::default(),
            shards,
            shard_bits,
        }
    }

    pub(crate) fn hash(&self, bytes: &[u8]) -> u64 {
        self.hasher.hash_one(bytes)
    }

    pub(crate) fn shard_index(&self, hash: u64) -> usize {
        // High bits: HashMap uses the low ones inside the shard.
        if self.shard_bits == 0 {
            0
        } else {
            (hash >> (64 - self.shard_bits)) as usize
        }
    }

    pub(crate) fn shard(&self, index: usize) -> &Shard {
        &self.shards[index]
    }

    pub(crate) fn shard_bits(&self) -> u32 {
        self.shard_bits
    }

    pub(crate) fn shards(&self) -> impl Iterator<Item = &Shard> {
        self.shards.iter().map(|s| &**s)
    }
}

/// A record's figures as reported at `now`.
pub(crate) fn session_stats_of(r: &SessionRecord, now: u64) -> SessionStats {
    let reservation = match r.reservation {
        // Expired but not yet purged (purges are batched): already over.
        Reservation::Grace { until, .. } if until <= now => ReservationState::None,
        Reservation::None => ReservationState::None,
        Reservation::InFlight { holders, .. } => ReservationState::InFlight { leases: holders },
        Reservation::Grace { until, .. } => ReservationState::Grace {
            remaining: Duration::from_nanos(until - now),
        },
    };
    SessionStats {
        num_preempted: r.counters.preempted.into(),
        attempts: r.counters.attempts.into(),
        admissions: r.counters.admissions.into(),
        waits: r.counters.waits.into(),
        wait_time: Duration::from_nanos(r.counters.wait_ns),
        timed_out: r.counters.timed_out.into(),
        cancelled: r.counters.cancelled.into(),
        active_leases: r.active_leases,
        attempt_pending: r.pending.is_some(),
        reservation,
        last_admitted_prompt_len: r.last_admitted_prompt_len as usize,
        idle_for: Duration::from_nanos(now.saturating_sub(r.last_activity)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table holds records inline, so a record's size is most of what a
    /// tracked session costs (benches/README.md has the full breakdown).
    #[test]
    fn record_stays_small() {
        let size = std::mem::size_of::<SessionRecord>();
        assert!(size <= 136, "SessionRecord grew to {size} bytes");
    }

    const GRACE: u64 = 60;

    fn fresh() -> u64 {
        99
    }

    fn no_fresh_window() -> u64 {
        panic!("this row keeps its window")
    }

    // One test per row of the state table, in its order.

    #[test]
    fn admit_from_none_opens_a_new_window() {
        let a = Reservation::None.admit(5, fresh);
        assert_eq!(a.next, Reservation::InFlight { holders: 1, id: 99 });
        assert_eq!((a.window, a.expired), (99, None));
    }

    #[test]
    fn admit_in_flight_adds_a_holder_to_the_same_window() {
        let a = Reservation::InFlight { holders: 2, id: 7 }.admit(5, no_fresh_window);
        assert_eq!(a.next, Reservation::InFlight { holders: 3, id: 7 });
        assert_eq!((a.window, a.expired), (7, None));
    }

    #[test]
    fn admit_in_grace_before_its_end_renews_the_same_window() {
        let a = Reservation::Grace { until: 10, id: 7 }.admit(9, no_fresh_window);
        assert_eq!(a.next, Reservation::InFlight { holders: 1, id: 7 });
        assert_eq!((a.window, a.expired), (7, None));
    }

    #[test]
    fn admit_at_the_end_of_grace_counts_the_expiry_and_opens_a_new_window() {
        let a = Reservation::Grace { until: 10, id: 7 }.admit(10, fresh);
        assert_eq!(a.next, Reservation::InFlight { holders: 1, id: 99 });
        assert_eq!((a.window, a.expired), (99, Some(10)));
    }

    #[test]
    fn release_of_one_of_several_holders_keeps_the_window_in_flight() {
        let r = Reservation::InFlight { holders: 2, id: 7 };
        assert_eq!(
            r.release(7, 5, GRACE),
            Reservation::InFlight { holders: 1, id: 7 }
        );
    }

    #[test]
    fn release_of_the_last_holder_starts_grace_or_ends_without_one() {
        let r = Reservation::InFlight { holders: 1, id: 7 };
        assert_eq!(
            r.release(7, 5, GRACE),
            Reservation::Grace { until: 65, id: 7 }
        );
        assert_eq!(r.release(7, 5, 0), Reservation::None);
        assert_eq!(
            r.release(7, u64::MAX - 1, GRACE),
            Reservation::Grace {
                until: u64::MAX,
                id: 7
            },
            "saturates"
        );
    }

    #[test]
    fn release_of_another_window_changes_nothing() {
        for r in [
            Reservation::None,
            Reservation::InFlight { holders: 1, id: 8 },
            Reservation::Grace { until: 65, id: 7 },
        ] {
            assert_eq!(r.release(7, 5, GRACE), r, "{r:?}");
        }
    }

    #[test]
    fn expire_at_or_after_the_end_of_grace_ends_the_window() {
        let r = Reservation::Grace { until: 10, id: 7 };
        assert_eq!(r.expire(10), Expiry::Expired { until: 10 });
        assert_eq!(r.expire(11), Expiry::Expired { until: 10 });
    }

    #[test]
    fn expire_before_the_end_of_grace_looks_again_then() {
        let r = Reservation::Grace { until: 10, id: 7 };
        assert_eq!(r.expire(9), Expiry::NotYet { until: 10 });
        assert_eq!(Reservation::None.expire(9), Expiry::NoWindow);
        assert_eq!(
            Reservation::InFlight { holders: 1, id: 7 }.expire(99),
            Expiry::NoWindow
        );
    }

    #[test]
    fn finish_ends_any_window() {
        for r in [
            Reservation::None,
            Reservation::InFlight { holders: 2, id: 8 },
            Reservation::Grace { until: 65, id: 7 },
        ] {
            assert_eq!(r.finish(), Reservation::None, "{r:?}");
        }
    }

    #[test]
    fn a_window_is_held_until_its_end() {
        assert!(!Reservation::None.held_at(0));
        assert!(Reservation::InFlight { holders: 1, id: 7 }.held_at(u64::MAX));
        assert!(Reservation::Grace { until: 10, id: 7 }.held_at(9));
        assert!(!Reservation::Grace { until: 10, id: 7 }.held_at(10));
    }

    #[test]
    fn counts_saturate() {
        let mut c = u32::MAX - 1;
        bump(&mut c);
        bump(&mut c);
        assert_eq!(c, u32::MAX);
    }
}
