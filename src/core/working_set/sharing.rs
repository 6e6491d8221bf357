//! The working set's side of the prefix tree (module `prefix_tree`): where
//! each session that passes its prompts' tokens hangs, and what its own
//! tokens are as the tree learns.

use std::hash::Hash;

use super::prefix_tree::{self, Moved, NodeId};
use super::types::Slot;
use super::WorkingSet;
use crate::core::prompt::PromptSketch;

impl<K: Eq + Hash + Clone> WorkingSet<K> {
    /// A turn of the session at `s` asks with a prompt sketched `sketch`:
    /// a session new to the tree hangs where its prompt meets the others';
    /// one whose prompt no longer begins with its node's prefix (it
    /// compacted its history) hangs again. The sketch is kept for
    /// newcomers to be matched with.
    pub(super) fn place_in_tree(&mut self, s: Slot, sketch: &PromptSketch) {
        self.shared.saw_prompt_tokens();
        let h = &self.sessions[s].history;
        let rehang = h.in_tree
            && h.sketch.as_ref().is_some_and(|last| {
                let depth = self.prefixes.depth(h.prefix);
                sketch.sampled_common_prefix_bounds(last).1 < depth
            });
        if !h.in_tree || rehang {
            let footprint = self.sessions[s].member().map(|m| m.footprint);
            let own_before = footprint.map(|f| self.own(s, f));
            if footprint.is_some() {
                self.prefixes.member_left(h.prefix);
            }
            self.unhang(s);
            self.hang(s, sketch);
            if let (Some(f), Some(before)) = (footprint, own_before) {
                self.prefixes.member_joined(self.sessions[s].history.prefix);
                self.own_sum = self.own_sum - before + self.own(s, f);
            }
        }
        match &mut self.sessions[s].history.sketch {
            Some(kept) => kept.clone_from(sketch),
            kept @ None => *kept = Some(sketch.clone()),
        }
    }

    /// Hangs the session at `s` (not in the tree) where its prompt meets
    /// the longest prefix another session's prompt began with.
    fn hang(&mut self, s: Slot, sketch: &PromptSketch) {
        let others = self.sessions.iter().filter(|&(o, _)| o != s);
        let found = prefix_tree::best_match(
            sketch,
            others.filter_map(|(o, r)| Some((o, r.history.prefix, r.history.sketch.as_ref()?))),
        );
        let block = self.capacity.block_tokens();
        let (node, moved) = match found {
            Some((other, with)) => {
                let (node, moved) = self.prefixes.hang(with, block);
                (node, moved.map(|m| (other, m)))
            }
            None => (None, None),
        };
        let h = &mut self.sessions[s].history;
        h.in_tree = true;
        h.prefix = node;
        h.shared_credit = self.prefixes.depth(node);
        if let Some((other, m)) = moved {
            self.move_down(other, m);
        }
    }

    /// The session at `o` now hangs from a deeper node: its own tokens
    /// shrink by the segments between, which count once from now on.
    fn move_down(&mut self, o: Slot, m: Moved) {
        self.sessions[o].history.prefix = Some(m.to);
        if self.sessions[o].member().is_some() {
            self.prefixes.member_moved_down(m);
        }
        self.set_credit(o, self.prefixes.depth(Some(m.to)));
    }

    /// The node at `node` is deeper now: the sessions hanging from it
    /// share more, and own less.
    pub(super) fn deepened(&mut self, node: Option<NodeId>) {
        let depth = self.prefixes.depth(node);
        let hanging: Vec<Slot> = self
            .sessions
            .iter()
            .filter(|(_, r)| r.history.in_tree && r.history.prefix == node)
            .map(|(s, _)| s)
            .collect();
        for s in hanging {
            self.set_credit(s, depth);
        }
    }

    /// The session at `s` shares `credit` tokens of its footprint now: a
    /// member's own tokens are counted anew.
    pub(super) fn set_credit(&mut self, s: Slot, credit: u64) {
        let footprint = self.sessions[s].member().map(|m| m.footprint);
        let own_before = footprint.map(|f| self.own(s, f));
        self.sessions[s].history.shared_credit = credit;
        if let (Some(f), Some(before)) = (footprint, own_before) {
            self.own_sum = self.own_sum - before + self.own(s, f);
        }
    }

    /// The prefix of the session at `s` that other sessions keep cached:
    /// what its return finds there if it was evicted alone.
    pub(super) fn prefix_of(&self, s: Slot) -> u64 {
        let h = &self.sessions[s].history;
        if h.in_tree {
            h.shared_credit
        } else {
            self.shared.tokens
        }
    }
}
