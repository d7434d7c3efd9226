//! Linearization: chains of turns become samples, each turn trained once, forks split runs.
use std::mem;

use crate::builder::{checked_logprobs, BuiltSample, SampleBuilder};
use crate::counts::Counts;
use crate::drift::{DriftKind, Policy};
use crate::error::{non_negative, Error};

/// One model call: the prompt it saw, the tokens it sampled and their logprobs, if any.
/// Built only by `Turn::new`, so its logprobs always fit its output.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    prompt: Vec<u32>,
    output: Vec<u32>,
    logprobs: Option<Vec<f32>>,
}

impl Turn {
    /// A turn whose `logprobs` are absent, empty (the same as absent) or one per output
    /// token; any other length is an `Error::LogprobLength`.
    pub fn new(
        prompt: Vec<u32>,
        output: Vec<u32>,
        logprobs: Option<Vec<f32>>,
    ) -> Result<Turn, Error> {
        checked_logprobs(logprobs.as_deref(), output.len())?;
        Ok(Turn {
            prompt,
            output,
            logprobs: logprobs.filter(|logprobs| !logprobs.is_empty()),
        })
    }
}

/// One turn as `linearize` reads it: its prompt, output and logprobs (none when absent).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnRef<'a> {
    pub prompt: &'a [u32],
    pub output: &'a [u32],
    pub logprobs: Option<&'a [f32]>,
}

/// Where `linearize` reads its turns from, by index and one at a time, so a source may build
/// each prompt when it is asked for it (see `store::TurnStore`).
pub trait TurnSource {
    /// How many turns there are; chains index `0..count()`.
    fn count(&self) -> usize;

    /// Turn `index`, which is below `count()`. Its logprobs fit its output, as `Turn::new`
    /// checks them.
    fn turn(&mut self, index: usize) -> TurnRef<'_>;

    /// How many leading tokens of turn `index`'s prompt are known, without comparing them, to
    /// be turn `earlier`'s prompt and output (0: none are known).
    fn known_shared(&self, _index: usize, _earlier: usize) -> usize {
        0
    }
}

impl TurnSource for &[Turn] {
    fn count(&self) -> usize {
        self.len()
    }

    fn turn(&mut self, index: usize) -> TurnRef<'_> {
        let turn = &self[index];
        TurnRef {
            prompt: &turn.prompt,
            output: &turn.output,
            logprobs: turn.logprobs.as_deref(),
        }
    }
}

/// How `linearize` heals drift and cuts samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub policy: Policy,
    /// 0 turns every drift into a FORK.
    pub fork_threshold: usize,
    /// The longest sample kept; 0 keeps every token.
    pub max_sample_tokens: usize,
}

impl Settings {
    /// Settings from the signed values Python passes: a negative `fork_threshold`, then a
    /// negative `max_sample_tokens`, is an `Error::Negative`.
    pub fn new(policy: Policy, fork_threshold: i64, max_sample_tokens: i64) -> Result<Self, Error> {
        Ok(Settings {
            policy,
            fork_threshold: non_negative("fork_threshold", fork_threshold)?,
            max_sample_tokens: non_negative("max_sample_tokens", max_sample_tokens)?,
        })
    }
}

/// A drift decision taken while adding `turn` to a run of `chain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriftEvent {
    pub chain: usize,
    pub turn: usize,
    pub kind: DriftKind,
    pub at: usize,
    pub drifted: usize,
}

/// Every sample of a set of chains, with the drift decisions taken on the way.
///
/// `samples` holds only runs with a trained response; `trained`, `realigned` and `truncated`
/// count tokens per turn over every run, emitted or not (`trained` over emitted ones only).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Linearized {
    pub samples: Vec<BuiltSample>,
    pub drifts: Vec<DriftEvent>,
    pub trained: Counts,
    pub realigned: Counts,
    pub truncated: Counts,
}

