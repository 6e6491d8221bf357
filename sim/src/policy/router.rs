//! Sticky least-loaded routing: a session lands on the replica with the
//! fewest sessions in flight (lowest index on ties) at its first turn and
//! stays there until it finishes, as verl's sticky `AsyncLLMServerManager`
//! does. Probes for a session go to its replica.
//!
//! The other placements of [`crate::simulation::Routing`] use the same
//! counts: `hash` places a session where a hash of its id says
//! ([`hash_replica`], [`Router::assign_to`]), as a session-affinity router
//! (a consistent hash of `X-Session-ID`) does; `least-loaded` places every
//! turn anew, so a session migrates whenever another replica has fewer;
//! `room` places a new session on the replica whose gate reports the most
//! free working-set tokens ([`Router::assign_by_room`]) and keeps it there;
//! `room-replace` places a new session the same way, an empty replica whose
//! gate cannot tell its room yet counting as the roomiest
//! ([`Router::assign_by_room_or_empty`]), and moves a session whose gate
//! refuses a later turn to the replica whose gate tells the most room for
//! its whole prompt ([`Router::replace`]); `sticky-replace` places a new
//! session on the fewest sessions among the replicas whose gate tells room
//! for it ([`Router::assign_by_count_where_room`]) and moves as
//! `room-replace` (the rule of the Python package's `kvgate.Placement`);
//! `sticky-resume` places a new session as `sticky-replace` does and moves
//! a waiting turn whose gate counts its cache gone (a new, parked or ghost
//! session) to the fewest sessions among the replicas with room for it
//! ([`Router::resume`]), the rule for new sessions; where it lands it stays.

/// Sessions in flight per replica.
#[derive(Debug, Clone)]
pub struct Router {
    in_flight: Vec<usize>,
    /// Replicas lost: nothing is placed on them again.
    lost: Vec<bool>,
    /// Per replica, the first prompts (tokens) of the sessions placed
    /// there by room that its gate has not admitted yet.
    unseen: Vec<u64>,
}

impl Router {
    /// A router over `replicas` replicas.
    pub fn new(replicas: usize) -> Self {
        assert!(replicas > 0);
        Self {
            in_flight: vec![0; replicas],
            lost: vec![false; replicas],
            unseen: vec![0; replicas],
        }
    }

    /// Takes `replica` out: no session is placed on it again.
    pub fn lose(&mut self, replica: usize) {
        self.lost[replica] = true;
        assert!(self.lost.contains(&false), "at least one replica left");
    }

    /// Whether `replica` was lost.
    pub fn is_lost(&self, replica: usize) -> bool {
        self.lost[replica]
    }

    /// Where a placement decided by id goes: `replica`, or if it was lost
    /// the next one left (a hash ring skips a dead node).
    pub fn alive_from(&self, replica: usize) -> usize {
        let n = self.lost.len();
        (0..n)
            .map(|i| (replica + i) % n)
            .find(|&r| !self.lost[r])
            .expect("at least one replica left")
    }

    /// Places a new session on the least-loaded replica.
    pub fn assign(&mut self) -> usize {
        self.assign_below(usize::MAX).expect("no limit")
    }

    /// Places a new session on the least-loaded replica if it has fewer than
    /// `limit` sessions in flight (the `cap-K` policy).
    pub fn assign_below(&mut self, limit: usize) -> Option<usize> {
        let (r, &n) = self
            .in_flight
            .iter()
            .enumerate()
            .filter(|&(i, _)| !self.lost[i])
            .min_by_key(|&(i, &n)| (n, i))
            .expect("at least one replica left");
        (n < limit).then(|| {
            self.in_flight[r] += 1;
            r
        })
    }

    /// Places a session on `replica` (a placement decided elsewhere).
    pub fn assign_to(&mut self, replica: usize) -> usize {
        self.in_flight[replica] += 1;
        replica
    }

