//! A fast encoder for byte-level BPE tokenizers, giving exactly the ids `tokenizers` gives
//! (`add_special_tokens=false`) for the configurations it can prove it reproduces, and why not
//! for the others.
//!
//! It does what `tokenizers` does, in bytes and without its bookkeeping (offsets, alignments,
//! one `String` per piece): split off added tokens, normalize the text between them (NFC, and
//! only when a quick check says the text may change), split that by the pre-tokenizer's
//! regexes, and merge each piece's bytes, with a bounded cache of merged pieces. Tokens are
//! looked up by the bytes they stand for, so the byte-to-char mapping of `ByteLevel` is only
//! undone once, on the vocabulary.
use std::borrow::Cow;
use std::ops::Range;
use std::sync::Mutex;

use ahash::AHashMap;
use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::split::SplitPattern;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{SplitDelimiterBehavior, Tokenizer};
use unicode_normalization_alignments::{is_nfc_quick, IsNormalized, UnicodeNormalization};

use crate::added::{AddedTokens, Part, Pass};
use crate::bpe::{BytePairModel, PieceCache, Scratch};
use crate::pretokenize::{Splitter, GPT2_PATTERN};

/// An encoder that reproduces one tokenizer's ids.
pub struct FastEncoder {
    added: AddedTokens,
    /// Whether the text between raw-text added tokens is NFC-normalized.
    nfc: bool,
    splitter: Splitter,
    model: BytePairModel,
    /// Shared by every caller; one that finds it busy goes without.
    cache: Mutex<PieceCache>,
}

/// An added token met while encoding: where its id is in the ids, and the raw text it covers
/// (unknown for a token matched in text that normalizing changed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub at: usize,
    pub range: Option<Range<usize>>,
}

impl FastEncoder {
    /// The encoder of `tokenizer`, or why it might not give `tokenizer`'s ids.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, String> {
        if tokenizer.get_truncation().is_some() {
            return Err("it truncates encodings".into());
        }
        if tokenizer.get_padding().is_some() {
            return Err("it pads encodings".into());
        }
        let nfc = match tokenizer.get_normalizer() {
            None => false,
            Some(normalizer) => nfc_normalizer(normalizer)?,
        };
        let patterns = match tokenizer.get_pre_tokenizer() {
            None => return Err("it has no pre-tokenizer, so it is not byte-level".into()),
            Some(pre_tokenizer) => split_patterns(pre_tokenizer)?,
        };
        let splitter = Splitter::new(patterns.iter().map(String::as_str))?;
        let model = byte_pair_model(tokenizer.get_model())?;
        let added = AddedTokens::new(tokenizer, |content| normalize(nfc, content).into_owned())?;
        Ok(FastEncoder {
            added,
            nfc,
            splitter,
            model,
            cache: Mutex::new(PieceCache::default()),
        })
    }

    /// Append the ids of `text` to `ids`, and the added tokens met to `found`.
    pub fn encode(&self, text: &str, ids: &mut Vec<u32>, found: &mut Vec<Found>) {
        let mut guard = self.cache.try_lock().ok();
        let mut work = Work {
            scratch: Scratch::default(),
            cache: guard.as_deref_mut(),
            parts: Vec::new(),
            pieces: Vec::new(),
        };
        let mut sections = Vec::new();
        self.added.split(Pass::Raw, text, &mut sections);
        for part in sections {
            match part {
                Part::Token(id, range) => {
                    found.push(Found {
                        at: ids.len(),
                        range: Some(range),
                    });
                    ids.push(id);
                }
                Part::Text(range) => {
                    self.section(&text[range.clone()], range.start, ids, found, &mut work)
                }
            }
        }
    }

    /// The ids of the text between two raw-text added tokens, which starts at `offset`.
    fn section(
        &self,
        raw: &str,
        offset: usize,
        ids: &mut Vec<u32>,
        found: &mut Vec<Found>,
        work: &mut Work<'_>,
    ) {
        let text = normalize(self.nfc, raw);
        let unchanged = matches!(text, Cow::Borrowed(_));
        work.parts.clear();
        self.added.split(Pass::Normalized, &text, &mut work.parts);
        for part in std::mem::take(&mut work.parts) {
            match part {
                Part::Token(id, range) => {
                    let range = unchanged.then(|| offset + range.start..offset + range.end);
                    found.push(Found {
                        at: ids.len(),
                        range,
                    });
                    ids.push(id);
                }
                Part::Text(range) => {
                    let words = &text[range];
                    work.pieces.clear();
                    self.splitter.split(words, &mut work.pieces);
                    for piece in &work.pieces {
                        let bytes = &words.as_bytes()[piece.clone()];
                        self.model
                            .encode(bytes, ids, &mut work.scratch, work.cache.as_deref_mut());
                    }
                }
            }
        }
    }
}

