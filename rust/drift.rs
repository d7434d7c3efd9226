//! Drift classification: does an incoming prompt extend the held tokens, heal them, or fork?
use std::ops::Range;

use crate::error::Error;
use crate::prefix::common_prefix_len;

/// How an incoming prompt relates to the tokens a builder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriftKind {
    /// The prompt reproduces every held token.
    Clean,
    /// The prompt re-renders part of the latest output; the builder can heal it.
    Realign,
    /// The prompt departs from the held tokens too early or too much; start a new run.
    Fork,
}

impl DriftKind {
    pub const ALL: [DriftKind; 3] = [DriftKind::Clean, DriftKind::Realign, DriftKind::Fork];

    /// The name Python sees: "clean", "realign" or "fork".
    pub fn as_str(self) -> &'static str {
        match self {
            DriftKind::Clean => "clean",
            DriftKind::Realign => "realign",
            DriftKind::Fork => "fork",
        }
    }

    /// The kind named `name`, if any.
    pub fn parse(name: &str) -> Option<DriftKind> {
        DriftKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

/// A drift decision. `at` is the divergence point (the common-prefix length); `drifted` is how
/// many held tokens the prompt does not reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Drift {
    pub kind: DriftKind,
    pub at: usize,
    pub drifted: usize,
}

/// How a REALIGN is healed and what gates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Keep the latest output up to the divergence point; gate on how many tokens drifted.
    Minimal,
    /// Drop the whole latest output from training; gate on the incoming output's length.
    Slime,
}

impl Policy {
    pub const ALL: [Policy; 2] = [Policy::Minimal, Policy::Slime];

    /// Every policy's name, in the order Python lists them.
    pub const NAMES: [&'static str; 2] = [Policy::Minimal.as_str(), Policy::Slime.as_str()];

    /// The name Python sees; the one place the names are spelled.
    pub const fn as_str(self) -> &'static str {
        match self {
            Policy::Minimal => "minimal",
            Policy::Slime => "slime",
        }
    }

    /// The policy named `name`; an unknown name is an `Error::UnknownPolicy`.
    pub fn parse(name: &str) -> Result<Policy, Error> {
        Policy::ALL
            .into_iter()
            .find(|policy| policy.as_str() == name)
            .ok_or_else(|| Error::UnknownPolicy {
                shown: format!("'{name}'"),
                allowed: &Policy::NAMES,
            })
    }
}

/// Classify `prompt` against the `held` tokens, whose latest output occupies `latest`.
///
/// CLEAN when the prompt starts with every held token. Otherwise REALIGN only when there is a
/// non-empty latest output, the prompt reproduces everything before it, the threshold is not 0
/// and the policy's gate (drifted tokens for minimal, `output_len` for slime) stays under the
/// threshold; FORK in every other case.
pub fn classify(
    held: &[u32],
    latest: Option<Range<usize>>,
    prompt: &[u32],
    output_len: usize,
    policy: Policy,
    fork_threshold: usize,
) -> Drift {
    classify_from(held, latest, prompt, output_len, policy, fork_threshold, 0)
}