impl Linearized {
    /// Finish a run: its realigned and truncated counts always count; its trained ones and
    /// the sample itself only when it trains on something.
    fn close(&mut self, builder: SampleBuilder, chain: usize, max_sample_tokens: usize) {
        if builder.spans().is_empty() {
            return;
        }
        let mut built = builder.into_sample(max_sample_tokens);
        built.chain = chain;
        self.realigned.merge(&built.realigned);
        self.truncated.merge(&built.truncated_tokens);
        if built.has_trained_response() {
            self.trained.merge(&built.trained);
            self.samples.push(built);
        }
    }
}

/// Linearize `chains` of indices into `turns` into samples.
///
/// A turn is trained on the first chain that reaches it and re-emitted as context (mask 0) on
/// later ones. A FORK closes the run and starts a new one. Drift events are recorded only for
/// turns that meet a run already holding output.
///
/// Everything is checked before any work: `Settings::new` and `Turn::new` check the settings
/// and the turns, and `linearize` first checks that every chain entry indexes `turns` (a
/// negative one never does).
pub fn linearize(
    turns: &[Turn],
    chains: &[Vec<i64>],
    settings: Settings,
) -> Result<Linearized, Error> {
    linearize_from(&mut { turns }, chains, settings)
}

/// `linearize` over the turns of any `TurnSource`, each read when a chain reaches it.
pub fn linearize_from(
    turns: &mut impl TurnSource,
    chains: &[Vec<i64>],
    settings: Settings,
) -> Result<Linearized, Error> {
    let chains = turn_indices(chains, turns.count())?;
    let Settings {
        policy,
        fork_threshold,
        max_sample_tokens,
    } = settings;
    let mut claimed = vec![false; turns.count()];
    let mut out = Linearized::default();
    for (c, chain) in chains.iter().enumerate() {
        let mut builder = SampleBuilder::with_threshold(policy, fork_threshold);
        // The turn the builder's tokens end with: they are its prompt and output, whatever
        // drift was healed on the way, so what the source knows a turn shares with it need
        // not be compared again (on a long chain, most of every prompt).
        let mut last: Option<usize> = None;
        for &t in chain {
            let known = last.map_or(0, |u| turns.known_shared(t, u));
            let turn = turns.turn(t);
            let mut drift = builder.classify_from(turn.prompt, turn.output.len(), known);
            if !builder.spans().is_empty() {
                out.drifts.push(DriftEvent {
                    chain: c,
                    turn: t,
                    kind: drift.kind,
                    at: drift.at,
                    drifted: drift.drifted,
                });
            }
            if drift.kind == DriftKind::Fork {
                let fresh = SampleBuilder::with_threshold(policy, fork_threshold);
                out.close(mem::replace(&mut builder, fresh), c, max_sample_tokens);
                drift = builder.classify(turn.prompt, turn.output.len());
            }
            builder.append_classified(
                drift,
                turn.prompt,
                turn.output,
                turn.logprobs,
                !claimed[t],
                t as i64,
            )?;
            claimed[t] = true;
            last = Some(t);
        }
        out.close(builder, c, max_sample_tokens);
    }
    Ok(out)
}