    /// Places a new session on the replica with the most room, as each
    /// replica's gate reports it (`room[r]`: free working-set tokens, the
    /// `kvgate_working_set_free_tokens` gauge; `None` where the gate has no
    /// working set or does not know its capacity yet). A replica without
    /// the figure counts as full: a router cannot tell room it is not told
    /// of. Ties go to the replica with fewer sessions, then the lowest
    /// index. Where no replica tells its room, least-loaded.
    ///
    /// A gate counts a session once it admits it; until then the router
    /// counts the session's `prompt` tokens against that replica's room
    /// itself ([`Router::seen`]), or every session arriving in one burst
    /// would land on the replica that had the most room before the burst.
    pub fn assign_by_room(&mut self, room: &[Option<u64>], prompt: u64) -> usize {
        assert_eq!(room.len(), self.in_flight.len(), "one figure per replica");
        let told = |r: usize| room[r].filter(|_| !self.lost[r]);
        if (0..room.len()).all(|r| told(r).is_none()) {
            let r = self.assign();
            self.unseen[r] += prompt;
            return r;
        }
        let r = (0..room.len())
            .filter(|&r| !self.lost[r])
            .min_by_key(|&r| {
                let free = told(r).map_or(0, |f| f.saturating_sub(self.unseen[r]));
                (std::cmp::Reverse(free), self.in_flight[r], r)
            })
            .expect("at least one replica left");
        self.unseen[r] += prompt;
        self.assign_to(r)
    }

    /// As [`Router::assign_by_room`] (`room-replace`), but a replica whose
    /// gate tells no room and that holds no session counts as empty, the
    /// most room: a gate is told its engine's capacity only once a turn has
    /// asked, so otherwise a replica never asked is never chosen. A gate
    /// that tells no room while it holds sessions still counts as full.
    pub fn assign_by_room_or_empty(&mut self, room: &[Option<u64>], prompt: u64) -> usize {
        assert_eq!(room.len(), self.in_flight.len(), "one figure per replica");
        let room: Vec<Option<u64>> = room
            .iter()
            .enumerate()
            .map(|(r, &f)| match f {
                None if self.in_flight[r] == 0 => Some(u64::MAX),
                f => f,
            })
            .collect();
        self.assign_by_room(&room, prompt)
    }

    /// Places a new session on the replica with the fewest sessions among
    /// those that take it now (`sticky-replace`): whose gate tells room
    /// (`room[r]`, `None` where it cannot tell or a session waits to join)
    /// for `prompt` tokens beyond the first prompts placed there and not
    /// admitted yet, or that tell nothing and hold no session. Where none
    /// does, the fewest sessions of all, as `sticky`. Ties: the lowest index.
    pub fn assign_by_count_where_room(&mut self, room: &[Option<u64>], prompt: u64) -> usize {
        assert_eq!(room.len(), self.in_flight.len(), "one figure per replica");
        let takes = |r: usize| match room[r] {
            Some(free) => free.saturating_sub(self.unseen[r]) >= prompt,
            None => self.in_flight[r] == 0,
        };
        let r = (0..room.len())
            .filter(|&r| !self.lost[r] && takes(r))
            .min_by_key(|&r| (self.in_flight[r], r));
        let r = match r {
            Some(r) => self.assign_to(r),
            None => self.assign(),
        };
        self.unseen[r] += prompt;
        r
    }

    /// Where a session on `from` goes when `from`'s gate would make its
    /// turn of `prompt` tokens (its whole history) wait (`room-replace`,
    /// `sticky-replace`):
    /// the other live replica whose gate tells the most room less the first
    /// prompts placed there and not admitted yet, if that is `prompt` or
    /// more (`room[r]`: `None` where the gate cannot tell, or where a
    /// session waits to join). Ties: fewer sessions, then the lowest index.
    /// The move is counted: off `from`, onto the new replica with `prompt`
    /// not admitted yet. `None`: no replica has room, the session stays.
    pub fn replace(&mut self, from: usize, room: &[Option<u64>], prompt: u64) -> Option<usize> {
        assert_eq!(room.len(), self.in_flight.len(), "one figure per replica");
        let to = (0..room.len())
            .filter(|&r| r != from && !self.lost[r])
            .filter_map(|r| Some((r, room[r]?.saturating_sub(self.unseen[r]))))
            .filter(|&(_, free)| free >= prompt)
            .min_by_key(|&(r, free)| (std::cmp::Reverse(free), self.in_flight[r], r))
            .map(|(r, _)| r)?;
        self.release(from);
        self.unseen[to] += prompt;
        Some(self.assign_to(to))
    }

