//! Pre-tokenization by a chain of regex splits, giving exactly the pieces `tokenizers`' `Split`
//! pre-tokenizers (behavior `Isolated`, not inverted) give, one after the other, and the
//! regex split of a `ByteLevel` pre-tokenizer with `use_regex`.
//!
//! Each split cuts every piece of the one before into its matches and the text between them,
//! running the regex over that piece alone (so lookarounds and `$` see the piece's end), and
//! drops empty pieces. The regex engine is the one `tokenizers` is built with (`fancy-regex`),
//! and so is its quirk: a match that fails (the backtracking limit) ends the matching, and the
//! rest of the piece is one piece.
//!
//! Byte-level vocabularies end their split with `\s+(?!\S)|\s+` (whitespace before a word is
//! left to the word), and that lookahead sends every match through fancy-regex's backtracking
//! machine, a few times slower than the automata it runs its other parts on. Such a split runs
//! on the automata whole (`TrailingSpace`): the pattern without the lookahead, then, where its
//! match is a run of whitespace no earlier branch matches, the character the lookahead gives
//! back. A run too long for fancy-regex's machine goes to fancy-regex, quirk and all.
use std::ops::Range;

use fancy_regex::Regex;
use regex_automata::meta;
use regex_automata::util::syntax;
use regex_automata::{Anchored, Input};

/// The regex of the `ByteLevel` pre-tokenizer with `use_regex`: GPT-2's.
pub const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The branches a split ends with for `TrailingSpace` to run it.
const TRAILING_SPACE: &str = r"|\s+(?!\S)|\s+";

/// The longest whitespace run (bytes) `TrailingSpace` splits itself: fancy-regex's machine
/// pushes a backtracking point per character of a run, and past some 400,000 it fails (its
/// quirk above); a piece with a longer run is split by fancy-regex.
const LONG_RUN: usize = 1 << 16;

/// One split's regex, as fancy-regex runs it (what `tokenizers` runs), and on the automata
/// when it has the shape `TrailingSpace` takes.
struct Split {
    fancy: Regex,
    automata: Option<Box<TrailingSpace>>,
}

/// A split `EARLIER|\s+(?!\S)|\s+` whose `EARLIER` branches need no backtracking.
struct TrailingSpace {
    /// `EARLIER|\s+`: the split's matches, but for the character the lookahead gives back.
    any: meta::Regex,
    /// `EARLIER` alone, asked where `any` matched a run of whitespace: whether the run is
    /// its last branch's.
    earlier: meta::Regex,
}

impl TrailingSpace {
    /// The split of `pattern` when it has the shape, None otherwise.
    fn new(pattern: &str) -> Option<Self> {
        let earlier = pattern.strip_suffix(TRAILING_SPACE)?;
        // Every branch consumes something: no empty matches to step over.
        let hir = syntax::parse(earlier).ok()?;
        if hir.properties().minimum_len().unwrap_or(0) == 0
            || !hir.properties().look_set().is_empty()
        {
            return None;
        }
        Some(TrailingSpace {
            any: meta::Regex::new(&format!(r"{earlier}|\s+")).ok()?,
            earlier: meta::Regex::new(earlier).ok()?,
        })
    }

    /// The matches of the split in `text`, in order; None when `text` holds a whitespace run
    /// longer than `LONG_RUN` that the last branches would take.
    fn matches(&self, text: &str, found: &mut Vec<Range<usize>>) -> Option<()> {
        let mut at = 0;
        while let Some(m) = self.any.search(&Input::new(text).range(at..)) {
            let (start, mut end) = (m.start(), m.end());
            let run = &text[start..end];
            let long = run.len() > LONG_RUN;
            // A run of whitespace followed by more than whitespace: the last branches' (unless
            // an earlier branch matched it) leave its last character to what follows, when it
            // has more than one. A run ending the text is theirs whole.
            let gives_back = text[end..]
                .chars()
                .next()
                .is_some_and(|c| !c.is_whitespace())
                && run.chars().nth(1).is_some();
            if (gives_back || long)
                && run.chars().all(char::is_whitespace)
                && !self.earlier_matches_at(text, start)
            {
                if long {
                    return None;
                }
                end -= run.chars().next_back().map_or(0, char::len_utf8);
            }
            found.push(start..end);
            at = end;
        }
        Some(())
    }

    fn earlier_matches_at(&self, text: &str, at: usize) -> bool {
        let input = Input::new(text).range(at..).anchored(Anchored::Yes);
        self.earlier.search_half(&input).is_some()
    }
}

