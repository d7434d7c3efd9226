//! Incremental tokenization: encode a session's new prompt by reusing the ids of the old one up
//! to the last added token the two share, and encoding only the text after it.
//!
//! `tokenizers` extracts added tokens from the raw text first, then normalizes, pre-tokenizes
//! and encodes each section between them on its own (`AddedVocabulary::extract_and_normalize`).
//! So the ids of a text are the ids of its sections and added tokens, in order, and a prompt can
//! be resumed right after an added token, provided the loaded tokenizer's configuration
//! guarantees that nothing before or after such a boundary changes how it is split:
//! [`unsafe_reason`] checks that once, and without that proof every encode is a full encode.
//!
//! Whatever is encoded goes through the fast encoder ([`FastEncoder`]) when it reproduces the
//! loaded tokenizer exactly, and through `tokenizers` otherwise.
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::metaspace::PrependScheme;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, Tokenizer};

use crate::error::Error;
use crate::fast::{FastEncoder, Found};
use crate::prefix::common_prefix_bytes;

/// A tokenizer that remembers, per session, the last prompt it encoded, and encodes the next
/// one from the last safe boundary the two share. Every result equals a full encode
/// (`add_special_tokens=false`).
pub struct IncrementalTokenizer {
    /// Shared by `fork`s: loading a large vocabulary is the costly part.
    tokenizer: Arc<Tokenizer>,
    /// Each added token's content by id: a prompt may be resumed right after one of them.
    /// Empty when boundaries are not proven safe.
    resumable: HashMap<u32, String>,
    fallback_reason: Option<String>,
    /// The fast encoder, or why `tokenizers` encodes instead.
    fast: Result<Arc<FastEncoder>, String>,
    sessions: HashMap<String, Session>,
    reused_ids: u64,
    encoded_bytes: u64,
}

/// The last prompt of one session, its ids, and where it may be resumed.
#[derive(Default)]
struct Session {
    text: String,
    ids: Vec<u32>,
    /// In increasing order of `byte` (and of `ids`).
    boundaries: Vec<Boundary>,
}

/// A byte offset right after an added token, and how many ids the text up to it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Boundary {
    byte: usize,
    ids: usize,
}

impl IncrementalTokenizer {
    /// Load a tokenizer.json and decide, from its configuration, whether boundaries after its
    /// added tokens are safe to resume from.
    pub fn from_json(json: &str) -> Result<Self, Error> {
        let tokenizer = Tokenizer::from_str(json)
            .map_err(|err| Error::Tokenizer(format!("cannot load the tokenizer.json: {err}")))?;
        Ok(Self::new(tokenizer))
    }

    pub fn new(tokenizer: Tokenizer) -> Self {
        let fallback_reason = unsafe_reason(&tokenizer);
        let resumable = match fallback_reason {
            Some(_) => HashMap::new(),
            None => tokenizer
                .get_added_tokens_decoder()
                .into_iter()
                .map(|(id, token)| (id, token.content))
                .collect(),
        };
        let fast = FastEncoder::new(&tokenizer).map(Arc::new);
        IncrementalTokenizer {
            tokenizer: Arc::new(tokenizer),
            resumable,
            fallback_reason,
            fast,
            sessions: HashMap::new(),
            reused_ids: 0,
            encoded_bytes: 0,
        }
    }

    /// This tokenizer encoding through `tokenizers` only, as when no fast encoder fits.
    pub fn without_fast_path(mut self) -> Self {
        self.fast = Err("the fast path is turned off".into());
        self
    }

    /// A tokenizer sharing this one's vocabulary and rules, with no session kept.
    pub fn fork(&self) -> Self {
        IncrementalTokenizer {
            tokenizer: Arc::clone(&self.tokenizer),
            resumable: self.resumable.clone(),
            fallback_reason: self.fallback_reason.clone(),
            fast: self.fast.clone(),
            sessions: HashMap::new(),
            reused_ids: 0,
            encoded_bytes: 0,
        }
    }

    /// Whether prompts are resumed after added tokens; when not, every encode is a full one.
    pub fn safe(&self) -> bool {
        self.fallback_reason.is_none()
    }

    /// Why boundaries are not safe for this tokenizer, when they are not.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// Whether text is encoded by the fast encoder rather than by `tokenizers`.
    pub fn fast_path(&self) -> bool {
        self.fast.is_ok()
    }