    /// Where a waiting turn of a session on `from` goes when `from`'s gate
    /// counts its cache gone (`sticky-resume`): by the rule for new
    /// sessions ([`Router::assign_by_count_where_room`]), the fewest
    /// sessions among the other live replicas whose gate tells room for
    /// `prompt` tokens (its whole history) beyond the first prompts placed
    /// there and not admitted yet; ties, the lowest index. The move is
    /// counted as [`Router::replace`] counts it. `None`: no other replica
    /// has room, the turn waits where it is.
    pub fn resume(&mut self, from: usize, room: &[Option<u64>], prompt: u64) -> Option<usize> {
        assert_eq!(room.len(), self.in_flight.len(), "one figure per replica");
        let to = (0..room.len())
            .filter(|&r| r != from && !self.lost[r])
            .filter(|&r| room[r].is_some_and(|f| f.saturating_sub(self.unseen[r]) >= prompt))
            .min_by_key(|&r| (self.in_flight[r], r))?;
        self.release(from);
        self.unseen[to] += prompt;
        Some(self.assign_to(to))
    }

    /// The gate of `replica` admitted a session placed there by room with
    /// a first prompt of `prompt` tokens (or it was lost): its own figure
    /// counts it from now.
    pub fn seen(&mut self, replica: usize, prompt: u64) {
        self.unseen[replica] = self.unseen[replica].saturating_sub(prompt);
    }

    /// A session on `replica` finished.
    pub fn release(&mut self, replica: usize) {
        self.in_flight[replica] -= 1;
    }

    /// Sessions in flight on `replica`.
    pub fn load(&self, replica: usize) -> usize {
        self.in_flight[replica]
    }
}

