//! Per-turn token counts that keep first-insertion order, like the Python dicts they become.
use std::collections::HashMap;

/// Token counts keyed by turn. Iteration follows the order turns were first counted, so the
/// dict Python receives lists its keys as the reference's would. Zero counts are never stored.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    entries: Vec<(i64, usize)>,
    index: HashMap<i64, usize>,
}

impl Counts {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `n` tokens to `turn`; adding 0 leaves no trace.
    pub fn add(&mut self, turn: i64, n: usize) {
        if n == 0 {
            return;
        }
        match self.index.get(&turn) {
            Some(&slot) => self.entries[slot].1 += n,
            None => {
                self.index.insert(turn, self.entries.len());
                self.entries.push((turn, n));
            }
        }
    }

    /// Add every count of `other`.
    pub fn merge(&mut self, other: &Counts) {
        for (turn, n) in other.iter() {
            self.add(turn, n);
        }
    }

    /// The count of `turn`, 0 when it has none.
    pub fn get(&self, turn: i64) -> usize {
        self.index
            .get(&turn)
            .map_or(0, |&slot| self.entries[slot].1)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `(turn, count)` pairs in first-insertion order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (i64, usize)> + '_ {
        self.entries.iter().copied()
    }
}

/// Equal when they hold the same counts, in any order, as Python dicts compare.
impl PartialEq for Counts {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().all(|(turn, n)| other.get(turn) == n)
    }
}

impl Eq for Counts {}

impl FromIterator<(i64, usize)> for Counts {
    fn from_iter<I: IntoIterator<Item = (i64, usize)>>(pairs: I) -> Self {
        let mut counts = Counts::new();
        for (turn, n) in pairs {
            counts.add(turn, n);
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_up_and_keeps_first_insertion_order() {
        let mut counts = Counts::new();
        counts.add(7, 2);
        counts.add(3, 1);
        counts.add(7, 5);
        assert_eq!(counts.iter().collect::<Vec<_>>(), [(7, 7), (3, 1)]);
        assert_eq!(counts.get(7), 7);
        assert_eq!(counts.get(99), 0);
    }

    #[test]
    fn zero_counts_are_not_stored() {
        let mut counts = Counts::new();
        counts.add(1, 0);
        assert!(counts.is_empty());
    }

    #[test]
    fn merge_and_order_free_equality() {
        let mut a: Counts = [(1, 2), (2, 3)].into_iter().collect();
        a.merge(&[(2, 1), (5, 4)].into_iter().collect());
        let b: Counts = [(5, 4), (2, 4), (1, 2)].into_iter().collect();
        assert_eq!(a, b);
        assert_ne!(a, Counts::new());
    }
}