    /// Why text is encoded by `tokenizers`, when it is.
    pub fn fast_path_reason(&self) -> Option<&str> {
        self.fast.as_ref().err().map(String::as_str)
    }

    /// The ids of `text`, reusing those of `session`'s previous text up to the last boundary
    /// at or before where the two texts part. A failed encode forgets the session.
    pub fn encode(&mut self, session: &str, text: &str) -> Result<Vec<u32>, Error> {
        if !self.safe() {
            self.encoded_bytes += text.len() as u64;
            return self.encode_full(text);
        }
        let Some(mut state) = self.sessions.remove(session) else {
            let mut state = Session::default();
            self.extend(&mut state, text, Boundary { byte: 0, ids: 0 })?;
            return Ok(self.keep(session, state));
        };
        if state.text == text {
            self.reused_ids += state.ids.len() as u64;
            return Ok(self.keep(session, state));
        }
        let common = common_prefix_bytes(state.text.as_bytes(), text.as_bytes());
        let kept = state.boundaries.partition_point(|b| b.byte <= common);
        let resume = match kept {
            0 => Boundary { byte: 0, ids: 0 },
            _ => state.boundaries[kept - 1],
        };
        state.boundaries.truncate(kept);
        state.ids.truncate(resume.ids);
        self.extend(&mut state, text, resume)?;
        self.reused_ids += resume.ids as u64;
        Ok(self.keep(session, state))
    }