/// The chains as indices into `turns`, or the first entry, chain by chain, out of range.
fn turn_indices(chains: &[Vec<i64>], turns: usize) -> Result<Vec<Vec<usize>>, Error> {
    let index = |chain: usize, turn: i64| {
        usize::try_from(turn)
            .ok()
            .filter(|&t| t < turns)
            .ok_or(Error::TurnOutOfRange { chain, turn, turns })
    };
    chains
        .iter()
        .enumerate()
        .map(|(c, chain)| chain.iter().map(|&t| index(c, t)).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Named tokens: system S, users U1..U3, assistant outputs A (turn 0), B (turn 1),
    // C (turn 2), a re-rendering R of A's last token, and a stray X.
    const S: u32 = 1;
    const U1: u32 = 2;
    const U2: u32 = 3;
    const U3: u32 = 4;
    const A1: u32 = 10;
    const A2: u32 = 11;
    const B1: u32 = 20;
    const C1: u32 = 30;
    const R2: u32 = 40;
    const X: u32 = 99;

    fn turn(prompt: &[u32], output: &[u32]) -> Turn {
        Turn::new(prompt.to_vec(), output.to_vec(), None).unwrap()
    }

    fn settings(policy: Policy, fork_threshold: usize, max_sample_tokens: usize) -> Settings {
        Settings {
            policy,
            fork_threshold,
            max_sample_tokens,
        }
    }

    fn counts(pairs: &[(i64, usize)]) -> Counts {
        pairs.iter().copied().collect()
    }

    /// Turn 0: [S U1] -> [A1 A2]; turn 1 extends it cleanly; turn 2 re-renders A2 as R2.
    fn session() -> Vec<Turn> {
        vec![
            turn(&[S, U1], &[A1, A2]),
            turn(&[S, U1, A1, A2, U2], &[B1]),
            turn(&[S, U1, A1, R2, U3], &[C1]),
        ]
    }

    fn run(turns: &[Turn], chains: &[Vec<i64>], policy: Policy) -> Linearized {
        linearize(turns, chains, settings(policy, 1024, 0)).unwrap()
    }

    #[test]
    fn a_clean_chain_is_one_sample() {
        let out = run(&session(), &[vec![0, 1]], Policy::Minimal);
        assert_eq!(out.samples.len(), 1);
        let sample = &out.samples[0];
        assert_eq!(sample.tokens, [S, U1, A1, A2, U2, B1]);
        assert_eq!(sample.loss_mask, [1, 1, 0, 1]);
        assert_eq!(sample.turns, [0, 1]);
        assert_eq!(out.trained, counts(&[(0, 2), (1, 1)]));
        // The first turn of a run records no drift event.
        assert_eq!(
            out.drifts,
            [DriftEvent {
                chain: 0,
                turn: 1,
                kind: DriftKind::Clean,
                at: 4,
                drifted: 0
            }]
        );
    }

    #[test]
    fn a_shared_turn_is_trained_once_and_re_emitted_as_context() {
        let out = run(&session(), &[vec![0, 1], vec![0, 1]], Policy::Minimal);
        assert_eq!(out.samples.len(), 1, "the second run trains on nothing");
        assert_eq!(out.trained, counts(&[(0, 2), (1, 1)]));

        let out = run(&session(), &[vec![0], vec![0, 1]], Policy::Minimal);
        assert_eq!(out.samples.len(), 2);
        assert_eq!(out.samples[1].chain, 1);
        assert_eq!(out.samples[1].loss_mask, [0, 0, 0, 1]);
        assert_eq!(out.trained, counts(&[(0, 2), (1, 1)]));
    }

    #[test]
    fn a_turn_repeated_inside_a_chain_realigns_onto_itself_as_context() {
        // The second visit's prompt stops before the first visit's output: a REALIGN that
        // removes the trained output and puts it back untrained.
        let turns = [turn(&[S], &[A1])];
        let out = run(&turns, &[vec![0, 0]], Policy::Minimal);
        assert!(out.samples.is_empty());
        assert_eq!(out.realigned, counts(&[(0, 1)]));
        assert!(out.trained.is_empty());
        assert_eq!(out.drifts[0].kind, DriftKind::Realign);
    }

    #[test]
    fn realign_heals_per_policy() {
        let minimal = run(&session(), &[vec![0, 2]], Policy::Minimal);
        assert_eq!(minimal.samples.len(), 1);
        assert_eq!(minimal.samples[0].tokens, [S, U1, A1, R2, U3, C1]);
        assert_eq!(minimal.samples[0].loss_mask, [1, 0, 0, 1]);
        assert_eq!(minimal.realigned, counts(&[(0, 1)]));
        assert_eq!(minimal.trained, counts(&[(0, 1), (2, 1)]));

        let slime = run(&session(), &[vec![0, 2]], Policy::Slime);
        assert_eq!(slime.samples[0].loss_mask, [0, 0, 0, 1]);
        assert_eq!(slime.realigned, counts(&[(0, 2)]));
        assert_eq!(slime.trained, counts(&[(2, 1)]));
        assert_eq!(slime.drifts[0].kind, DriftKind::Realign);
    }

    #[test]
    fn a_fork_closes_the_run_and_starts_another() {
        let mut turns = session();
        turns.push(turn(&[S, X], &[C1]));
        let out = run(&turns, &[vec![0, 1, 3]], Policy::Minimal);
        assert_eq!(out.samples.len(), 2);
        assert_eq!(out.samples[0].turns, [0, 1]);
        assert_eq!(out.samples[1].tokens, [S, X, C1]);
        assert_eq!(out.samples[1].turns, [3]);
        let kinds: Vec<_> = out.drifts.iter().map(|d| (d.turn, d.kind)).collect();
        assert_eq!(kinds, [(1, DriftKind::Clean), (3, DriftKind::Fork)]);
    }

    #[test]
    fn threshold_zero_turns_a_realign_into_a_fork() {
        let out = linearize(&session(), &[vec![0, 2]], settings(Policy::Minimal, 0, 0)).unwrap();
        assert_eq!(out.samples.len(), 2);
        assert!(out.realigned.is_empty());
    }

    #[test]
    fn unemitted_runs_still_count_realigned_and_truncated_tokens() {
        // Chain 1 re-emits turn 0 untrained, realigns it and truncates turn 2's output.
        let out = linearize(
            &session(),
            &[vec![0], vec![0, 2]],
            settings(Policy::Minimal, 1024, 5),
        )
        .unwrap();
        assert_eq!(out.samples.len(), 1);
        assert!(out.realigned.is_empty(), "turn 0 was context in chain 1");
        assert_eq!(out.truncated, counts(&[(2, 1)]));
        assert_eq!(out.trained, counts(&[(0, 2)]));
    }

    #[test]
    fn truncation_cuts_each_sample() {
        let out = linearize(
            &session(),
            &[vec![0, 1]],
            settings(Policy::Minimal, 1024, 3),
        )
        .unwrap();
        assert!(out.samples[0].truncated);
        assert_eq!(out.samples[0].tokens, [S, U1, A1]);
        assert_eq!(out.trained, counts(&[(0, 1)]));
        assert_eq!(out.truncated, counts(&[(0, 1), (1, 1)]));
    }

    #[test]
    fn negative_settings_are_refused_threshold_first() {
        assert_eq!(
            Settings::new(Policy::Slime, 8, 40),
            Ok(settings(Policy::Slime, 8, 40))
        );
        assert_eq!(
            Settings::new(Policy::Minimal, -1, -2),
            Err(Error::Negative {
                setting: "fork_threshold",
                value: -1
            })
        );
        assert_eq!(
            Settings::new(Policy::Minimal, 0, -2),
            Err(Error::Negative {
                setting: "max_sample_tokens",
                value: -2
            })
        );
    }

    #[test]
    fn every_chain_entry_is_checked_before_any_work() {
        let turns = session();
        let refused = |chains: &[Vec<i64>]| {
            linearize(&turns, chains, settings(Policy::Minimal, 1024, 0)).unwrap_err()
        };
        assert_eq!(
            refused(&[vec![0, 7]]),
            Error::TurnOutOfRange {
                chain: 0,
                turn: 7,
                turns: 3
            }
        );
        // The first bad entry counts, even behind a chain that would fork.
        assert_eq!(
            refused(&[vec![0, 2], vec![], vec![1, -1, 9]]),
            Error::TurnOutOfRange {
                chain: 2,
                turn: -1,
                turns: 3
            }
        );
    }

    #[test]
    fn logprobs_must_fit_the_output_and_empty_means_none() {
        assert_eq!(
            Turn::new(vec![S], vec![A1], Some(vec![-1.0, -2.0])).unwrap_err(),
            Error::LogprobLength {
                logprobs: 2,
                outputs: 1
            }
        );
        assert_eq!(
            Turn::new(vec![S], vec![A1], Some(vec![])),
            Turn::new(vec![S], vec![A1], None)
        );
        let turns = [Turn::new(vec![S], vec![A1, A2], Some(vec![-1.0, -2.0])).unwrap()];
        let out = run(&turns, &[vec![0]], Policy::Minimal);
        assert_eq!(out.samples[0].logprobs, [-1.0, -2.0]);
    }
}
