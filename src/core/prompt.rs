//! What a gate can tell about a prompt without keeping it: a few of its
//! tokens at fixed positions, enough to say how far a session's next prompt
//! begins like its last one.
//!
//! The working set compares sessions' first prompts: how far they begin
//! alike is the prefix they share (a system prompt, tool definitions),
//! which a host whose engine reports no cached tokens cannot learn
//! otherwise.
//!
//! A sketch samples a pair of tokens at positions 0, 1, 3, 7, ..., 511
//! (dense at the start, where a changed system prompt or date would sit)
//! and every 512 tokens after: about 70 words for a 32k-token prompt, built
//! and compared in well under a microsecond, without hashing the whole
//! prompt on the open path. Two sketches agree up to the last sample before
//! the first that differs; an edit between two samples that shifts nothing
//! (same length, same tokens at the samples) goes unseen, and so does one
//! in the last 512 tokens: both cost at most a few percent of expected hits.

/// Samples below this position are at `2^k - 1`; from it on, every `STRIDE`.
const STRIDE: usize = 512;
/// How many samples sit below `STRIDE`: positions 0, 1, 3, ..., `STRIDE - 1`.
const DENSE: usize = STRIDE.trailing_zeros() as usize + 1;

/// A prompt's length and its tokens at fixed positions (see the module).
/// The working set keeps the sketch of each session's last prompt with
/// `clone_from`, which reuses the kept one's memory.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PromptSketch {
    len: u64,
    /// Two tokens from each sample position, as `hi << 32 | lo`.
    samples: Vec<u64>,
}

impl Clone for PromptSketch {
    fn clone(&self) -> Self {
        Self {
            len: self.len,
            samples: self.samples.clone(),
        }
    }

    fn clone_from(&mut self, source: &Self) {
        self.len = source.len;
        self.samples.clone_from(&source.samples);
    }
}

/// The `i`-th sample position.
fn position(i: usize) -> usize {
    if i < DENSE {
        (1 << i) - 1
    } else {
        STRIDE * (i - DENSE + 2) - 1
    }
}

/// How many sample positions a `len`-token prompt has (a position `p`
/// needs `p + 1 < len`: it samples a pair).
fn sample_count(len: usize) -> usize {
    if len < 2 {
        return 0;
    }
    // Dense positions 2^i - 1 <= len - 2, i < DENSE.
    let dense = ((usize::BITS - (len - 1).leading_zeros()) as usize).min(DENSE);
    // Strided positions STRIDE * (j + 2) - 1 <= len - 2.
    let strided = ((len - 1) / STRIDE).saturating_sub(1);
    dense + strided
}

impl PromptSketch {
    /// The sketch of a prompt given as token ids. One allocation of the
    /// exact size, not a vector grown (and copied) from an iterator of
    /// unknown length.
    pub fn of(tokens: &[u32]) -> Self {
        let mut sketch = Self {
            len: 0,
            samples: Vec::with_capacity(sample_count(tokens.len())),
        };
        sketch.refill(tokens);
        sketch
    }

    /// Makes this the sketch of `tokens`, reusing its memory: a driver
    /// that sketches one prompt after another (the blocking gate, per
    /// thread) allocates nothing once its prompts stop growing.
    ///
    /// The positions are walked, not computed one by one with `position`:
    /// each dense one is the one before doubled plus one, up to
    /// `STRIDE - 1`, after which both rules give `2 * STRIDE - 1`; each
    /// strided one is the one before plus `STRIDE`. The pair is read with
    /// one bounds check, which also ends the walk.
    pub fn refill(&mut self, tokens: &[u32]) {
        self.len = tokens.len() as u64;
        self.samples.clear();
        let mut p = 0;
        while let Some(&[hi, lo]) = tokens.get(p..p + 2) {
            self.samples.push((u64::from(hi) << 32) | u64::from(lo));
            p = if p < STRIDE { 2 * p + 1 } else { p + STRIDE };
        }
    }

