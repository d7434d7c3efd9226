//! Loss masks: one coherent run of turns accumulated into tokens, loss mask and logprobs.
use std::ops::Range;

use crate::counts::Counts;
use crate::drift::{self, Drift, DriftKind, Policy};
use crate::error::{non_negative, Error};

/// One turn's sampled output inside a builder: tokens `start..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    pub turn: i64,
    pub start: usize,
    pub end: usize,
}

impl Span {
    fn range(&self) -> Range<usize> {
        self.start..self.end
    }
}

/// Accumulates one coherent run of turns.
///
/// The first turn's prompt is context only and is stripped from the sample; each later turn
/// appends the part of its prompt the builder does not hold yet (mask 0), then its output
/// (mask 1 with the sampled logprobs, or mask 0 when re-emitted as context).
#[derive(Debug, Clone)]
pub struct SampleBuilder {
    policy: Policy,
    fork_threshold: usize,
    tokens: Vec<u32>,
    mask: Vec<u8>,
    logprobs: Vec<f32>,
    spans: Vec<Span>,
    response_start: usize,
    /// Per turn: trained tokens removed by realignment.
    realigned: Counts,
}

impl SampleBuilder {
    /// An empty builder; a negative `fork_threshold` is an `Error::Negative`.
    pub fn new(policy: Policy, fork_threshold: i64) -> Result<Self, Error> {
        let fork_threshold = non_negative("fork_threshold", fork_threshold)?;
        Ok(Self::with_threshold(policy, fork_threshold))
    }

