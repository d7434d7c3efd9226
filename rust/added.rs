//! Added tokens (`<|im_start|>`, `<think>`, ...) found in a text exactly where `tokenizers`'
//! added vocabulary finds them (`AddedVocabulary::extract_and_normalize`).
//!
//! That is two passes: tokens with `normalized=False` are matched in the raw text, then tokens
//! with `normalized=True`, in their normalized form, in the normalized text between those
//! matches. Each pass takes the leftmost-longest matches of one automaton, built with the same
//! crate and match kind. Tokens with `lstrip`, `rstrip` or `single_word`, and special tokens
//! encoded as text, change matches by the text around them: such a vocabulary is refused, and
//! the caller keeps `tokenizers`.
use std::ops::Range;

use daachorse::{DoubleArrayAhoCorasick, DoubleArrayAhoCorasickBuilder, MatchKind};
use tokenizers::Tokenizer;

/// One part of a text: plain text, or an added token with the text it covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    Text(Range<usize>),
    Token(u32, Range<usize>),
}

/// Which of the two passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// `normalized=False` tokens, in the raw text.
    Raw,
    /// `normalized=True` tokens, in the normalized text between the raw matches.
    Normalized,
}

/// The two automata of a tokenizer's added tokens.
pub struct AddedTokens {
    raw: Option<DoubleArrayAhoCorasick<u32>>,
    normalized: Option<DoubleArrayAhoCorasick<u32>>,
}

impl AddedTokens {
    /// The added tokens of `tokenizer`; `normalize` gives a token's normalized form, as the
    /// tokenizer's normalizer does. Or why their matches depend on more than their content.
    pub fn new(tokenizer: &Tokenizer, normalize: impl Fn(&str) -> String) -> Result<Self, String> {
        if tokenizer.get_encode_special_tokens() {
            return Err("it encodes special tokens as plain text (encode_special_tokens)".into());
        }
        let mut raw = Vec::new();
        let mut normalized = Vec::new();
        let mut decoder: Vec<_> = tokenizer.get_added_tokens_decoder().into_iter().collect();
        decoder.sort_unstable_by_key(|(id, _)| *id);
        for (id, token) in decoder {
            let flag = [
                ("lstrip", token.lstrip),
                ("rstrip", token.rstrip),
                ("single_word", token.single_word),
            ]
            .into_iter()
            .find_map(|(flag, set)| set.then_some(flag));
            if let Some(flag) = flag {
                return Err(format!("added token {:?} has {flag}=True", token.content));
            }
            if token.content.is_empty() {
                continue;
            }
            if token.normalized {
                normalized.push((normalize(&token.content), id));
            } else {
                raw.push((token.content, id));
            }
        }
        Ok(AddedTokens {
            raw: automaton(raw)?,
            normalized: automaton(normalized)?,
        })
    }

    /// Whether no token is matched in `pass`.
    pub fn is_empty(&self, pass: Pass) -> bool {
        self.automaton(pass).is_none()
    }

    fn automaton(&self, pass: Pass) -> Option<&DoubleArrayAhoCorasick<u32>> {
        match pass {
            Pass::Raw => self.raw.as_ref(),
            Pass::Normalized => self.normalized.as_ref(),
        }
    }

    /// Append the parts of `text` to `parts`: the matches of `pass` and the non-empty text
    /// around them, in order, covering `text`.
    pub fn split(&self, pass: Pass, text: &str, parts: &mut Vec<Part>) {
        let Some(automaton) = self.automaton(pass) else {
            if !text.is_empty() {
                parts.push(Part::Text(0..text.len()));
            }
            return;
        };
        let mut done = 0;
        for found in automaton.leftmost_find_iter(text) {
            if done < found.start() {
                parts.push(Part::Text(done..found.start()));
            }
            parts.push(Part::Token(found.value(), found.start()..found.end()));
            done = found.end();
        }
        if done != text.len() {
            parts.push(Part::Text(done..text.len()));
        }
    }
}

fn automaton(patterns: Vec<(String, u32)>) -> Result<Option<DoubleArrayAhoCorasick<u32>>, String> {
    if patterns.is_empty() {
        return Ok(None);
    }
    DoubleArrayAhoCorasickBuilder::new()
        .match_kind(MatchKind::LeftmostLongest)
        .build_with_values(patterns)
        .map(Some)
        .map_err(|err| format!("cannot match its added tokens: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::AddedToken;

    fn tokens(added: Vec<AddedToken>) -> Result<(AddedTokens, Tokenizer), String> {
        let mut tokenizer = Tokenizer::new(WordLevel::default());
        tokenizer.add_tokens(added).unwrap();
        let tokens = AddedTokens::new(&tokenizer, |s| s.to_uppercase())?;
        Ok((tokens, tokenizer))
    }

    fn parts(tokens: &AddedTokens, pass: Pass, text: &str) -> Vec<Part> {
        let mut parts = Vec::new();
        tokens.split(pass, text, &mut parts);
        parts
    }

    fn raw(content: &str) -> AddedToken {
        AddedToken::from(content, false).normalized(false)
    }

    #[test]
    fn leftmost_longest_matches_split_the_text() {
        let (t, tok) = tokens(vec![raw("<a>"), raw("<a>b"), raw("b")]).unwrap();
        let id = |s: &str| tok.token_to_id(s).unwrap();
        assert_eq!(
            parts(&t, Pass::Raw, "x<a>bb<a>"),
            [
                Part::Text(0..1),
                Part::Token(id("<a>b"), 1..5),
                Part::Token(id("b"), 5..6),
                Part::Token(id("<a>"), 6..9),
            ]
        );
        assert_eq!(parts(&t, Pass::Normalized, "x<a>"), [Part::Text(0..4)]);
        assert_eq!(parts(&t, Pass::Normalized, ""), []);
        assert_eq!(parts(&t, Pass::Raw, ""), []);
    }

    #[test]
    fn normalized_tokens_match_their_normalized_form_in_the_second_pass() {
        let (t, tok) = tokens(vec![AddedToken::from("<n>", false)]).unwrap();
        let id = tok.token_to_id("<n>").unwrap();
        assert_eq!(parts(&t, Pass::Raw, "<n>"), [Part::Text(0..3)]);
        assert_eq!(
            parts(&t, Pass::Normalized, "x<N>"),
            [Part::Text(0..1), Part::Token(id, 1..4)]
        );
        assert!(t.is_empty(Pass::Raw));
    }

    #[test]
    fn tokens_whose_matches_depend_on_their_surroundings_are_refused() {
        let err = |token: AddedToken| tokens(vec![raw("<a>"), token]).err().unwrap();
        assert_eq!(
            err(raw("<l>").lstrip(true)),
            r#"added token "<l>" has lstrip=True"#
        );
        assert_eq!(
            err(raw("<r>").rstrip(true)),
            r#"added token "<r>" has rstrip=True"#
        );
        assert_eq!(
            err(raw("w").single_word(true)),
            r#"added token "w" has single_word=True"#
        );
        let mut tokenizer = Tokenizer::new(WordLevel::default());
        tokenizer
            .add_special_tokens([AddedToken::from("<s>", true)])
            .unwrap();
        tokenizer.set_encode_special_tokens(true);
        assert!(AddedTokens::new(&tokenizer, str::to_owned)
            .err()
            .unwrap()
            .contains("encode_special_tokens"));
    }
}