    /// The prompt's length, tokens.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the prompt was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many tokens `self` and `other` begin with alike, as far as the
    /// samples tell: all of the shorter prompt if every sample both have
    /// agrees, else up to the last agreeing sample before the first that
    /// differs.
    ///
    /// A session that appends (the usual case) agrees on every sample the
    /// shorter prompt has: that is asked first, as one comparison of the
    /// two runs of samples, before any search for where they part.
    pub fn common_prefix(&self, other: &PromptSketch) -> u64 {
        let shared = self.samples.len().min(other.samples.len());
        if self.samples[..shared] == other.samples[..shared] {
            return self.len.min(other.len);
        }
        let first_difference = self
            .samples
            .iter()
            .zip(other.samples.iter())
            .position(|(a, b)| a != b);
        match first_difference {
            None => self.len.min(other.len),
            Some(0) => 0,
            // The pair at the last agreeing position agrees.
            Some(i) => position(i - 1) as u64 + 2,
        }
    }

    /// How many tokens `self` and `other` surely begin with alike: up to
    /// the last sample both have that agrees, before the first that
    /// differs. Unlike [`PromptSketch::common_prefix`], agreeing samples
    /// do not vouch for the unsampled tail: two sessions' prompts that
    /// share a system prompt part somewhere after its last sample, not at
    /// the end of the shorter one.
    pub fn sampled_common_prefix(&self, other: &PromptSketch) -> u64 {
        self.sampled_common_prefix_bounds(other).0
    }

