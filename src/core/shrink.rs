//! When a table or queue gives memory back.

/// The capacity to shrink a table or queue of `len` entries to, if its
/// `capacity` has become more than four times what it holds.
///
/// Why: neither hash tables nor heaps give memory back by themselves, so
/// after a burst of sessions has finished or retired the gate would keep
/// what they used (benches/memory.rs measures it). Shrinking to twice the
/// length when a quarter is used keeps the cost amortised (the next shrink
/// needs half the entries gone again) and an empty table frees everything.
pub(crate) fn sparse(len: usize, capacity: usize) -> Option<usize> {
    (len * 4 < capacity).then_some(len * 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_tables_shrink_to_twice_their_length() {
        assert_eq!(sparse(0, 3), Some(0)); // empty: free it all
        assert_eq!(sparse(0, 0), None); // nothing to free
        assert_eq!(sparse(10, 40), None);
        assert_eq!(sparse(9, 40), Some(18));
    }
}
