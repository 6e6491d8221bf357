//! The prefixes sessions share, at every depth: a system prompt all
//! sessions begin with, a task the samples of one GRPO group share after
//! it, a parent's history a sub-agent begins with. The engine caches each
//! such prefix once, so the working set counts it once, while any member
//! uses it.
//!
//! A radix tree over the prompts' sketches (module `prompt`): a node is a
//! prefix that two or more sessions' prompts began with when the later of
//! them first asked; its parent is the longest shorter one. A session hangs
//! from the deepest node its prompt begins with, and what lies beyond that
//! node is its own. A node's **segment** (its tokens beyond its parent's)
//! is counted while a member hangs from it or below it; with the members'
//! own tokens that is exactly what their prompts hold in the cache, each
//! shared block once:
//!
//! ```text
//!   system prompt (2k) ── task A (6k) ── a1 own, a2 own, ... a16 own
//!                      └─ task B (9k) ── b1 own, ...
//!                      └─ c own (a session alone with its task)
//! ```
//!
//! The first sample of a group asks alone: nothing shares its task yet, so
//! the task is its own. When the second asks, the task becomes a node and
//! the first sample's own tokens shrink by it: the sum is unchanged, and
//! the task is never counted twice, nor dropped while a sample that uses it
//! is a member (the count of a prefix with the session that first sent it,
//! which lost the prefix when that session left, is what this replaces).
//!
//! A sketch agrees with another only up to its last agreeing sample, so a
//! node's depth is known from below, within one sample stride of the
//! truth; a first turn's cached tokens, which the engine measured, raise it
//! as far as the first sample that differs allows. Depths are whole blocks:
//! the engine shares no partial block.

use slab::Slab;

use crate::core::prompt::PromptSketch;

/// A node's index in the tree: stable while the node lives.
pub(super) type NodeId = usize;

#[derive(Debug)]
struct Node {
    /// The prefix's length from the prompt's first token, whole blocks.
    depth: u64,
    /// How far the prefix may reach: the sketches that made the node
    /// differ at a sample that ends here.
    reach: u64,
    parent: Option<NodeId>,
    /// Sessions that hang from this node.
    sessions: u32,
    /// Nodes whose parent this is.
    children: u32,
    /// Members hanging from this node or below it: the segment is counted
    /// while this is above 0.
    members_below: u32,
}

/// The tree, and the segments it counts now.
#[derive(Debug, Default)]
pub(super) struct PrefixTree {
    nodes: Slab<Node>,
    /// The segments of the nodes with members below them, summed.
    counted: u64,
}

/// Where a session's prompt meets the tree: the best match among the
/// sessions known, what they share, and how far that may reach.
#[derive(Debug, Clone, Copy)]
pub(super) struct Match {
    /// The node the other session hangs from.
    pub(super) node: Option<NodeId>,
    /// The tokens both prompts surely begin with.
    pub(super) shared: u64,
    /// The most the two may share: up to the first differing sample.
    pub(super) reach: u64,
}

/// What hanging a session in the tree did to another session: it moved
/// from one node to a deeper one (its own tokens shrink by the difference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Moved {
    pub(super) from: Option<NodeId>,
    pub(super) to: NodeId,
}

impl PrefixTree {
    /// The segments counted now, tokens.
    pub(super) fn counted(&self) -> u64 {
        self.counted
    }

    /// The depth of `node` (0: hanging from no node).
    pub(super) fn depth(&self, node: Option<NodeId>) -> u64 {
        node.map_or(0, |n| self.nodes[n].depth)
    }

    /// How many nodes the tree has (for audits and tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The segment of `n`: its tokens beyond its parent's.
    fn segment(&self, n: NodeId) -> u64 {
        let node = &self.nodes[n];
        node.depth - self.depth(node.parent)
    }

    /// Hangs a new session in the tree at the prefix it shares with
    /// `with` (another session, hanging from `with.node`), whole blocks of
    /// `block` tokens. Returns the node it hangs from, and the other
    /// session's move if the shared prefix is deeper than its node (then
    /// the new node sits between them: the other session is the only one
    /// that reached it before).
    pub(super) fn hang(&mut self, with: Match, block: u64) -> (Option<NodeId>, Option<Moved>) {
        let block = block.max(1);
        let shared = with.shared / block * block;
        if shared == 0 {
            return (None, None);
        }
        // The deepest node on the other session's path no deeper than
        // what is shared, and the one below it on that path.
        let mut below = None;
        let mut at = with.node;
        while let Some(n) = at {
            if self.nodes[n].depth <= shared {
                break;
            }
            below = Some(n);
            at = self.nodes[n].parent;
        }
        if let Some(n) = at.filter(|&n| self.nodes[n].depth == shared) {
            self.nodes[n].sessions += 1;
            return (Some(n), None);
        }
        // A new node at `shared` between `at` and `below` (or, where the
        // other session hung from `at` itself, between `at` and it).
        let members_below = below.map_or(0, |b| self.nodes[b].members_below);
        let new = self.nodes.insert(Node {
            depth: shared,
            reach: with.reach.max(shared),
            parent: at,
            sessions: 1,
            children: 0,
            members_below,
        });
        if let Some(p) = at {
            self.nodes[p].children += 1;
        }
        match below {
            Some(b) => {
                // The path through `b` now passes `new`: the segments
                // counted there split, the sum stays.
                self.nodes[b].parent = Some(new);
                self.nodes[new].children += 1;
                if let Some(p) = at {
                    self.nodes[p].children -= 1;
                }
                (Some(new), None)
            }
            None => {
                // The other session hung from `at`; it moves down.
                if let Some(p) = at {
                    self.nodes[p].sessions -= 1;
                }
                self.nodes[new].sessions += 1;
                (Some(new), Some(Moved { from: at, to: new }))
            }
        }
    }