/// `classify` for a caller that knows the first `known` tokens of `held` and `prompt` agree
/// (a turn continuing the one the held tokens end with): only the rest is compared.
pub fn classify_from(
    held: &[u32],
    latest: Option<Range<usize>>,
    prompt: &[u32],
    output_len: usize,
    policy: Policy,
    fork_threshold: usize,
    known: usize,
) -> Drift {
    let skip = known.min(held.len()).min(prompt.len());
    debug_assert_eq!(held[..skip], prompt[..skip]);
    let at = skip + common_prefix_len(&held[skip..], &prompt[skip..]);
    if at == held.len() {
        return Drift {
            kind: DriftKind::Clean,
            at,
            drifted: 0,
        };
    }
    let drifted = held.len() - at;
    let healable = matches!(
        latest,
        Some(span) if !span.is_empty() && at >= span.start && fork_threshold != 0
    );
    let gate = match policy {
        Policy::Minimal => drifted,
        Policy::Slime => output_len,
    };
    let kind = if healable && gate < fork_threshold {
        DriftKind::Realign
    } else {
        DriftKind::Fork
    };
    Drift { kind, at, drifted }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DriftKind::{Clean, Fork, Realign};

    // Held: a prompt [P, Q] then the latest output [A, B, C] at 2..5.
    const P: u32 = 10;
    const Q: u32 = 11;
    const A: u32 = 20;
    const B: u32 = 21;
    const C: u32 = 22;
    const X: u32 = 99;
    const HELD: [u32; 5] = [P, Q, A, B, C];

    fn drift(kind: DriftKind, at: usize, drifted: usize) -> Drift {
        Drift { kind, at, drifted }
    }

    fn classify_held(prompt: &[u32], output_len: usize, policy: Policy, threshold: usize) -> Drift {
        classify(&HELD, Some(2..5), prompt, output_len, policy, threshold)
    }

    #[test]
    fn names_round_trip() {
        for kind in DriftKind::ALL {
            assert_eq!(DriftKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(DriftKind::parse("CLEAN"), None);
        for name in Policy::NAMES {
            assert_eq!(Policy::parse(name).unwrap().as_str(), name);
        }
        assert_eq!(
            Policy::parse("greedy"),
            Err(Error::UnknownPolicy {
                shown: "'greedy'".into(),
                allowed: &Policy::NAMES,
            })
        );
    }

    #[test]
    fn clean_when_the_prompt_extends_or_equals_the_held_tokens() {
        for policy in [Policy::Minimal, Policy::Slime] {
            assert_eq!(
                classify_held(&[P, Q, A, B, C, X], 9, policy, 4),
                drift(Clean, 5, 0)
            );
            assert_eq!(classify_held(&HELD, 9, policy, 4), drift(Clean, 5, 0));
            assert_eq!(classify(&[], None, &[X], 1, policy, 0), drift(Clean, 0, 0));
        }
    }

    #[test]
    fn minimal_gates_on_drifted_tokens() {
        // Diverges inside the latest output: 2 held tokens drifted.
        let prompt = [P, Q, A, X];
        assert_eq!(
            classify_held(&prompt, 100, Policy::Minimal, 3),
            drift(Realign, 3, 2)
        );
        assert_eq!(
            classify_held(&prompt, 100, Policy::Minimal, 2),
            drift(Fork, 3, 2)
        );
    }

    #[test]
    fn slime_gates_on_the_incoming_output_length() {
        let prompt = [P, Q, A, X];
        assert_eq!(
            classify_held(&prompt, 1, Policy::Slime, 2),
            drift(Realign, 3, 2)
        );
        assert_eq!(
            classify_held(&prompt, 2, Policy::Slime, 2),
            drift(Fork, 3, 2)
        );
    }

    #[test]
    fn a_prompt_shorter_than_the_held_tokens_drifts() {
        assert_eq!(
            classify_held(&[P, Q, A], 0, Policy::Minimal, 8),
            drift(Realign, 3, 2)
        );
        assert_eq!(
            classify_held(&[P, Q], 0, Policy::Minimal, 8),
            drift(Realign, 2, 3)
        );
        assert_eq!(
            classify_held(&[P], 0, Policy::Minimal, 8),
            drift(Fork, 1, 4)
        );
    }

    #[test]
    fn fork_before_the_latest_output_whatever_the_threshold() {
        for policy in [Policy::Minimal, Policy::Slime] {
            assert_eq!(
                classify_held(&[P, X, A, B, C], 0, policy, 1000),
                drift(Fork, 1, 4)
            );
        }
    }

    #[test]
    fn fork_when_the_latest_output_is_empty_or_missing() {
        for policy in [Policy::Minimal, Policy::Slime] {
            assert_eq!(
                classify(&HELD, Some(5..5), &[P, Q, A, B, X], 0, policy, 1000),
                drift(Fork, 4, 1)
            );
            assert_eq!(
                classify(&HELD, None, &[P, Q, A, B, X], 0, policy, 1000),
                drift(Fork, 4, 1)
            );
        }
    }

    #[test]
    fn threshold_zero_forks_on_any_drift() {
        for policy in [Policy::Minimal, Policy::Slime] {
            assert_eq!(
                classify_held(&[P, Q, A, B, X], 0, policy, 0),
                drift(Fork, 4, 1)
            );
        }
    }
}