impl Split {
    fn new(pattern: &str) -> Result<Self, String> {
        // Built as `tokenizers` builds it first: a pattern it refuses is refused here.
        let fancy =
            Regex::new(pattern).map_err(|err| format!("its split regex does not build: {err}"))?;
        let automata = TrailingSpace::new(pattern).map(Box::new);
        Ok(Split { fancy, automata })
    }

    /// The matches of the split in `text`, in order (up to fancy-regex's failure, if any).
    fn matches(&self, text: &str, found: &mut Vec<Range<usize>>) {
        if let Some(automata) = &self.automata {
            if automata.matches(text, found).is_some() {
                return;
            }
            found.clear();
        }
        for m in self.fancy.find_iter(text) {
            let Ok(m) = m else { break };
            found.push(m.start()..m.end());
        }
    }
}

/// Regex splits applied in order.
pub struct Splitter {
    splits: Vec<Split>,
}

impl Splitter {
    /// The splits of `patterns`, in order, or why one is not a regex `tokenizers` accepts.
    pub fn new<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let splits = patterns
            .into_iter()
            .map(Split::new)
            .collect::<Result<_, _>>()?;
        Ok(Splitter { splits })
    }

    /// The splits of `patterns` all run by fancy-regex: what `tokenizers` runs.
    #[cfg(test)]
    fn fancy_only<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Self {
        let splits = patterns.into_iter().map(|p| Split {
            fancy: Regex::new(p).unwrap(),
            automata: None,
        });
        Splitter {
            splits: splits.collect(),
        }
    }

    /// Append the pieces of `text` to `pieces`, as byte ranges of `text`, in order.
    pub fn split(&self, text: &str, pieces: &mut Vec<Range<usize>>) {
        if text.is_empty() {
            return;
        }
        self.split_from(0, text, 0, pieces);
    }

    /// The pieces of `text` (which starts at `offset`) under the regexes from `level` on.
    fn split_from(&self, level: usize, text: &str, offset: usize, pieces: &mut Vec<Range<usize>>) {
        let Some(split) = self.splits.get(level) else {
            pieces.push(offset..offset + text.len());
            return;
        };
        let emit = |range: Range<usize>, pieces: &mut Vec<Range<usize>>| {
            if !range.is_empty() {
                self.split_from(
                    level + 1,
                    &text[range.clone()],
                    offset + range.start,
                    pieces,
                );
            }
        };
        let mut found = Vec::new();
        split.matches(text, &mut found);
        let mut done = 0;
        for m in found {
            if done != m.start {
                emit(done..m.start, pieces);
            }
            done = m.end;
            emit(m, pieces);
        }
        if done != text.len() {
            emit(done..text.len(), pieces);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::pre_tokenizers::PreTokenizerWrapper;
    use tokenizers::SplitDelimiterBehavior;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    const QWEN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    /// DeepSeek's three splits.
    const DEEPSEEK: [&str; 3] = [
        r"\p{N}{1,3}",
        r"[一-龥぀-ゟ゠-ヿ]+",
        r"[!\x22#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ];

    fn ours(patterns: &[&str], text: &str) -> Vec<String> {
        let splitter = Splitter::new(patterns.iter().copied()).unwrap();
        let mut pieces = Vec::new();
        splitter.split(text, &mut pieces);
        pieces.into_iter().map(|r| text[r].to_owned()).collect()
    }

    /// The pieces `tokenizers` gives, back in plain text (its ByteLevel maps bytes to chars).
    fn theirs(patterns: &[&str], byte_level_regex: bool, text: &str) -> Vec<String> {
        let mut steps: Vec<PreTokenizerWrapper> = patterns
            .iter()
            .map(|p| {
                let split = Split::new(
                    SplitPattern::Regex((*p).into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                );
                split.unwrap().into()
            })
            .collect();
        steps.push(ByteLevel::new(false, false, byte_level_regex).into());
        let mut pretokenized = PreTokenizedString::from(text);
        Sequence::new(steps)
            .pre_tokenize(&mut pretokenized)
            .unwrap();
        pretokenized
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(_, (start, end), _)| text[start..end].to_owned())
            .collect()
    }

    const TEXTS: [&str; 8] = [
        "Hello world, it's  2024!\n\n  def f(x):\n\treturn x+1   ",
        "汉字かなカナ漢字 mixed123456 ünïcödé e\u{301} 🦀🦀 ",
        "   \n\n\n   \t\t x",
        "",
        " ",
        "they'RE here'll I'M",
        "a/b//c\r\n\r\n",
        "1234567890 12 1",
    ];

    #[test]
    fn one_split_gives_the_pieces_tokenizers_gives() {
        for text in TEXTS {
            assert_eq!(
                ours(&[QWEN], text),
                theirs(&[QWEN], false, text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn a_chain_of_splits_gives_the_pieces_tokenizers_gives() {
        for text in TEXTS {
            assert_eq!(
                ours(&DEEPSEEK, text),
                theirs(&DEEPSEEK, false, text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn the_byte_level_regex_gives_the_pieces_tokenizers_gives() {
        for text in TEXTS {
            assert_eq!(
                ours(&[GPT2_PATTERN], text),
                theirs(&[], true, text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn long_runs_split_as_tokenizers_splits_them() {
        for text in [
            " ".repeat(6000),
            "a".repeat(6000),
            format!("{}x", "\n ".repeat(3000)),
        ] {
            assert_eq!(ours(&[QWEN], &text), theirs(&[QWEN], false, &text));
        }
        // Nothing is lost: the pieces cover the text.
        let text = "x ".repeat(100);
        assert_eq!(ours(&[QWEN], &text).concat(), text);
    }

    /// The split of every builtin vocabulary but DeepSeek's (in `DEEPSEEK`).
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN36: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const O200K: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    fn chains() -> Vec<Vec<&'static str>> {
        vec![
            vec![QWEN],
            vec![QWEN36],
            vec![LLAMA3],
            vec![O200K],
            DEEPSEEK.to_vec(),
            vec![GPT2_PATTERN],
        ]
    }

    fn pieces(splitter: &Splitter, text: &str) -> Vec<Range<usize>> {
        let mut pieces = Vec::new();
        splitter.split(text, &mut pieces);
        pieces
    }

    #[test]
    fn every_builtin_split_but_deepseeks_first_two_runs_on_the_automata() {
        for chain in chains() {
            let splitter = Splitter::new(chain.iter().copied()).unwrap();
            let trailing: Vec<bool> = splitter
                .splits
                .iter()
                .map(|s| s.automata.is_some())
                .collect();
            let expected: Vec<bool> = chain.iter().map(|p| p.ends_with(TRAILING_SPACE)).collect();
            assert_eq!(trailing, expected, "{chain:?}");
        }
        assert!(
            chains()
                .iter()
                .flatten()
                .filter(|p| p.ends_with(TRAILING_SPACE))
                .count()
                >= 6
        );
    }

    #[test]
    fn the_automata_split_generated_text_as_fancy_regex_does() {
        // Whitespace of every kind `\s` knows (and some it does not: a zero-width space, a
        // byte-order mark), at every place a run can meet the branches before the last two.
        const PARTS: [&str; 34] = [
            " ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\u{a0}", "\u{3000}", "\u{2028}", "\u{85}",
            "\u{1680}", "\u{200b}", "\u{feff}", "\u{b}", "\u{c}", "a", "Z", "é", "e\u{301}", "汉",
            "か", "1", "23", "'s", "'LL", "!", "//", "(", "🦀", "_", "x'", "\n ", " \n",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for chain in chains() {
            let (fast, reference) = (
                Splitter::new(chain.iter().copied()).unwrap(),
                Splitter::fancy_only(chain.iter().copied()),
            );
            for _ in 0..4000 {
                let len = 1 + next(24);
                let text: String = (0..len).map(|_| PARTS[next(PARTS.len())]).collect();
                assert_eq!(
                    pieces(&fast, &text),
                    pieces(&reference, &text),
                    "{chain:?} {text:?}"
                );
            }
        }
    }

    #[test]
    fn a_run_too_long_for_the_automata_is_split_by_fancy_regex() {
        for chain in chains() {
            let (fast, reference) = (
                Splitter::new(chain.iter().copied()).unwrap(),
                Splitter::fancy_only(chain.iter().copied()),
            );
            for text in [
                format!("a{}x", " ".repeat(LONG_RUN + 1)),
                format!("{} \n", "\t".repeat(LONG_RUN + 7)),
                format!("x{}", "\u{3000}".repeat(LONG_RUN / 3 + 1)),
            ] {
                assert_eq!(pieces(&fast, &text), pieces(&reference, &text), "{chain:?}");
            }
        }
        // A run fancy-regex's machine fails on: the rest of the piece is one piece, as there.
        let text = format!("a{}x y", " ".repeat(1 << 20));
        let (fast, reference) = (Splitter::new([QWEN]).unwrap(), Splitter::fancy_only([QWEN]));
        let split = pieces(&fast, &text);
        assert_eq!(split, [0..1, 1..text.len()]);
        assert_eq!(split, pieces(&reference, &text));
    }
}