    /// [`PromptSketch::sampled_common_prefix`], and the most the two
    /// prompts may begin with alike: up to the pair of the first sample
    /// that differs (one of its two tokens does), else the shorter prompt.
    pub fn sampled_common_prefix_bounds(&self, other: &PromptSketch) -> (u64, u64) {
        let agreeing = self
            .samples
            .iter()
            .zip(other.samples.iter())
            .take_while(|(a, b)| a == b)
            .count();
        let surely = match agreeing {
            0 => 0,
            i => position(i - 1) as u64 + 2,
        };
        let differs = agreeing < self.samples.len().min(other.samples.len());
        let most = if differs {
            position(agreeing) as u64 + 1
        } else {
            self.len.min(other.len)
        };
        (surely.min(most), most)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed) % 50_000)
            .collect()
    }

    #[test]
    fn the_sampled_common_prefix_ends_at_the_last_agreeing_sample() {
        // Two prompts sharing their first 2,048 tokens, then apart.
        let shared = tokens(2048, 1);
        let a: Vec<u32> = shared.iter().copied().chain(tokens(700, 2)).collect();
        let b: Vec<u32> = shared.iter().copied().chain(tokens(900, 3)).collect();
        let (a, b) = (PromptSketch::of(&a), PromptSketch::of(&b));
        // The sample at 2,047 pairs tokens 2,047 and 2,048: it differs; the
        // one at 1,535 is the last that agrees.
        assert_eq!(a.sampled_common_prefix(&b), 1537);
        assert_eq!(b.sampled_common_prefix(&a), 1537);
        // Alike wherever sampled, apart in the unsampled tail: only as far
        // as the samples go (common_prefix takes all the shorter one).
        // (1,600 tokens: the last sample pairs tokens 1,535 and 1,536.)
        let c: Vec<u32> = shared[..1540]
            .iter()
            .copied()
            .chain(tokens(60, 4))
            .collect();
        let d: Vec<u32> = shared[..1540]
            .iter()
            .copied()
            .chain(tokens(60, 5))
            .collect();
        let (c, d) = (PromptSketch::of(&c), PromptSketch::of(&d));
        assert_eq!(c.common_prefix(&d), 1600);
        assert_eq!(c.sampled_common_prefix(&d), 1537);
        // Apart from the first token: nothing.
        let e = PromptSketch::of(&tokens(3000, 6));
        assert_eq!(a.sampled_common_prefix(&e), 0);
        // The first differing sample pairs tokens 2,047 and 2,048: they may
        // share up to 2,048 tokens, surely 1,537.
        assert_eq!(a.sampled_common_prefix_bounds(&b), (1537, 2048));
        assert_eq!(c.sampled_common_prefix_bounds(&d), (1537, 1600));
        assert_eq!(a.sampled_common_prefix_bounds(&e), (0, 1));
        assert_eq!(PromptSketch::default().sampled_common_prefix(&a), 0);
    }

    #[test]
    fn positions_are_dense_at_the_start_then_every_stride() {
        let first: Vec<usize> = (0..13).map(position).collect();
        assert_eq!(
            first,
            [0, 1, 3, 7, 15, 31, 63, 127, 255, 511, 1023, 1535, 2047]
        );
    }

    #[test]
    fn the_sample_count_is_every_position_with_a_pair_inside_the_prompt() {
        for len in (0..5_000).chain([32_767, 32_768, 32_769, 100_000]) {
            let expected = (0..).map(position).take_while(|&p| p + 1 < len).count();
            assert_eq!(sample_count(len), expected, "len {len}");
        }
    }

    #[test]
    fn an_appended_prompt_shares_all_of_the_older_one() {
        let long = tokens(20_000, 1);
        let old = PromptSketch::of(&long[..15_000]);
        let new = PromptSketch::of(&long);
        assert_eq!(old.common_prefix(&new), 15_000);
        assert_eq!(new.common_prefix(&old), 15_000);
        assert_eq!(new.len(), 20_000);
    }

    #[test]
    fn a_rewrite_is_found_within_one_stride() {
        let old = tokens(20_000, 1);
        for at in [0usize, 2, 40, 600, 7_000, 12_345, 19_000] {
            let mut new = old[..at].to_vec();
            new.extend(tokens(9_000, 99));
            let shared = PromptSketch::of(&old).common_prefix(&PromptSketch::of(&new));
            assert!(shared <= at as u64, "rewrite at {at}: said {shared}");
            let slack = if at < STRIDE { at } else { STRIDE + 1 };
            assert!(
                shared + slack as u64 >= at as u64,
                "rewrite at {at}: said {shared}"
            );
        }
    }

    #[test]
    fn a_shorter_prompt_that_begins_alike_shares_its_length() {
        let old = tokens(30_000, 5);
        let compacted = PromptSketch::of(&old[..4_000]);
        assert_eq!(PromptSketch::of(&old).common_prefix(&compacted), 4_000);
    }

    #[test]
    fn a_refilled_sketch_is_the_sketch_of_its_new_prompt() {
        let mut sketch = PromptSketch::of(&tokens(9_000, 1));
        for len in [20_000, 3, 0, 700] {
            let prompt = tokens(len, 2);
            sketch.refill(&prompt);
            assert_eq!(sketch, PromptSketch::of(&prompt));
        }
    }

    #[test]
    fn the_walked_samples_are_the_pairs_at_each_position() {
        for len in (0..3_000).chain([32_767, 32_768, 32_769]) {
            let prompt = tokens(len, 3);
            let expected: Vec<u64> = (0..sample_count(len))
                .map(position)
                .map(|p| (u64::from(prompt[p]) << 32) | u64::from(prompt[p + 1]))
                .collect();
            assert_eq!(PromptSketch::of(&prompt).samples, expected, "len {len}");
        }
    }

    #[test]
    fn empty_and_one_token_prompts_have_no_samples() {
        let empty = PromptSketch::of(&[]);
        assert!(empty.is_empty());
        assert_eq!(empty.common_prefix(&PromptSketch::of(&[7])), 0);
        assert_eq!(
            PromptSketch::of(&[7]).common_prefix(&PromptSketch::of(&[7, 8])),
            1
        );
    }
}
