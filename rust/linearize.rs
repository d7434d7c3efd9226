//! Linearization: chains of turns become samples, each turn trained once, forks split runs.
use std::mem;

use crate::builder::{BuiltSample, SampleBuilder};
use crate::counts::Counts;
use crate::drift::{DriftKind, Policy};
use crate::error::Error;

/// One model call: the prompt it saw, the tokens it sampled and their logprobs, if any.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Turn {
    pub prompt: Vec<u32>,
    pub output: Vec<u32>,
    pub logprobs: Option<Vec<f32>>,
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
    fn close(
        &mut self,
        builder: SampleBuilder,
        chain: usize,
        max_sample_tokens: i64,
    ) -> Result<(), Error> {
        if builder.spans().is_empty() {
            return Ok(());
        }
        let mut built = builder.into_sample(max_sample_tokens)?;
        built.chain = chain;
        self.realigned.merge(&built.realigned);
        self.truncated.merge(&built.truncated_tokens);
        if built.has_trained_response() {
            self.trained.merge(&built.trained);
            self.samples.push(built);
        }
        Ok(())
    }
}

/// Linearize `chains` of indices into `turns` into samples.
///
/// A turn is trained on the first chain that reaches it and re-emitted as context (mask 0) on
/// later ones. A FORK closes the run and starts a new one. Drift events are recorded only for
/// turns that meet a run already holding output. Errors come in the reference's order: a
/// negative `fork_threshold` at the first chain, a bad turn index when it is reached, a
/// negative `max_sample_tokens` when the first run closes.
pub fn linearize(
    turns: &[Turn],
    chains: &[Vec<usize>],
    policy: Policy,
    fork_threshold: i64,
    max_sample_tokens: i64,
) -> Result<Linearized, Error> {
    let mut claimed = vec![false; turns.len()];
    let mut out = Linearized::default();
    for (c, chain) in chains.iter().enumerate() {
        let mut builder = SampleBuilder::new(policy, fork_threshold)?;
        for &t in chain {
            let turn = turns.get(t).ok_or(Error::TurnOutOfRange {
                chain: c,
                turn: i64::try_from(t).unwrap_or(i64::MAX),
                turns: turns.len(),
            })?;
            let mut drift = builder.classify(&turn.prompt, turn.output.len());
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
                let fresh = SampleBuilder::new(policy, fork_threshold)?;
                out.close(mem::replace(&mut builder, fresh), c, max_sample_tokens)?;
                drift = builder.classify(&turn.prompt, turn.output.len());
            }
            builder.append_classified(
                drift,
                &turn.prompt,
                &turn.output,
                turn.logprobs.as_deref(),
                !claimed[t],
                t as i64,
            )?;
            claimed[t] = true;
        }
        out.close(builder, c, max_sample_tokens)?;
    }
    Ok(out)
}

/// Where a chain of `(prompt, output)` visits first forks: the index of the first visit whose
/// prompt cannot join the run before it, or `None`. Lets a caller that found bad input partway
/// through a chain tell whether the reference would have closed a run before reaching it.
pub fn first_fork<'a>(
    policy: Policy,
    fork_threshold: i64,
    visits: impl IntoIterator<Item = (&'a [u32], &'a [u32])>,
) -> Result<Option<usize>, Error> {
    let mut builder = SampleBuilder::new(policy, fork_threshold)?;
    for (k, (prompt, output)) in visits.into_iter().enumerate() {
        let drift = builder.classify(prompt, output.len());
        if drift.kind == DriftKind::Fork {
            return Ok(Some(k));
        }
        builder.append_classified(drift, prompt, output, None, true, 0)?;
    }
    Ok(None)
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
        Turn {
            prompt: prompt.to_vec(),
            output: output.to_vec(),
            logprobs: None,
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

    fn run(turns: &[Turn], chains: &[Vec<usize>], policy: Policy) -> Linearized {
        linearize(turns, chains, policy, 1024, 0).unwrap()
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
        let out = linearize(&session(), &[vec![0, 2]], Policy::Minimal, 0, 0).unwrap();
        assert_eq!(out.samples.len(), 2);
        assert!(out.realigned.is_empty());
    }

    #[test]
    fn unemitted_runs_still_count_realigned_and_truncated_tokens() {
        // Chain 1 re-emits turn 0 untrained, realigns it and truncates turn 2's output.
        let out = linearize(&session(), &[vec![0], vec![0, 2]], Policy::Minimal, 1024, 5).unwrap();
        assert_eq!(out.samples.len(), 1);
        assert!(out.realigned.is_empty(), "turn 0 was context in chain 1");
        assert_eq!(out.truncated, counts(&[(2, 1)]));
        assert_eq!(out.trained, counts(&[(0, 2)]));
    }

    #[test]
    fn truncation_cuts_each_sample() {
        let out = linearize(&session(), &[vec![0, 1]], Policy::Minimal, 1024, 3).unwrap();
        assert!(out.samples[0].truncated);
        assert_eq!(out.samples[0].tokens, [S, U1, A1]);
        assert_eq!(out.trained, counts(&[(0, 1)]));
        assert_eq!(out.truncated, counts(&[(0, 1), (1, 1)]));
    }

    #[test]
    fn errors_come_where_the_reference_raises_them() {
        let turns = session();
        assert_eq!(
            linearize(&turns, &[vec![0, 7]], Policy::Minimal, 1024, 0).unwrap_err(),
            Error::TurnOutOfRange {
                chain: 0,
                turn: 7,
                turns: 3
            }
        );
        let negative_max = Error::Negative {
            setting: "max_sample_tokens",
            value: -1,
        };
        assert_eq!(
            linearize(&turns, &[vec![0]], Policy::Minimal, 1024, -1).unwrap_err(),
            negative_max
        );
        // No run ever closes with output, so nothing checks the limit.
        assert!(linearize(&turns, &[vec![], vec![]], Policy::Minimal, 1024, -1).is_ok());
        assert!(linearize(&turns, &[], Policy::Minimal, -1, 0).is_ok());
        assert_eq!(
            linearize(&turns, &[vec![]], Policy::Minimal, -1, 0).unwrap_err(),
            Error::Negative {
                setting: "fork_threshold",
                value: -1
            }
        );
    }

    #[test]
    fn bad_logprobs_surface_when_the_turn_is_appended() {
        let mut turns = session();
        turns[1].logprobs = Some(vec![-1.0, -2.0]);
        assert_eq!(
            linearize(&turns, &[vec![0, 1]], Policy::Minimal, 1024, 0).unwrap_err(),
            Error::LogprobLength {
                logprobs: 2,
                outputs: 1
            }
        );
    }

    #[test]
    fn first_fork_finds_the_first_visit_that_forks() {
        let turns = session();
        let visit = |t: usize| (turns[t].prompt.as_slice(), turns[t].output.as_slice());
        let stray = [S, X];
        assert_eq!(
            first_fork(Policy::Minimal, 1024, [visit(0), visit(1)]),
            Ok(None)
        );
        assert_eq!(
            first_fork(
                Policy::Minimal,
                1024,
                [visit(0), visit(1), (&stray[..], &[][..])]
            ),
            Ok(Some(2))
        );
        assert_eq!(
            first_fork(Policy::Minimal, 0, [visit(0), visit(2)]),
            Ok(Some(1))
        );
    }
}