    /// The segments on `node`'s path that no member is below: what a
    /// session hanging there adds to the count by joining, beyond its own.
    pub(super) fn uncounted_on_path(&self, node: Option<NodeId>) -> u64 {
        let mut sum = 0;
        let mut at = node;
        while let Some(n) = at {
            if self.nodes[n].members_below > 0 {
                break;
            }
            sum += self.segment(n);
            at = self.nodes[n].parent;
        }
        sum
    }

    /// A member hanging from `node` joined: the segments on its path that
    /// had no member below them are counted.
    pub(super) fn member_joined(&mut self, node: Option<NodeId>) {
        let mut at = node;
        while let Some(n) = at {
            self.nodes[n].members_below += 1;
            if self.nodes[n].members_below == 1 {
                self.counted += self.segment(n);
            }
            at = self.nodes[n].parent;
        }
    }

    /// A member hanging from `node` left: the segments on its path that no
    /// member is below any more are no longer counted.
    pub(super) fn member_left(&mut self, node: Option<NodeId>) {
        let mut at = node;
        while let Some(n) = at {
            self.nodes[n].members_below -= 1;
            if self.nodes[n].members_below == 0 {
                self.counted -= self.segment(n);
            }
            at = self.nodes[n].parent;
        }
    }

    /// A member moved from `from` to `to`, a node below it: the segments
    /// between them now have it below them too.
    pub(super) fn member_moved_down(&mut self, m: Moved) {
        let mut at = Some(m.to);
        while at != m.from {
            let Some(n) = at else {
                unreachable!("a move goes down the tree");
            };
            self.nodes[n].members_below += 1;
            if self.nodes[n].members_below == 1 {
                self.counted += self.segment(n);
            }
            at = self.nodes[n].parent;
        }
    }

    /// A session hanging from `node` (not a member now) is gone: nodes
    /// nobody hangs from and nothing branches from are removed, upwards.
    pub(super) fn unhang(&mut self, node: Option<NodeId>) {
        let Some(n) = node else {
            return;
        };
        self.nodes[n].sessions -= 1;
        let mut at = Some(n);
        while let Some(n) = at {
            let node = &self.nodes[n];
            if node.sessions > 0 || node.children > 0 {
                return;
            }
            debug_assert_eq!(node.members_below, 0, "no member hangs below");
            let parent = node.parent;
            self.nodes.remove(n);
            if let Some(p) = parent {
                self.nodes[p].children -= 1;
            }
            at = parent;
        }
    }

    /// What a first turn's cached tokens say of the node its session hangs
    /// from: the engine served `cached` tokens, so the prefix reaches that
    /// far if the sketches allow it. Returns how many tokens deeper the
    /// node is now (its sessions' own tokens shrink by as many).
    pub(super) fn measured(&mut self, node: Option<NodeId>, cached: u64, block: u64) -> u64 {
        let Some(n) = node else {
            return 0;
        };
        let block = block.max(1);
        let node = &self.nodes[n];
        let deeper = cached.min(node.reach) / block * block;
        if deeper <= node.depth {
            return 0;
        }
        // Deeper than a child would cross it: the children's own depths
        // bound it too.
        let child_depth = self
            .nodes
            .iter()
            .filter(|(_, c)| c.parent == Some(n))
            .map(|(_, c)| c.depth)
            .min()
            .unwrap_or(u64::MAX);
        let deeper = deeper.min(child_depth.saturating_sub(block).max(node.depth));
        let grown = deeper - node.depth;
        if grown == 0 {
            return 0;
        }
        // Its segment grows and each child's shrinks by as much: the
        // counted sum moves only by the children that are not counted.
        let counted_here = self.nodes[n].members_below > 0;
        let counted_children = self
            .nodes
            .iter()
            .filter(|(_, c)| c.parent == Some(n) && c.members_below > 0)
            .count() as u64;
        if counted_here {
            self.counted += grown;
        }
        self.counted -= grown * counted_children;
        self.nodes[n].depth = deeper;
        grown
    }

