//! The text of token ids for tokenizers whose decoder is `ByteLevel`, giving exactly what
//! `tokenizers`' `decode` gives with the special tokens kept.
//!
//! `tokenizers` looks each id up (its added tokens first, then the model's vocabulary), maps
//! every char of each token back to the byte it stands for (a token with a char no byte stands
//! for, such as an added token's text, is taken as its own UTF-8 bytes), joins the bytes of all
//! tokens and reads them as UTF-8, an invalid sequence becoming U+FFFD. An id with no token
//! adds nothing. Here each id's bytes are worked out once, when loading, into one flat table,
//! so a decode is a copy per id and one UTF-8 check: no hash lookup and no `String` per token.
//!
//! The table is read from a tokenizer.json's vocabulary and added tokens alone (`from_json`):
//! a tokenizer's merges are only needed to encode, and building them is most of loading one.
use std::collections::HashMap;

use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::fast::byte_level_decoder;

/// The bytes of every token id of one tokenizer.
pub struct Detokenizer {
    /// Id `i`'s bytes are `bytes[starts[i]..starts[i + 1]]`; an id with no token has none.
    starts: Vec<u32>,
    bytes: Vec<u8>,
}

impl Detokenizer {
    /// The detokenizer of the tokenizer.json `json`, read without building its model, or why
    /// its decode is not the one reproduced here.
    pub fn from_json(json: &str) -> Result<Self, String> {
        let file: File = serde_json::from_str(json)
            .map_err(|err| format!("cannot read the tokenizer.json: {err}"))?;
        match file.decoder.as_ref().map(|decoder| decoder.kind.as_str()) {
            Some("ByteLevel") => {}
            Some(kind) => return Err(format!("its decoder is {kind}, not ByteLevel")),
            None => return Err("it has no decoder".into()),
        }
        if file.model.kind.as_deref().is_some_and(|kind| kind != "BPE") {
            return Err("its model is not BPE".into());
        }
        // `tokenizers` looks an id up among the added tokens first, then in the vocabulary.
        let mut tokens: HashMap<u32, &str> = HashMap::with_capacity(file.model.vocab.len());
        for (token, id) in &file.model.vocab {
            if tokens.insert(*id, token).is_some() {
                return Err(format!("its vocabulary gives several tokens id {id}"));
            }
        }
        for added in &file.added_tokens {
            tokens.insert(added.id, &added.content);
        }
        let count = tokens.keys().max().map_or(0, |max| *max as usize + 1);
        Self::table(count, |id| tokens.get(&id).map(|token| (*token).to_owned()))
    }

    /// The table of ids `0..count`, `token` giving each id's token.
    fn table(count: usize, token: impl Fn(u32) -> Option<String>) -> Result<Self, String> {
        if u32::try_from(count).is_err() {
            return Err("its ids do not fit 32 bits".into());
        }
        let to_bytes = byte_level_decoder();
        let mut starts = Vec::with_capacity(count + 1);
        let mut bytes = Vec::new();
        starts.push(0);
        for id in 0..count as u32 {
            if let Some(token) = token(id) {
                match to_bytes(&token) {
                    Some(raw) => bytes.extend_from_slice(&raw),
                    None => bytes.extend_from_slice(token.as_bytes()),
                }
            }
            let end = u32::try_from(bytes.len())
                .map_err(|_| "its tokens take more than 4 GiB".to_string())?;
            starts.push(end);
        }
        Ok(Detokenizer { starts, bytes })
    }

    /// How many ids have a place in the table (one past the largest).
    pub fn len(&self) -> usize {
        self.starts.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            let id = id as usize;
            if id < self.len() {
                let (start, end) = (self.starts[id] as usize, self.starts[id + 1] as usize);
                out.extend_from_slice(&self.bytes[start..end]);
            }
        }
        match String::from_utf8(out) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        }
    }
}

/// What `from_json` reads of a tokenizer.json.
#[derive(Deserialize)]
struct File {
    #[serde(default)]
    added_tokens: Vec<Added>,
    decoder: Option<Kind>,
    model: Model,
}

#[derive(Deserialize)]
struct Added {
    id: u32,
    content: String,
}

#[derive(Deserialize)]
struct Kind {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct Model {
    #[serde(rename = "type")]
    kind: Option<String>,
    vocab: HashMap<String, u32>,
    #[serde(default, rename = "merges")]
    _merges: IgnoredAny,
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokenizers::decoders::byte_fallback::ByteFallback;
    use tokenizers::models::bpe::{Vocab, BPE};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{AddedToken, Tokenizer};

    /// A byte-level BPE over every single byte, with a merge, and two added tokens.
    fn tokenizer() -> Tokenizer {
        let mut chars: Vec<char> = ByteLevel::alphabet().into_iter().collect();
        chars.sort_unstable();
        let mut vocab = Vocab::default();
        for (id, c) in chars.into_iter().enumerate() {
            vocab.insert(c.to_string(), id as u32);
        }
        vocab.insert("ĠĠ".into(), 256);
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, vec![("Ġ".into(), "Ġ".into())])
            .build()
            .expect("a BPE");
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(ByteLevel::default()));
        tokenizer.with_decoder(Some(ByteLevel::default()));
        tokenizer
            .add_special_tokens([AddedToken::from("<|end|>", true)])
            .expect("added");
        tokenizer
            .add_tokens([AddedToken::from("<think>", false)])
            .expect("added");
        tokenizer
    }

    fn read(tokenizer: &Tokenizer) -> Result<Detokenizer, String> {
        Detokenizer::from_json(&tokenizer.to_string(false).expect("serializes"))
    }

    #[test]
    fn decodes_as_tokenizers_does() {
        let tokenizer = tokenizer();
        let detokenizer = read(&tokenizer).expect("byte-level");
        assert_eq!(detokenizer.len(), 259);
        let mut ids = tokenizer
            .encode("<think> héllo  wörld ✓<|end|>", false)
            .expect("encodes")
            .get_ids()
            .to_vec();
        // A character cut short, then ids with no token and out of the table.
        let cut = tokenizer.encode("é", false).expect("encodes").get_ids()[0];
        ids.extend([cut, 100_000, u32::MAX, 257]);
        for end in 0..=ids.len() {
            let want = tokenizer.decode(&ids[..end], false).expect("decodes");
            assert_eq!(detokenizer.decode(&ids[..end]), want, "the first {end} ids");
        }
    }

    #[test]
    fn another_decoder_is_refused_with_its_name() {
        let mut tokenizer = tokenizer();
        tokenizer.with_decoder(Some(ByteFallback::default()));
        let err = read(&tokenizer).err().expect("refused");
        assert_eq!(err, "its decoder is ByteFallback, not ByteLevel");
        tokenizer.with_decoder(None::<ByteLevel>);
        assert_eq!(read(&tokenizer).err().as_deref(), Some("it has no decoder"));
    }
}