    /// The ids of `text`, encoded in full; no session is read or kept.
    pub fn encode_full(&self, text: &str) -> Result<Vec<u32>, Error> {
        if let Ok(fast) = &self.fast {
            let mut ids = Vec::with_capacity(text.len() / 3);
            fast.encode(text, &mut ids, &mut Vec::new());
            return Ok(ids);
        }
        let encoding = self.tokenizer.encode(text, false).map_err(encode_error)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Drop what is kept for `session`; whether there was anything.
    pub fn forget(&mut self, session: &str) -> bool {
        self.sessions.remove(session).is_some()
    }

    /// How many sessions have a prompt kept.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Ids taken from kept prompts instead of being encoded, over all `encode` calls.
    pub fn reused_ids(&self) -> u64 {
        self.reused_ids
    }

    /// Bytes of text actually run through the tokenizer, over all `encode` calls.
    pub fn encoded_bytes(&self) -> u64 {
        self.encoded_bytes
    }

    /// Encode `text` from `resume` on, appending to `state`'s ids and boundaries, which hold
    /// exactly what lies before `resume`; then `state` holds `text`.
    fn extend(&mut self, state: &mut Session, text: &str, resume: Boundary) -> Result<(), Error> {
        let tail = &text[resume.byte..];
        state.text.clear();
        state.text.push_str(text);
        if tail.is_empty() && resume.byte > 0 {
            // The full encode has no section after the boundary: nothing follows.
            return Ok(());
        }
        self.encoded_bytes += tail.len() as u64;
        if let Ok(fast) = &self.fast {
            let mut found = Vec::new();
            let start = state.ids.len();
            fast.encode(tail, &mut state.ids, &mut found);
            // As below: an added token that covers its content in the raw text.
            for Found { at, range } in found {
                let Some(range) = range else { continue };
                if let Some(content) = self.resumable.get(&state.ids[at]) {
                    if tail.get(range.clone()) == Some(content.as_str()) {
                        state.boundaries.push(Boundary {
                            byte: resume.byte + range.end,
                            ids: resume.ids + (at - start) + 1,
                        });
                    }
                }
            }
            return Ok(());
        }
        let encoding = self.tokenizer.encode(tail, false).map_err(encode_error)?;
        let ids = encoding.get_ids();
        // An added token is the one token of its section, its offsets those of its content in
        // the raw text. A model token cannot pass for one: its text would be that content,
        // which the added vocabulary would have extracted first.
        for (at, (id, &(start, end))) in ids.iter().zip(encoding.get_offsets()).enumerate() {
            if let Some(content) = self.resumable.get(id) {
                if tail.get(start..end) == Some(content.as_str()) {
                    state.boundaries.push(Boundary {
                        byte: resume.byte + end,
                        ids: resume.ids + at + 1,
                    });
                }
            }
        }
        state.ids.extend_from_slice(ids);
        Ok(())
    }

    /// Keep `state` for `session` and return a copy of its ids.
    fn keep(&mut self, session: &str, state: Session) -> Vec<u32> {
        let ids = state.ids.clone();
        self.sessions.insert(session.to_owned(), state);
        ids
    }
}

fn encode_error(err: tokenizers::Error) -> Error {
    Error::Tokenizer(format!("cannot encode the text: {err}"))
}

/// Why a boundary right after an added token might not split `tokenizer`'s encodings there,
/// or `None` when it always does.
///
/// The boundary after an added token match at `[s, e)` is safe when the match does not depend
/// on the text around it, and the sections on either side are encoded on their own:
/// - the token matches the raw text, or the normalized text of a normalizer that changes
///   nothing (DeepSeek's empty `Sequence`), and neither strips whitespace around it nor needs
///   word boundaries (`lstrip`, `rstrip`, `single_word`);
/// - no token's content occurs inside another's before its end: the added vocabulary takes the
///   leftmost, then longest match, so such a token could start before `e` and end after it
///   once the text after `e` changes;
/// - raw-text tokens are matched first, normalized ones in what is left: no raw-text token may
///   start inside a normalized one and end after it, or it would take that text first once
///   the text after `e` changes;
/// - special tokens are split off (`encode_special_tokens` is off);
/// - the pre-tokenizer and the model see one section at a time and only its text: a Metaspace
///   pre-tokenizer that prepends only at the start of the text, and BPE dropout, break that;
/// - nothing is added to or cut from the ids afterwards: no truncation, no padding. No
///   post-processor changes ids when no special tokens are added.
pub fn unsafe_reason(tokenizer: &Tokenizer) -> Option<String> {
    if tokenizer.get_truncation().is_some() {
        return Some("it truncates encodings".into());
    }
    if tokenizer.get_padding().is_some() {
        return Some("it pads encodings".into());
    }
    if tokenizer.get_encode_special_tokens() {
        return Some("it encodes special tokens as plain text (encode_special_tokens)".into());
    }
    let added = tokenizer.get_added_tokens_decoder();
    if added.is_empty() {
        return Some("it has no added tokens to resume after".into());
    }
    let mut tokens: Vec<&AddedToken> = added.values().collect();
    tokens.sort_by(|a, b| a.content.cmp(&b.content));
    let identity = tokenizer.get_normalizer().is_none_or(is_identity);
    tokens
        .iter()
        .find_map(|token| added_token_reason(token, identity))
        .or_else(|| nested_token_reason(&tokens))
        .or_else(|| straddling_token_reason(&tokens))
        .or_else(|| tokenizer.get_normalizer().and_then(normalizer_reason))
        .or_else(|| tokenizer.get_pre_tokenizer().and_then(pre_tokenizer_reason))
        .or_else(|| model_reason(tokenizer.get_model()))
        .or_else(|| {
            tokenizer
                .get_post_processor()
                .and_then(post_processor_reason)
        })
}

/// A normalizer that leaves every text as it is: an empty `Sequence` (or one of such).
fn is_identity(normalizer: &NormalizerWrapper) -> bool {
    match normalizer {
        NormalizerWrapper::Sequence(sequence) => sequence.as_ref().iter().all(is_identity),
        _ => false,
    }
}

/// `identity`: the tokenizer's normalizer changes nothing, so a normalized token matches the
/// raw text.
fn added_token_reason(token: &AddedToken, identity: bool) -> Option<String> {
    let flag = [
        ("normalized", token.normalized && !identity),
        ("lstrip", token.lstrip),
        ("rstrip", token.rstrip),
        ("single_word", token.single_word),
    ]
    .into_iter()
    .find_map(|(flag, set)| set.then_some(flag))?;
    Some(format!("added token {:?} has {flag}=True", token.content))
}

/// The first token (in `tokens`' order) whose content occurs inside another's before its end.
fn nested_token_reason(tokens: &[&AddedToken]) -> Option<String> {
    let contents: std::collections::HashSet<&str> =
        tokens.iter().map(|t| t.content.as_str()).collect();
    tokens.iter().find_map(|outer| {
        let outer = outer.content.as_str();
        // Every piece of `outer` that ends before its end, on char boundaries (a token's
        // content is a whole string, so an occurrence cannot start or end inside a char).
        let cuts: Vec<usize> = outer.char_indices().map(|(at, _)| at).collect();
        cuts.iter().enumerate().find_map(|(i, &start)| {
            cuts[i + 1..]
                .iter()
                .map(|&end| &outer[start..end])
                .find(|inner| contents.contains(inner))
                .map(|inner| format!("added token {inner:?} occurs inside added token {outer:?}"))
        })
    })
}

/// The first raw-text token (in `tokens`' order) that can start inside a normalized token and
/// end after it.
fn straddling_token_reason(tokens: &[&AddedToken]) -> Option<String> {
    let raw: Vec<&str> = tokens
        .iter()
        .filter(|t| !t.normalized)
        .map(|t| t.content.as_str())
        .collect();
    tokens.iter().filter(|t| t.normalized).find_map(|inner| {
        let inner = inner.content.as_str();
        inner
            .char_indices()
            .skip(1)
            .find_map(|(at, _)| {
                let tail = &inner[at..];
                raw.iter()
                    .find(|outer| outer.len() > tail.len() && outer.starts_with(tail))
            })
            .map(|outer| {
                format!("added token {outer:?} can start inside normalized added token {inner:?}")
            })
    })
}

/// Every normalizer maps one section's text, knowing nothing else; listed so that a new kind
/// is looked at before it is trusted.
fn normalizer_reason(normalizer: &NormalizerWrapper) -> Option<String> {
    match normalizer {
        NormalizerWrapper::Sequence(sequence) => {
            sequence.as_ref().iter().find_map(normalizer_reason)
        }
        NormalizerWrapper::BertNormalizer(_)
        | NormalizerWrapper::StripNormalizer(_)
        | NormalizerWrapper::StripAccents(_)
        | NormalizerWrapper::NFC(_)
        | NormalizerWrapper::NFD(_)
        | NormalizerWrapper::NFKC(_)
        | NormalizerWrapper::NFKD(_)
        | NormalizerWrapper::Lowercase(_)
        | NormalizerWrapper::Nmt(_)
        | NormalizerWrapper::Precompiled(_)
        | NormalizerWrapper::Replace(_)
        | NormalizerWrapper::Prepend(_)
        | NormalizerWrapper::ByteLevel(_) => None,
    }
}

/// Pre-tokenizers split one section at a time; only Metaspace's `first` scheme looks at where
/// the section lies in the text.
fn pre_tokenizer_reason(pre_tokenizer: &PreTokenizerWrapper) -> Option<String> {
    match pre_tokenizer {
        PreTokenizerWrapper::Sequence(sequence) => {
            sequence.as_ref().iter().find_map(pre_tokenizer_reason)
        }
        PreTokenizerWrapper::Metaspace(metaspace)
            if metaspace.get_prepend_scheme() == PrependScheme::First =>
        {
            Some("its Metaspace pre-tokenizer prepends only at the start of the text".into())
        }
        PreTokenizerWrapper::Metaspace(_)
        | PreTokenizerWrapper::BertPreTokenizer(_)
        | PreTokenizerWrapper::ByteLevel(_)
        | PreTokenizerWrapper::Delimiter(_)
        | PreTokenizerWrapper::Whitespace(_)
        | PreTokenizerWrapper::Split(_)
        | PreTokenizerWrapper::Punctuation(_)
        | PreTokenizerWrapper::WhitespaceSplit(_)
        | PreTokenizerWrapper::Digits(_)
        | PreTokenizerWrapper::UnicodeScripts(_)
        | PreTokenizerWrapper::FixedLength(_) => None,
    }
}

fn model_reason(model: &ModelWrapper) -> Option<String> {
    match model {
        ModelWrapper::BPE(bpe) if bpe.dropout.is_some_and(|p| p > 0.0) => {
            Some("its BPE model has dropout, so encodes are random".into())
        }
        ModelWrapper::BPE(_)
        | ModelWrapper::WordPiece(_)
        | ModelWrapper::WordLevel(_)
        | ModelWrapper::Unigram(_) => None,
    }
}

/// Without special tokens to add, post-processors change offsets and type ids, never ids.
fn post_processor_reason(processor: &PostProcessorWrapper) -> Option<String> {
    match processor {
        PostProcessorWrapper::Roberta(_)
        | PostProcessorWrapper::Bert(_)
        | PostProcessorWrapper::ByteLevel(_)
        | PostProcessorWrapper::Template(_)
        | PostProcessorWrapper::Sequence(_) => None,
    }
}

#[cfg(test)]
#[path = "tokenize_tests.rs"]
mod tests;
