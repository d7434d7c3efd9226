//! Pre-tokenization by a chain of regex splits, giving exactly the pieces `tokenizers`' `Split`
//! pre-tokenizers (behavior `Isolated`, not inverted) give, one after the other, and the
//! regex split of a `ByteLevel` pre-tokenizer with `use_regex`.
//!
//! Each split cuts every piece of the one before into its matches and the text between them,
//! running the regex over that piece alone (so lookarounds and `$` see the piece's end), and
//! drops empty pieces. The regex engine is the one `tokenizers` is built with (`fancy-regex`),
//! and so is its quirk: a match that fails (the backtracking limit) ends the matching, and the
//! rest of the piece is one piece.
use std::ops::Range;

use fancy_regex::Regex;

/// The regex of the `ByteLevel` pre-tokenizer with `use_regex`: GPT-2's.
pub const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Regex splits applied in order.
pub struct Splitter {
    regexes: Vec<Regex>,
}

impl Splitter {
    /// The splits of `patterns`, in order, or why one is not a regex `tokenizers` accepts.
    pub fn new<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let regexes = patterns
            .into_iter()
            .map(|pattern| {
                Regex::new(pattern).map_err(|err| format!("its split regex does not build: {err}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Splitter { regexes })
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
        let Some(regex) = self.regexes.get(level) else {
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
        let mut done = 0;
        for found in regex.find_iter(text) {
            let Ok(found) = found else { break };
            if done != found.start() {
                emit(done..found.start(), pieces);
            }
            emit(found.start()..found.end(), pieces);
            done = found.end();
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
}