    /// An empty builder, for a caller whose threshold is already a count.
    pub fn with_threshold(policy: Policy, fork_threshold: usize) -> Self {
        Self {
            policy,
            fork_threshold,
            tokens: Vec::new(),
            mask: Vec::new(),
            logprobs: Vec::new(),
            spans: Vec::new(),
            response_start: 0,
            realigned: Counts::new(),
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn fork_threshold(&self) -> usize {
        self.fork_threshold
    }

    /// How many tokens the builder holds.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The loss mask over every held token, first prompt included.
    pub fn loss_mask(&self) -> &[u8] {
        &self.mask
    }

    /// The logprobs over every held token, first prompt included.
    pub fn logprobs(&self) -> &[f32] {
        &self.logprobs
    }

    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Where the response starts: the length of the first turn's prompt.
    pub fn response_start(&self) -> usize {
        self.response_start
    }

    /// Per turn: trained tokens removed by realignment.
    pub fn realigned(&self) -> &Counts {
        &self.realigned
    }

    /// How `prompt` (followed by `output_len` sampled tokens) relates to the held tokens.
    pub fn classify(&self, prompt: &[u32], output_len: usize) -> Drift {
        self.classify_from(prompt, output_len, 0)
    }

    /// `classify` for a prompt whose first `known` tokens are known to be the held ones.
    pub fn classify_from(&self, prompt: &[u32], output_len: usize, known: usize) -> Drift {
        drift::classify_from(
            &self.tokens,
            self.spans.last().map(Span::range),
            prompt,
            output_len,
            self.policy,
            self.fork_threshold,
            known,
        )
    }

    /// Append a turn, healing a REALIGN. A FORK is refused with `Error::Fork`: start a new
    /// builder. Empty `logprobs` count as none; with `trained` false the output is context.
    pub fn append_turn(
        &mut self,
        prompt: &[u32],
        output: &[u32],
        logprobs: Option<&[f32]>,
        trained: bool,
        turn: i64,
    ) -> Result<Drift, Error> {
        let drift = self.classify(prompt, output.len());
        self.append_classified(drift, prompt, output, logprobs, trained, turn)
    }

    /// `append_turn` for a caller that already holds `self.classify(prompt, output.len())`.
    pub(crate) fn append_classified(
        &mut self,
        drift: Drift,
        prompt: &[u32],
        output: &[u32],
        logprobs: Option<&[f32]>,
        trained: bool,
        turn: i64,
    ) -> Result<Drift, Error> {
        let logprobs = checked_logprobs(logprobs, output.len())?;
        let cut = match drift.kind {
            DriftKind::Fork => return Err(Error::Fork { turn, at: drift.at }),
            DriftKind::Clean => self.tokens.len(),
            DriftKind::Realign => self.heal(drift.at),
        };
        let first = self.spans.is_empty();
        self.push_context(&prompt[cut..]);
        let start = self.tokens.len();
        self.tokens.extend_from_slice(output);
        match (trained, logprobs) {
            (true, Some(logprobs)) => {
                self.mask.resize(self.tokens.len(), 1);
                self.logprobs.extend_from_slice(logprobs);
            }
            (true, None) => {
                self.mask.resize(self.tokens.len(), 1);
                self.logprobs.resize(self.tokens.len(), 0.0);
            }
            (false, _) => {
                self.mask.resize(self.tokens.len(), 0);
                self.logprobs.resize(self.tokens.len(), 0.0);
            }
        }
        self.spans.push(Span {
            turn,
            start,
            end: self.tokens.len(),
        });
        if first {
            self.response_start = prompt.len();
        }
        Ok(drift)
    }

    /// Cut the latest output back for a REALIGN diverging at `at`; returns where the incoming
    /// prompt resumes. Minimal keeps the output up to `at`; slime drops all of it.
    fn heal(&mut self, at: usize) -> usize {
        let last = self
            .spans
            .last_mut()
            .expect("a REALIGN always has a latest span");
        let cut = match self.policy {
            Policy::Minimal => at,
            Policy::Slime => last.start,
        };
        self.realigned
            .add(last.turn, ones(&self.mask[cut..last.end]));
        last.end = cut;
        self.tokens.truncate(cut);
        self.mask.truncate(cut);
        self.logprobs.truncate(cut);
        cut
    }

    fn push_context(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        self.mask.resize(self.tokens.len(), 0);
        self.logprobs.resize(self.tokens.len(), 0.0);
    }

    /// Whether any token after the first prompt is trained (truncation aside).
    pub fn has_trained_response(&self) -> bool {
        self.mask[self.response_start..].contains(&1)
    }

    /// The sample cut to `max_sample_tokens` (0: no limit); the builder stays as it is.
    /// A negative `max_sample_tokens` is an `Error::Negative`.
    pub fn finish(&self, max_sample_tokens: i64) -> Result<BuiltSample, Error> {
        let limit = non_negative("max_sample_tokens", max_sample_tokens)?;
        Ok(self.clone().into_sample(limit))
    }

    /// `finish` for a caller whose limit is already a count: hands over the builder's buffers
    /// instead of copying them.
    pub fn into_sample(mut self, limit: usize) -> BuiltSample {
        let total = self.tokens.len();
        let keep = if limit == 0 { total } else { total.min(limit) };
        let mut trained = Counts::new();
        let mut truncated = Counts::new();
        for span in self.spans.iter().filter(|span| span.end > span.start) {
            let kept_end = span.end.min(keep).max(span.start);
            let cut_start = span.start.max(keep).min(span.end);
            trained.add(span.turn, ones(&self.mask[span.start..kept_end]));
            truncated.add(span.turn, ones(&self.mask[cut_start..span.end]));
        }
        let strip = self.response_start.min(keep);
        self.tokens.truncate(keep);
        self.mask.truncate(keep);
        self.mask.drain(..strip);
        self.logprobs.truncate(keep);
        self.logprobs.drain(..strip);
        BuiltSample {
            tokens: self.tokens,
            loss_mask: self.mask,
            logprobs: self.logprobs,
            response_start: strip,
            truncated: keep < total,
            turns: self.spans.iter().map(|span| span.turn).collect(),
            spans: self
                .spans
                .iter()
                .map(|span| Span {
                    start: span.start.min(keep),
                    end: span.end.min(keep),
                    ..*span
                })
                .collect(),
            trained,
            realigned: self.realigned,
            truncated_tokens: truncated,
            chain: 0,
        }
    }
}

/// One linearized run: `tokens` in full, `loss_mask` and `logprobs` over the response part
/// (from `response_start`).
#[derive(Debug, Clone, PartialEq)]
pub struct BuiltSample {
    pub tokens: Vec<u32>,
    pub loss_mask: Vec<u8>,
    pub logprobs: Vec<f32>,
    pub response_start: usize,
    pub truncated: bool,
    pub turns: Vec<i64>,
    /// Each turn's output in `tokens` coordinates, as built (a truncated sample keeps only
    /// what lies before its end).
    pub spans: Vec<Span>,
    pub trained: Counts,
    pub realigned: Counts,
    pub truncated_tokens: Counts,
    pub chain: usize,
}

impl BuiltSample {
    /// Whether any token the sample keeps is trained.
    pub fn has_trained_response(&self) -> bool {
        self.loss_mask.contains(&1)
    }
}

/// A turn's logprobs as the builder takes them: none when absent or empty, else exactly one
/// per output token.
pub fn checked_logprobs(logprobs: Option<&[f32]>, outputs: usize) -> Result<Option<&[f32]>, Error> {
    match logprobs {
        None | Some([]) => Ok(None),
        Some(logprobs) if logprobs.len() != outputs => Err(Error::LogprobLength {
            logprobs: logprobs.len(),
            outputs,
        }),
        Some(logprobs) => Ok(Some(logprobs)),
    }
}

fn ones(mask: &[u8]) -> usize {
    mask.iter().map(|&bit| usize::from(bit)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Named tokens: system prompt S, user messages U1 U2, assistant outputs A.. and their
    // re-renderings R.., plus a stray X.
    const S: u32 = 1;
    const U1: u32 = 2;
    const U2: u32 = 3;
    const A1: u32 = 10;
    const A2: u32 = 11;
    const A3: u32 = 12;
    const B1: u32 = 20;
    const B2: u32 = 21;
    const R3: u32 = 30;
    const X: u32 = 99;

    fn builder(policy: Policy, threshold: i64) -> SampleBuilder {
        SampleBuilder::new(policy, threshold).unwrap()
    }

    /// A builder holding [S U1 | A1 A2 A3] with the output trained under logprobs -1 -2 -3.
    fn one_turn(policy: Policy) -> SampleBuilder {
        let mut b = builder(policy, 1024);
        let drift = b
            .append_turn(&[S, U1], &[A1, A2, A3], Some(&[-1.0, -2.0, -3.0]), true, 0)
            .unwrap();
        assert_eq!(drift.kind, DriftKind::Clean);
        b
    }

    #[test]
    fn the_first_prompt_is_context_and_the_output_is_trained() {
        let b = one_turn(Policy::Minimal);
        assert_eq!(b.tokens(), [S, U1, A1, A2, A3]);
        assert_eq!(b.loss_mask(), [0, 0, 1, 1, 1]);
        assert_eq!(b.logprobs(), [0.0, 0.0, -1.0, -2.0, -3.0]);
        assert_eq!(b.response_start(), 2);
        assert_eq!(
            b.spans(),
            [Span {
                turn: 0,
                start: 2,
                end: 5
            }]
        );
        assert!(b.has_trained_response());
    }

    #[test]
    fn a_clean_turn_adds_the_new_prompt_as_context() {
        let mut b = one_turn(Policy::Minimal);
        let drift = b
            .append_turn(&[S, U1, A1, A2, A3, U2], &[B1, B2], None, true, 1)
            .unwrap();
        assert_eq!(
            drift,
            Drift {
                kind: DriftKind::Clean,
                at: 5,
                drifted: 0
            }
        );
        assert_eq!(b.tokens(), [S, U1, A1, A2, A3, U2, B1, B2]);
        assert_eq!(b.loss_mask(), [0, 0, 1, 1, 1, 0, 1, 1]);
        assert_eq!(b.logprobs(), [0.0, 0.0, -1.0, -2.0, -3.0, 0.0, 0.0, 0.0]);
        assert_eq!(
            b.spans()[1],
            Span {
                turn: 1,
                start: 6,
                end: 8
            }
        );
    }

    #[test]
    fn minimal_realign_keeps_the_output_up_to_the_divergence() {
        let mut b = one_turn(Policy::Minimal);
        let drift = b
            .append_turn(&[S, U1, A1, A2, R3, U2], &[B1], None, true, 1)
            .unwrap();
        assert_eq!(
            drift,
            Drift {
                kind: DriftKind::Realign,
                at: 4,
                drifted: 1
            }
        );
        assert_eq!(b.tokens(), [S, U1, A1, A2, R3, U2, B1]);
        assert_eq!(b.loss_mask(), [0, 0, 1, 1, 0, 0, 1]);
        assert_eq!(
            b.spans()[0],
            Span {
                turn: 0,
                start: 2,
                end: 4
            }
        );
        assert_eq!(b.realigned().iter().collect::<Vec<_>>(), [(0, 1)]);
    }

    #[test]
    fn slime_realign_masks_the_whole_latest_output() {
        let mut b = one_turn(Policy::Slime);
        let drift = b
            .append_turn(&[S, U1, A1, A2, R3, U2], &[B1], None, true, 1)
            .unwrap();
        assert_eq!(
            drift,
            Drift {
                kind: DriftKind::Realign,
                at: 4,
                drifted: 1
            }
        );
        assert_eq!(b.tokens(), [S, U1, A1, A2, R3, U2, B1]);
        assert_eq!(b.loss_mask(), [0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(b.logprobs(), [0.0; 7]);
        assert_eq!(
            b.spans()[0],
            Span {
                turn: 0,
                start: 2,
                end: 2
            }
        );
        assert_eq!(b.realigned().iter().collect::<Vec<_>>(), [(0, 3)]);
    }

    #[test]
    fn a_prompt_shorter_than_the_held_tokens_cuts_them_back() {
        let mut b = one_turn(Policy::Minimal);
        let drift = b.append_turn(&[S, U1, A1], &[B1], None, true, 1).unwrap();
        assert_eq!(
            drift,
            Drift {
                kind: DriftKind::Realign,
                at: 3,
                drifted: 2
            }
        );
        assert_eq!(b.tokens(), [S, U1, A1, B1]);
        assert_eq!(b.loss_mask(), [0, 0, 1, 1]);
    }

    #[test]
    fn a_fork_is_refused_and_leaves_the_builder_alone() {
        let mut b = one_turn(Policy::Minimal);
        let before = b.clone();
        let err = b.append_turn(&[S, X], &[B1], None, true, 4).unwrap_err();
        assert_eq!(err, Error::Fork { turn: 4, at: 1 });
        assert_eq!(b.tokens(), before.tokens());
        assert_eq!(b.spans(), before.spans());
    }

    #[test]
    fn a_realign_against_an_emptied_span_is_a_fork() {
        let mut b = one_turn(Policy::Slime);
        b.append_turn(&[S, U1, A1, A2, R3], &[], None, true, 1)
            .unwrap();
        let drift = b.classify(&[S, U1, A1, A2, X], 1);
        assert_eq!(drift.kind, DriftKind::Fork);
    }

    #[test]
    fn threshold_zero_forks_on_any_drift() {
        let mut b = builder(Policy::Minimal, 0);
        b.append_turn(&[S], &[A1, A2], None, true, 0).unwrap();
        assert_eq!(b.classify(&[S, A1, X], 0).kind, DriftKind::Fork);
        assert_eq!(b.classify(&[S, A1, A2, X], 0).kind, DriftKind::Clean);
    }

    #[test]
    fn logprobs_must_match_the_output_and_empty_means_none() {
        let mut b = builder(Policy::Minimal, 1024);
        let err = b
            .append_turn(&[S], &[A1, A2], Some(&[-1.0]), true, 0)
            .unwrap_err();
        assert_eq!(
            err,
            Error::LogprobLength {
                logprobs: 1,
                outputs: 2
            }
        );
        assert!(b.is_empty());
        b.append_turn(&[S], &[A1, A2], Some(&[]), true, 0).unwrap();
        assert_eq!(b.logprobs(), [0.0, 0.0, 0.0]);
    }

    #[test]
    fn the_logprob_check_comes_before_the_fork_check() {
        let mut b = one_turn(Policy::Minimal);
        let err = b
            .append_turn(&[X], &[B1], Some(&[-1.0, -2.0]), true, 1)
            .unwrap_err();
        assert_eq!(
            err,
            Error::LogprobLength {
                logprobs: 2,
                outputs: 1
            }
        );
    }

    #[test]
    fn an_untrained_output_is_context() {
        let mut b = builder(Policy::Minimal, 1024);
        b.append_turn(&[S], &[A1, A2], Some(&[-1.0, -2.0]), false, 0)
            .unwrap();
        assert_eq!(b.loss_mask(), [0, 0, 0]);
        assert_eq!(b.logprobs(), [0.0, 0.0, 0.0]);
        assert!(!b.has_trained_response());
    }

    #[test]
    fn negative_settings_are_refused() {
        assert_eq!(
            SampleBuilder::new(Policy::Minimal, -1).unwrap_err(),
            Error::Negative {
                setting: "fork_threshold",
                value: -1
            }
        );
        assert_eq!(
            one_turn(Policy::Minimal).finish(-3).unwrap_err(),
            Error::Negative {
                setting: "max_sample_tokens",
                value: -3
            }
        );
    }

    #[test]
    fn finish_strips_the_first_prompt_from_the_masks() {
        let mut b = one_turn(Policy::Minimal);
        b.append_turn(&[S, U1, A1, A2, A3, U2], &[B1, B2], None, false, 1)
            .unwrap();
        let sample = b.finish(0).unwrap();
        assert_eq!(sample.tokens, [S, U1, A1, A2, A3, U2, B1, B2]);
        assert_eq!(sample.loss_mask, [1, 1, 1, 0, 0, 0]);
        assert_eq!(sample.logprobs, [-1.0, -2.0, -3.0, 0.0, 0.0, 0.0]);
        assert_eq!(sample.response_start, 2);
        assert!(!sample.truncated);
        assert_eq!(sample.turns, [0, 1]);
        assert_eq!(sample.trained, [(0, 3)].into_iter().collect());
        assert!(sample.truncated_tokens.is_empty());
        assert_eq!(b.len(), 8, "finish leaves the builder as it was");
    }

    #[test]
    fn truncation_counts_what_each_turn_loses() {
        let mut b = one_turn(Policy::Minimal);
        b.append_turn(&[S, U1, A1, A2, A3, U2], &[B1, B2], None, true, 1)
            .unwrap();
        // Keep [S U1 A1 A2]: turn 0 keeps 2 and loses 1, turn 1 loses both.
        let sample = b.finish(4).unwrap();
        assert!(sample.truncated);
        assert_eq!(sample.tokens, [S, U1, A1, A2]);
        assert_eq!(sample.loss_mask, [1, 1]);
        assert_eq!(sample.trained, [(0, 2)].into_iter().collect());
        assert_eq!(
            sample.truncated_tokens,
            [(0, 1), (1, 2)].into_iter().collect()
        );
        // A limit inside the first prompt strips nothing past it.
        let sample = b.finish(1).unwrap();
        assert_eq!(sample.tokens, [S]);
        assert_eq!(sample.response_start, 1);
        assert!(sample.loss_mask.is_empty() && !sample.has_trained_response());
        assert_eq!(
            sample.truncated_tokens,
            [(0, 3), (1, 2)].into_iter().collect()
        );
        // A limit past the end changes nothing.
        assert_eq!(b.finish(100).unwrap(), b.finish(0).unwrap());
    }

    #[test]
    fn checked_logprobs_cases() {
        assert_eq!(checked_logprobs(None, 3), Ok(None));
        assert_eq!(checked_logprobs(Some(&[]), 3), Ok(None));
        assert_eq!(checked_logprobs(Some(&[-1.0]), 1), Ok(Some(&[-1.0][..])));
        assert_eq!(
            checked_logprobs(Some(&[-1.0]), 0),
            Err(Error::LogprobLength {
                logprobs: 1,
                outputs: 0
            })
        );
    }
}
