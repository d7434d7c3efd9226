//! The one error type of tokentrail's core: bad input, named by what is wrong with it.
use std::fmt;

/// Everything the core refuses. The binding maps each variant to a named Python exception
/// (`TokenIdError`, `LogprobLengthError`, `PolicyError`, `PackError`, `TokenizerError` or
/// `ReplayError`, all `ValueError`s; `ChunkedBodyError`, an engine's fault).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A token id is negative, not an integer, or does not fit in 32 bits; the message says
    /// which input and where.
    TokenId(String),
    /// A turn's logprobs do not match its output tokens one for one.
    LogprobLength { logprobs: usize, outputs: usize },
    /// A drift policy not among `allowed` (`Policy::NAMES`); `shown` is the name as Python
    /// shows it.
    UnknownPolicy {
        shown: String,
        allowed: &'static [&'static str],
    },
    /// A setting that must be `>= 0` was negative.
    Negative { setting: &'static str, value: i64 },
    /// A turn forks from the held tokens, so it cannot join this builder.
    Fork { turn: i64, at: usize },
    /// A chain names a turn index that does not exist.
    TurnOutOfRange {
        chain: usize,
        turn: i64,
        turns: usize,
    },
    /// A turn store is asked for a turn it does not hold; `what` is "turn" or, for a push,
    /// "parent turn".
    NoSuchTurn {
        what: &'static str,
        turn: i64,
        turns: usize,
    },
    /// One of `pack`'s per-sample inputs has `got` entries for `samples` token arrays.
    PackCount {
        what: &'static str,
        got: usize,
        samples: usize,
    },
    /// A packed sample's response length is negative or longer than its tokens.
    ResponseLength {
        sample: usize,
        response_length: i64,
        tokens: usize,
    },
    /// A packed sample's loss mask or logprobs (`what`) is not one entry per response token.
    PackLength {
        sample: usize,
        what: &'static str,
        got: usize,
        response_length: usize,
    },
    /// The packed tokens or the samples are too many for int32 `cu_seqlens`.
    PackTooLong { tokens: usize, samples: usize },
    /// A tokenizer.json cannot be loaded, or the tokenizer fails on a text; the message says
    /// which.
    Tokenizer(String),
    /// Replay data (routed experts, indexer top-k) that does not fit its tape or its turn; the
    /// message names the channel and the problem.
    Replay(String),
    /// A chunked HTTP body whose framing is broken; the message says how.
    Chunked(String),
    /// A packed sample's replay rows (`what`) are not one per token.
    PackRows {
        sample: usize,
        what: &'static str,
        rows: usize,
        tokens: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::TokenId(message)
            | Error::Tokenizer(message)
            | Error::Replay(message)
            | Error::Chunked(message) => f.write_str(message),
            Error::LogprobLength { logprobs, outputs } => {
                write!(f, "{logprobs} logprobs for {outputs} output tokens")
            }
            Error::UnknownPolicy { shown, allowed } => {
                // The names as Python prints the tuple `POLICIES`.
                let names: Vec<String> = allowed.iter().map(|name| format!("'{name}'")).collect();
                let names = names.join(", ");
                write!(f, "unknown drift policy {shown}; expected one of ({names})")
            }
            Error::Negative { setting, value } => {
                write!(f, "{setting} must be >= 0, got {value}")
            }
            Error::Fork { turn, at } => write!(
                f,
                "turn {turn} forks from the held tokens at {at}; start a new builder"
            ),
            Error::TurnOutOfRange { chain, turn, turns } => write!(
                f,
                "chain {chain} names turn {turn}, but there are {turns} turns"
            ),
            Error::NoSuchTurn { what, turn, turns } => {
                write!(f, "{what} {turn} does not exist ({turns} turns stored)")
            }
            Error::PackCount { what, got, samples } => {
                write!(f, "{what}: {got} entries for {samples} samples")
            }
            Error::ResponseLength {
                sample,
                response_length,
                tokens,
            } => write!(
                f,
                "sample {sample}: response_length {response_length} is outside [0, {tokens}], \
                 its token count"
            ),
            Error::PackLength {
                sample,
                what,
                got,
                response_length,
            } => write!(
                f,
                "sample {sample}: {got} {what} entries for response_length {response_length}"
            ),
            Error::PackRows {
                sample,
                what,
                rows,
                tokens,
            } => write!(f, "sample {sample}: {rows} {what} rows for {tokens} tokens"),
            Error::PackTooLong { tokens, samples } => write!(
                f,
                "{samples} samples of {tokens} tokens in all do not fit int32 cu_seqlens"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// `value` as a count, or `Error::Negative` naming the setting.
pub fn non_negative(setting: &'static str, value: i64) -> Result<usize, Error> {
    usize::try_from(value).map_err(|_| Error::Negative { setting, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_match_the_reference() {
        let cases = [
            (
                Error::LogprobLength {
                    logprobs: 2,
                    outputs: 3,
                },
                "2 logprobs for 3 output tokens",
            ),
            (
                Error::UnknownPolicy {
                    shown: "'greedy'".into(),
                    allowed: &["minimal", "slime"],
                },
                "unknown drift policy 'greedy'; expected one of ('minimal', 'slime')",
            ),
            (
                Error::Negative {
                    setting: "fork_threshold",
                    value: -1,
                },
                "fork_threshold must be >= 0, got -1",
            ),
            (
                Error::Fork { turn: 4, at: 7 },
                "turn 4 forks from the held tokens at 7; start a new builder",
            ),
            (
                Error::TurnOutOfRange {
                    chain: 1,
                    turn: 9,
                    turns: 3,
                },
                "chain 1 names turn 9, but there are 3 turns",
            ),
            (
                Error::NoSuchTurn {
                    what: "parent turn",
                    turn: 5,
                    turns: 2,
                },
                "parent turn 5 does not exist (2 turns stored)",
            ),
            (
                Error::ResponseLength {
                    sample: 2,
                    response_length: -1,
                    tokens: 4,
                },
                "sample 2: response_length -1 is outside [0, 4], its token count",
            ),
            (
                Error::PackTooLong {
                    tokens: 1 << 31,
                    samples: 3,
                },
                "3 samples of 2147483648 tokens in all do not fit int32 cu_seqlens",
            ),
        ];
        for (error, message) in cases {
            assert_eq!(error.to_string(), message);
        }
    }

    #[test]
    fn non_negative_passes_counts_and_names_negatives() {
        assert_eq!(non_negative("x", 0), Ok(0));
        assert_eq!(non_negative("x", 5), Ok(5));
        assert_eq!(
            non_negative("x", -2),
            Err(Error::Negative {
                setting: "x",
                value: -2
            })
        );
    }
}