/// The replica a session-affinity router sends session `session` to: a
/// fixed hash of the id (SplitMix64's finalizer), modulo the replicas. The
/// same session always lands on the same replica, whatever the load.
pub fn hash_replica(session: usize, replicas: usize) -> usize {
    assert!(replicas > 0);
    let mut z = (session as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % replicas as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_placement_is_fixed_per_session_and_spreads() {
        let first: Vec<usize> = (0..512).map(|s| hash_replica(s, 8)).collect();
        let again: Vec<usize> = (0..512).map(|s| hash_replica(s, 8)).collect();
        assert_eq!(first, again);
        let mut per = [0usize; 8];
        for &r in &first {
            per[r] += 1;
        }
        // 64 each on average; a hash is not a balancer, but none starves
        assert!(per.iter().all(|&n| (32..=96).contains(&n)), "{per:?}");
        let mut r = Router::new(8);
        assert_eq!(r.assign_to(first[0]), first[0]);
        assert_eq!(r.load(first[0]), 1);
    }

    #[test]
    fn least_loaded_first_lowest_index_on_ties() {
        let mut r = Router::new(3);
        assert_eq!(
            (r.assign(), r.assign(), r.assign(), r.assign()),
            (0, 1, 2, 0)
        );
        r.release(1);
        assert_eq!(r.assign(), 1);
        assert_eq!((r.load(0), r.load(1), r.load(2)), (2, 1, 1));
    }

    #[test]
    fn room_places_a_new_session_where_the_gate_has_most_room() {
        let mut r = Router::new(3);
        assert_eq!(r.assign_by_room(&[Some(100), Some(500), Some(200)], 0), 1);
        // Ties: fewer sessions first (replica 1 now has one), then lowest index.
        assert_eq!(r.assign_by_room(&[Some(500), Some(500), Some(500)], 0), 0);
        assert_eq!(r.assign_by_room(&[Some(0), Some(0), Some(0)], 0), 2);
        assert_eq!((r.load(0), r.load(1), r.load(2)), (1, 1, 1));
    }

    #[test]
    fn sessions_not_yet_admitted_count_against_the_room() {
        let mut r = Router::new(2);
        let room = [Some(1000), Some(700)];
        // Replica 0 looks roomier until the gate has counted the first 400.
        assert_eq!(r.assign_by_room(&room, 400), 0);
        assert_eq!(r.assign_by_room(&room, 400), 1);
        assert_eq!(r.assign_by_room(&room, 400), 0);
        // Its gate admitted both: the gate's own figure (now 200) counts them.
        r.seen(0, 800);
        assert_eq!(r.assign_by_room(&[Some(200), Some(700)], 100), 1);
    }

    #[test]
    fn a_lost_replica_gets_nothing() {
        let mut r = Router::new(3);
        r.lose(1);
        assert!(r.is_lost(1));
        assert_eq!((r.assign(), r.assign(), r.assign()), (0, 2, 0));
        assert_eq!(r.assign_by_room(&[Some(1), Some(900), Some(0)], 0), 0);
        assert_eq!(r.assign_by_room(&[None, Some(900), None], 0), 2);
        assert_eq!((r.alive_from(1), r.alive_from(2)), (2, 2));
        assert_eq!(r.assign_below(2), None);
    }

    #[test]
    fn a_replica_that_tells_no_room_counts_as_full() {
        let mut r = Router::new(3);
        // Replica 0 has fewer sessions, but tells nothing: any room wins.
        r.assign_to(1);
        r.assign_to(2);
        assert_eq!(r.assign_by_room(&[None, Some(1), Some(0)], 0), 1);
        // Against a full replica it ties at no room: fewer sessions win.
        assert_eq!(r.assign_by_room(&[None, Some(0), Some(0)], 0), 0);
    }

    #[test]
    fn no_replica_telling_its_room_falls_back_to_least_loaded() {
        let mut r = Router::new(3);
        r.assign_to(0);
        assert_eq!(r.assign_by_room(&[None, None, None], 0), 1);
        assert_eq!(r.assign_by_room(&[None, None, None], 0), 2);
        assert_eq!(r.assign_by_room(&[None, None, None], 0), 0);
    }

    #[test]
    fn an_empty_replica_that_tells_no_room_yet_gets_the_next_session() {
        let mut r = Router::new(3);
        r.assign_to(0);
        // Replica 1 was never asked (no figure) and holds nothing: empty.
        assert_eq!(r.assign_by_room_or_empty(&[Some(900), None, None], 10), 1);
        // Replica 2 likewise; then replica 1 holds a session but still
        // tells nothing: full, so the one that tells room wins.
        assert_eq!(r.assign_by_room_or_empty(&[Some(900), None, None], 10), 2);
        assert_eq!(r.assign_by_room_or_empty(&[Some(900), None, None], 10), 0);
        // Nobody tells: fewest sessions, as sticky.
        assert_eq!(r.assign_by_room_or_empty(&[None, None, None], 10), 1);
        assert_eq!((r.load(0), r.load(1), r.load(2)), (2, 2, 1));
        // A lost replica is never the empty one.
        let mut r = Router::new(2);
        r.lose(0);
        assert_eq!(r.assign_by_room_or_empty(&[None, Some(5)], 10), 1);
    }

    #[test]
    fn a_new_session_goes_to_the_fewest_sessions_among_replicas_with_room() {
        let mut r = Router::new(3);
        r.assign_to(1);
        // Replica 0 tells too little room, 1 and 2 enough: 2 has fewer sessions.
        assert_eq!(
            r.assign_by_count_where_room(&[Some(50), Some(900), Some(900)], 100),
            2
        );
        // Its 100 tokens count against replica 2 until its gate admits them.
        assert_eq!(
            r.assign_by_count_where_room(&[Some(50), Some(900), Some(150)], 100),
            1
        );
        // A replica that tells nothing takes it only while it holds nothing.
        assert_eq!(
            r.assign_by_count_where_room(&[None, Some(0), Some(0)], 100),
            0
        );
        assert_eq!(
            r.assign_by_count_where_room(&[None, Some(0), Some(0)], 100),
            0
        );
        // No replica takes it: the fewest sessions of all, as sticky.
        assert_eq!((r.load(0), r.load(1), r.load(2)), (2, 2, 1));
        assert_eq!(
            r.assign_by_count_where_room(&[None, Some(0), Some(0)], 100),
            2
        );
        // A lost replica takes nothing.
        let mut r = Router::new(2);
        r.lose(0);
        assert_eq!(r.assign_by_count_where_room(&[None, Some(0)], 10), 1);
    }

    #[test]
    fn a_refused_session_moves_where_the_gate_tells_most_room() {
        let mut r = Router::new(4);
        for replica in [0, 0, 1, 2, 3] {
            r.assign_to(replica);
        }
        // Replica 0 refused a turn of 500 tokens: replica 2 has the most room.
        let room = [Some(0), Some(600), Some(800), None];
        assert_eq!(r.replace(0, &room, 500), Some(2));
        assert_eq!((r.load(0), r.load(2)), (1, 2));
        // Its 500 count against replica 2 until its gate admits them:
        // replica 1 (600) now has more room than replica 2 (300).
        assert_eq!(r.replace(0, &room, 500), Some(1));
        r.seen(2, 500);
        r.seen(1, 500);
        // Ties: fewer sessions (replica 3 holds one, replica 1 two).
        let room = [None, Some(700), Some(500), Some(700)];
        assert_eq!(r.replace(2, &room, 500), Some(3));
    }

    #[test]
    fn with_no_room_anywhere_a_refused_session_stays() {
        let mut r = Router::new(3);
        for replica in [0, 1, 2] {
            r.assign_to(replica);
        }
        // Room short of the whole prompt, a gate that cannot tell, the
        // refusing replica itself, a lost one: none takes it.
        assert_eq!(r.replace(0, &[Some(5000), Some(499), None], 500), None);
        r.lose(2);
        assert_eq!(r.replace(0, &[Some(5000), Some(0), Some(5000)], 500), None);
        // Room that the router's own unadmitted placements already fill.
        let mut r = Router::new(2);
        assert_eq!(r.assign_by_room(&[Some(0), Some(900)], 600), 1);
        assert_eq!(r.replace(0, &[None, Some(900)], 500), None);
        assert_eq!((r.load(0), r.load(1)), (0, 1));
    }

    #[test]
    fn a_resumed_turn_goes_to_the_fewest_sessions_among_replicas_with_room() {
        let mut r = Router::new(4);
        for replica in [0, 1, 1, 2, 2, 2, 3] {
            r.assign_to(replica);
        }
        // Replica 3 has the fewest sessions but too little room; 1 beats 2
        // (fewer sessions) though 2 tells more room; 0, emptied, has none.
        let room = [Some(0), Some(600), Some(900), Some(400)];
        assert_eq!(r.resume(0, &room, 500), Some(1));
        assert_eq!((r.load(0), r.load(1)), (0, 3));
        // Its 500 now count against replica 1: replica 2 takes the next.
        assert_eq!(r.resume(3, &room, 500), Some(2));
        // Room short of its prompt, a lost replica's room, one that cannot
        // tell, its own: the turn waits where it is, counted where it was.
        r.lose(2);
        assert_eq!(
            r.resume(1, &[Some(499), Some(9000), Some(9000), None], 500),
            None
        );
        assert_eq!(r.load(1), 3);
    }

    #[test]
    fn a_cap_refuses_when_every_replica_is_full() {
        let mut r = Router::new(2);
        assert_eq!(r.assign_below(1), Some(0));
        assert_eq!(r.assign_below(1), Some(1));
        assert_eq!(r.assign_below(1), None);
        r.release(0);
        assert_eq!(r.assign_below(1), Some(0));
    }
}