/// What one encode reuses from part to part.
struct Work<'a> {
    scratch: Scratch,
    cache: Option<&'a mut PieceCache>,
    parts: Vec<Part>,
    pieces: Vec<Range<usize>>,
}

/// `text` as the normalizer leaves it: NFC only when the quick check cannot rule out a change.
fn normalize(nfc: bool, text: &str) -> Cow<'_, str> {
    if !nfc || text.is_ascii() || is_nfc_quick(text.chars()) == IsNormalized::Yes {
        return Cow::Borrowed(text);
    }
    // The iterator `tokenizers`' NFC normalizer runs, from the same crate.
    Cow::Owned(text.nfc().map(|(c, _)| c).collect())
}

fn kind<T: serde::Serialize>(component: &T) -> String {
    serde_json::to_value(component)
        .ok()
        .and_then(|value| value.get("type")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// Whether `normalizer` is NFC (true) or changes nothing (false); why not, when it is neither.
fn nfc_normalizer(normalizer: &NormalizerWrapper) -> Result<bool, String> {
    match normalizer {
        NormalizerWrapper::NFC(_) => Ok(true),
        NormalizerWrapper::Sequence(sequence) => {
            let mut nfc = false;
            for step in sequence.as_ref() {
                nfc |= nfc_normalizer(step)?;
            }
            Ok(nfc)
        }
        other => Err(format!("its normalizer {} is not NFC", kind(other))),
    }
}

/// The regexes of `pre_tokenizer`, in order, when it is splits then one byte-level step.
fn split_patterns(pre_tokenizer: &PreTokenizerWrapper) -> Result<Vec<String>, String> {
    let mut steps = Vec::new();
    flatten(pre_tokenizer, &mut steps);
    let Some((PreTokenizerWrapper::ByteLevel(byte_level), splits)) = steps.split_last() else {
        return Err("its pre-tokenizer does not end with ByteLevel".into());
    };
    if byte_level.add_prefix_space {
        return Err("its ByteLevel pre-tokenizer adds a prefix space".into());
    }
    let mut patterns = splits
        .iter()
        .map(|step| match step {
            PreTokenizerWrapper::Split(split)
                if split.behavior == SplitDelimiterBehavior::Isolated && !split.invert =>
            {
                match &split.pattern {
                    SplitPattern::Regex(pattern) => Ok(pattern.clone()),
                    SplitPattern::String(_) => {
                        Err("its Split pre-tokenizer splits on a string".into())
                    }
                }
            }
            PreTokenizerWrapper::Split(split) => Err(format!(
                "its Split pre-tokenizer is {:?}{}, not Isolated",
                split.behavior,
                if split.invert { " inverted" } else { "" }
            )),
            other => Err(format!(
                "its pre-tokenizer {} comes before ByteLevel",
                kind(*other)
            )),
        })
        .collect::<Result<Vec<_>, String>>()?;
    if byte_level.use_regex {
        patterns.push(GPT2_PATTERN.into());
    }
    Ok(patterns)
}

fn flatten<'a>(pre_tokenizer: &'a PreTokenizerWrapper, steps: &mut Vec<&'a PreTokenizerWrapper>) {
    match pre_tokenizer {
        PreTokenizerWrapper::Sequence(sequence) => sequence
            .as_ref()
            .iter()
            .for_each(|step| flatten(step, steps)),
        step => steps.push(step),
    }
}

/// The byte-level BPE of `model`, or why it is not one this encoder reproduces.
fn byte_pair_model(model: &ModelWrapper) -> Result<BytePairModel, String> {
    let ModelWrapper::BPE(bpe) = model else {
        return Err(format!("its model {} is not BPE", kind(model)));
    };
    if bpe.dropout.is_some_and(|p| p > 0.0) {
        return Err("its BPE model has dropout, so encodes are random".into());
    }
    if bpe.byte_fallback {
        return Err("its BPE model has byte_fallback".into());
    }
    let affix = |affix: &Option<String>| affix.as_deref().is_some_and(|a| !a.is_empty());
    if affix(&bpe.continuing_subword_prefix) || affix(&bpe.end_of_word_suffix) {
        return Err(
            "its BPE model marks subwords (continuing_subword_prefix, end_of_word_suffix)".into(),
        );
    }
    let to_bytes = byte_level_decoder();
    // Tokens spelled with chars no byte stands for are never met in byte-level text, and
    // neither are the merges of such tokens: leaving them out changes no id, and the order
    // of the merges kept is the order `tokenizers` ranks them in.
    let tokens = bpe
        .get_vocab()
        .into_iter()
        .filter_map(|(token, id)| Some((to_bytes(&token)?, id)));
    // The merges in rank order, as `tokenizers` serializes its merge map.
    let read = |err: serde_json::Error| format!("cannot read its merges: {err}");
    let serialized = serde_json::to_string(bpe).map_err(read)?;
    let Merges { merges } = serde_json::from_str(&serialized).map_err(read)?;
    let merges = merges
        .into_iter()
        .filter_map(|(left, right)| Some((to_bytes(&left)?, to_bytes(&right)?)));
    BytePairModel::new(tokens, merges, bpe.ignore_merges)
}

/// The merges of a serialized BPE model, its other fields skipped.
#[derive(serde::Deserialize)]
struct Merges {
    merges: Vec<(String, String)>,
}

/// GPT-2's mapping of bytes to printable chars, which `ByteLevel` writes tokens in: the bytes
/// of a token's chars, or `None` when a char stands for no byte.
pub(crate) fn byte_level_decoder() -> impl Fn(&str) -> Option<Vec<u8>> {
    let mut by_char = AHashMap::with_capacity(256);
    let mut shifted = 0;
    for byte in 0..=255u8 {
        let printable = matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(byte)
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).expect("a char below 0x200")
        };
        by_char.insert(c, byte);
    }
    move |token: &str| token.chars().map(|c| by_char.get(&c).copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokenizers::pre_tokenizers::byte_level::ByteLevel;

    #[test]
    fn the_byte_mapping_is_byte_levels() {
        let decode = byte_level_decoder();
        let alphabet = ByteLevel::alphabet();
        assert_eq!(alphabet.len(), 256);
        let mut bytes: Vec<u8> = alphabet
            .iter()
            .map(|c| decode(&c.to_string()).unwrap()[0])
            .collect();
        bytes.sort_unstable();
        assert_eq!(bytes, (0..=255).collect::<Vec<u8>>());
        assert_eq!(decode("Ġhello"), Some(b" hello".to_vec()));
        assert_eq!(decode("ĊĉĠ"), Some(b"\n\t ".to_vec()));
        assert_eq!(decode("é"), Some(vec![0xE9]));
        assert_eq!(decode("<|x|>汉"), None);
    }

    #[test]
    fn nfc_is_applied_only_when_it_changes_the_text() {
        assert!(matches!(normalize(true, "plain ascii"), Cow::Borrowed(_)));
        assert!(matches!(normalize(true, "汉字 é 🦀"), Cow::Borrowed(_)));
        assert_eq!(normalize(true, "e\u{301}"), "é");
        assert_eq!(normalize(false, "e\u{301}"), "e\u{301}");
    }
}