    /// Checks the counted sum and the counts against the nodes, given
    /// every session that hangs in the tree: its node, and whether it is a
    /// member.
    pub(super) fn audit(&self, members_at: &[(Option<NodeId>, bool)]) -> Result<(), String> {
        let mut members_below = vec![0u32; self.nodes.capacity()];
        let mut sessions = vec![0u32; self.nodes.capacity()];
        for &(node, member) in members_at {
            if let Some(n) = node {
                sessions[n] += 1;
            }
            let mut at = node;
            while let Some(n) = at {
                members_below[n] += u32::from(member);
                at = self.nodes[n].parent;
            }
        }
        let mut counted = 0;
        for (n, node) in self.nodes.iter() {
            if node.members_below != members_below[n] || node.sessions != sessions[n] {
                return Err(format!(
                    "node {n}: {} members below, {} sessions; expected {}, {}",
                    node.members_below, node.sessions, members_below[n], sessions[n]
                ));
            }
            if let Some(p) = node.parent {
                if self.nodes[p].depth >= node.depth {
                    return Err(format!("node {n} is no deeper than its parent"));
                }
            }
            if node.members_below > 0 {
                counted += self.segment(n);
            }
        }
        if counted != self.counted {
            return Err(format!("counted {} != {counted}", self.counted));
        }
        Ok(())
    }
}

/// The best match for a prompt sketched `sketch` among `others` (each a
/// session, its node and its last sketch): the session whose prompt
/// surely begins like it for longest, and the match. Never the whole of
/// the new prompt: its last token is always computed.
pub(super) fn best_match<'a, S: Copy>(
    sketch: &PromptSketch,
    others: impl Iterator<Item = (S, Option<NodeId>, &'a PromptSketch)>,
) -> Option<(S, Match)> {
    let last = sketch.len().saturating_sub(1);
    let mut best: Option<(S, Match)> = None;
    for (session, node, other) in others {
        let (shared, reach) = sketch.sampled_common_prefix_bounds(other);
        let shared = shared.min(last);
        if shared > best.map_or(0, |(_, b)| b.shared) {
            let reach = reach.min(last);
            best = Some((
                session,
                Match {
                    node,
                    shared,
                    reach,
                },
            ));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(shared: u64, node: Option<NodeId>) -> Match {
        Match {
            node,
            shared,
            reach: shared,
        }
    }

    #[test]
    fn a_group_task_becomes_a_node_under_the_system_prompt() {
        let mut t = PrefixTree::default();
        // a1 and a2 share system (2,048) + task (6,000); b1 only the system.
        let (a2, moved) = t.hang(at(8048, None), 16);
        let a2 = a2.unwrap();
        assert_eq!(t.depth(Some(a2)), 8048 / 16 * 16);
        assert_eq!(
            moved,
            Some(Moved { from: None, to: a2 }),
            "a1 moves to the task"
        );
        let (b1, moved) = t.hang(at(2048, Some(a2)), 16);
        let sys = b1.unwrap();
        assert_eq!(
            moved, None,
            "a1 and a2 stay under the task, now below the system prompt"
        );
        assert_eq!(t.depth(Some(sys)), 2048);
        assert_eq!(t.nodes[a2].parent, Some(sys));
        // a1 is a member: the task's segment and the system prompt count.
        t.member_joined(Some(a2));
        assert_eq!(t.counted(), 8048 / 16 * 16);
        t.member_joined(Some(sys)); // b1 joins
        assert_eq!(t.counted(), 8048 / 16 * 16, "the system prompt once");
        t.member_left(Some(a2));
        assert_eq!(t.counted(), 2048, "only b1 is in: the task is not counted");
        t.audit(&[(Some(a2), false), (Some(a2), false), (Some(sys), true)])
            .unwrap();
        t.member_left(Some(sys));
        for n in [Some(a2), Some(a2), Some(sys)] {
            t.unhang(n);
        }
        assert_eq!(t.len(), 0);
        assert_eq!(t.counted(), 0);
    }

    #[test]
    fn a_member_moved_down_counts_the_new_segment() {
        let mut t = PrefixTree::default();
        // Two sessions share the system prompt; one of them is a member.
        let (sys, _) = t.hang(at(2048, None), 16);
        t.member_joined(sys);
        assert_eq!(t.counted(), 2048);
        // Its group-mate arrives: they share 6k more.
        let (task, moved) = t.hang(at(8192, sys), 16);
        let moved = moved.unwrap();
        assert_eq!(moved.from, sys);
        t.member_moved_down(moved);
        assert_eq!(t.counted(), 8192);
        t.audit(&[(task, true), (task, false)]).unwrap_err();
        t.audit(&[(task, true), (task, false), (sys, false)])
            .unwrap();
    }

    #[test]
    fn measured_cached_tokens_deepen_a_node_within_its_reach() {
        let mut t = PrefixTree::default();
        let with = Match {
            node: None,
            shared: 1537,
            reach: 2049,
        };
        let (n, _) = t.hang(with, 16);
        assert_eq!(t.depth(n), 1536);
        t.member_joined(n);
        assert_eq!(
            t.measured(n, 4000, 16),
            2048 - 1536,
            "no further than the reach"
        );
        assert_eq!(t.depth(n), 2048);
        assert_eq!(t.counted(), 2048);
        assert_eq!(t.measured(n, 1000, 16), 0, "never shallower");
    }
}
