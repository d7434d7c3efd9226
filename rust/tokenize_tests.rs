//! Tests of `tokenize.rs`, kept apart so the module itself stays readable.
use super::*;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::Metaspace;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{SplitDelimiterBehavior, TruncationParams};

/// Qwen's pre-tokenization regex.
const PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const ADDED: [&str; 4] = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"];

/// A small byte-level BPE shaped like Qwen's: every byte, a few merges, NFC, the Split
/// regex then ByteLevel, and ChatML's added tokens.
fn qwen_like() -> Tokenizer {
    let alphabet = ByteLevel::alphabet();
    let mut vocab = Vocab::default();
    let mut chars: Vec<char> = alphabet.into_iter().collect();
    chars.sort_unstable();
    for c in chars {
        let next = vocab.len() as u32;
        vocab.insert(c.to_string(), next);
    }
    let mut merges = Vec::new();
    let pairs = [
        ("Ġ", "Ġ"),
        ("Ġ", "t"),
        ("h", "e"),
        ("Ġt", "he"),
        ("i", "m"),
        ("Ċ", "Ċ"),
        ("ĠĠ", "ĠĠ"),
    ];
    for (a, b) in pairs {
        let next = vocab.len() as u32;
        vocab.entry(format!("{a}{b}")).or_insert(next);
        merges.push((a.to_string(), b.to_string()));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .unwrap();
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_normalizer(Some(NFC)).unwrap();
    let split = Split::new(
        SplitPattern::Regex(PATTERN.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .unwrap();
    let byte_level = ByteLevel::new(false, false, false);
    tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![split.into(), byte_level.into()])));
    let added = ADDED.map(|content| AddedToken::from(content, true).normalized(false));
    tokenizer.add_special_tokens(added).unwrap();
    tokenizer
}

fn incremental(tokenizer: Tokenizer) -> IncrementalTokenizer {
    let json = tokenizer.to_string(false).unwrap();
    IncrementalTokenizer::from_json(&json).unwrap()
}

fn reason(tokenizer: Tokenizer) -> String {
    incremental(tokenizer)
        .fallback_reason()
        .expect("unsafe")
        .to_owned()
}

/// A small xorshift generator: reproducible texts without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Pieces that stress the seams: added tokens and their near misses, whitespace and
/// newline runs, letters, digits, CJK, emoji, combining marks that NFC composes.
const PIECES: [&str; 24] = [
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|im_end",
    "<|im_end|",
    "|im_end|>",
    "<|im",
    "<",
    "|>",
    "user\n",
    "assistant\n",
    " the",
    "hello",
    "  ",
    "    ",
    "\n",
    "\n\n\n",
    " \n ",
    "123",
    "汉字",
    "🦀",
    "e\u{301}",
    "'s",
];

fn random_text(rng: &mut Rng, pieces: usize) -> String {
    (0..pieces)
        .map(|_| PIECES[rng.below(PIECES.len())])
        .collect()
}

/// The ids `tokenizers` gives.
fn slow_ids(tok: &IncrementalTokenizer, text: &str) -> Vec<u32> {
    tok.tokenizer
        .encode(text, false)
        .unwrap()
        .get_ids()
        .to_vec()
}

#[test]
fn the_fast_path_gives_the_ids_tokenizers_gives() {
    let tok = incremental(qwen_like());
    assert!(tok.fast_path(), "{:?}", tok.fast_path_reason());
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for _ in 0..300 {
        let pieces = 1 + rng.below(40);
        let text = random_text(&mut rng, pieces);
        assert_eq!(
            tok.encode_full(&text).unwrap(),
            slow_ids(&tok, &text),
            "{text:?}"
        );
    }
    for text in [
        " ".repeat(5000),
        "\n".repeat(5000),
        "a".repeat(3000),
        "e\u{301}".repeat(500),
    ] {
        assert_eq!(tok.encode_full(&text).unwrap(), slow_ids(&tok, &text));
    }
    let slow = incremental(qwen_like()).without_fast_path();
    assert_eq!(slow.fast_path_reason(), Some("the fast path is turned off"));
    assert_eq!(
        slow.encode_full("a <|im_end|> b").unwrap(),
        slow_ids(&tok, "a <|im_end|> b")
    );
}

#[test]
fn other_tokenizers_say_why_they_take_no_fast_path() {
    let mut metaspace = qwen_like();
    metaspace.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::Always, true)));
    let mut lowercase = qwen_like();
    lowercase
        .with_normalizer(Some(tokenizers::normalizers::utils::Lowercase))
        .unwrap();
    let lstrip = with_token(AddedToken::from("<x>", false).lstrip(true));
    for (tokenizer, reason) in [
        (metaspace, "its pre-tokenizer does not end with ByteLevel"),
        (lowercase, "its normalizer Lowercase is not NFC"),
        (lstrip, r#"added token "<x>" has lstrip=True"#),
    ] {
        let tok = incremental(tokenizer);
        assert_eq!(tok.fast_path_reason(), Some(reason));
        assert!(!tok.fast_path());
    }
}

#[test]
fn qwen_like_tokenizer_is_safe() {
    let tok = incremental(qwen_like());
    assert!(tok.safe(), "{:?}", tok.fallback_reason());
    assert_eq!(tok.fallback_reason(), None);
}

#[test]
fn growing_and_rewritten_texts_encode_exactly() {
    let mut tok = incremental(qwen_like());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for session in ["a", "b"] {
        let mut text = String::new();
        for _ in 0..400 {
            match rng.below(10) {
                // Start over.
                0 => text = random_text(&mut rng, 3),
                // Rewrite: cut somewhere (on a char boundary), then go on differently.
                1 | 2 => {
                    let mut cut = rng.below(text.len() + 1);
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                    text.push_str(&random_text(&mut rng, 4));
                }
                // Grow.
                _ => text.push_str(&random_text(&mut rng, 6)),
            }
            let full = slow_ids(&tok, &text);
            assert_eq!(tok.encode_full(&text).unwrap(), full, "{text:?}");
            assert_eq!(tok.encode(session, &text).unwrap(), full, "{text:?}");
        }
    }
    assert_eq!(tok.sessions(), 2);
    assert!(tok.reused_ids() > 0);
}

#[test]
fn a_growing_conversation_encodes_only_its_new_text() {
    let mut tok = incremental(qwen_like());
    let mut text = String::new();
    let mut total = 0;
    for turn in 0..50 {
        text.push_str(&format!(
            "<|im_start|>user\nquestion {turn}<|im_end|>\n<|im_start|>assistant\n"
        ));
        total += text.len() as u64;
        let ids = tok.encode("s", &text).unwrap();
        assert_eq!(ids, tok.encode_full(&text).unwrap());
        text.push_str("<think>\n\n</think>\n\nthe answer<|im_end|>\n");
    }
    assert!(
        tok.encoded_bytes() * 10 < total,
        "{} of {total}",
        tok.encoded_bytes()
    );
    assert!(tok.reused_ids() > 0);
}

#[test]
fn the_same_text_again_reuses_every_id() {
    let mut tok = incremental(qwen_like());
    let text = "<|im_start|>user\nhi<|im_end|>";
    let ids = tok.encode("s", text).unwrap();
    let encoded = tok.encoded_bytes();
    assert_eq!(tok.encode("s", text).unwrap(), ids);
    assert_eq!(tok.encoded_bytes(), encoded);
    assert_eq!(tok.reused_ids(), ids.len() as u64);
}

#[test]
fn resumes_from_the_last_boundary_before_the_texts_part() {
    let mut tok = incremental(qwen_like());
    let ids = tok.encode("s", "<|im_start|>ab<|im_end|>cd").unwrap();
    assert_eq!(tok.sessions["s"].boundaries.len(), 2);
    // Parting inside "cd": resume after <|im_end|>.
    tok.encode("s", "<|im_start|>ab<|im_end|>cx").unwrap();
    assert_eq!(tok.reused_ids(), (ids.len() - 2) as u64);
    assert_eq!(tok.encoded_bytes(), 26 + 2);
    // Parting right after <|im_start|>: resume there.
    tok.encode("s", "<|im_start|>zz").unwrap();
    assert_eq!(tok.encoded_bytes(), 26 + 2 + 2);
    assert_eq!(
        tok.sessions["s"].boundaries,
        [Boundary { byte: 12, ids: 1 }]
    );
}

#[test]
fn forget_drops_the_session() {
    let mut tok = incremental(qwen_like());
    tok.encode("s", "<|im_start|>x").unwrap();
    assert!(tok.forget("s"));
    assert!(!tok.forget("s"));
    assert_eq!(tok.sessions(), 0);
}

fn with_token(token: AddedToken) -> Tokenizer {
    let mut tokenizer = qwen_like();
    tokenizer.add_tokens([token]).unwrap();
    tokenizer
}

#[test]
fn unsafe_configurations_say_why() {
    let rstrip = with_token(
        AddedToken::from("<x>", false)
            .rstrip(true)
            .normalized(false),
    );
    assert_eq!(reason(rstrip), r#"added token "<x>" has rstrip=True"#);
    let normalized = with_token(AddedToken::from("<x>", false).normalized(true));
    assert_eq!(
        reason(normalized),
        r#"added token "<x>" has normalized=True"#
    );
    let prefix = with_token(AddedToken::from("<|im_end|>!", false).normalized(false));
    assert_eq!(
        reason(prefix),
        r#"added token "<|im_end|>" occurs inside added token "<|im_end|>!""#
    );
    let inside = with_token(AddedToken::from("a<think>b", false).normalized(false));
    assert_eq!(
        reason(inside),
        r#"added token "<think>" occurs inside added token "a<think>b""#
    );
    let mut truncating = qwen_like();
    truncating
        .with_truncation(Some(TruncationParams::default()))
        .unwrap();
    assert_eq!(reason(truncating), "it truncates encodings");
    let mut metaspace = qwen_like();
    metaspace.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::First, true)));
    assert_eq!(
        reason(metaspace),
        "its Metaspace pre-tokenizer prepends only at the start of the text"
    );
    let mut bare = Tokenizer::new(BPE::default());
    bare.with_pre_tokenizer(Some(ByteLevel::default()));
    assert_eq!(reason(bare), "it has no added tokens to resume after");
}

/// `qwen_like` without its NFC normalizer: an empty `Sequence`, as DeepSeek's has.
fn with_identity_normalizer(token: AddedToken) -> Tokenizer {
    let mut tokenizer = with_token(token);
    let empty = tokenizers::normalizers::Sequence::new(vec![]);
    tokenizer.with_normalizer(Some(empty)).unwrap();
    tokenizer
}

#[test]
fn normalized_tokens_are_safe_when_normalizing_changes_nothing() {
    let mut tok = incremental(with_identity_normalizer(
        AddedToken::from("<dsml:", false).normalized(true),
    ));
    assert!(tok.safe(), "{:?}", tok.fallback_reason());
    let mut text = String::new();
    for turn in 0..20 {
        text.push_str(&format!(
            "<|im_start|>user\n{turn} <dsml:x> hello<|im_end|>"
        ));
        assert_eq!(
            tok.encode("s", &text).unwrap(),
            tok.encode_full(&text).unwrap()
        );
        text.push_str("<dsml:ab</think>  \n the<dsml:");
        assert_eq!(
            tok.encode("s", &text).unwrap(),
            tok.encode_full(&text).unwrap()
        );
    }
    assert!(tok.reused_ids() > 0);
}

#[test]
fn a_raw_token_starting_inside_a_normalized_one_is_unsafe() {
    // "ml:" + "|x" could be taken by the raw-text pass before "<dsml:" is matched.
    let mut tokenizer =
        with_identity_normalizer(AddedToken::from("<dsml:", false).normalized(true));
    tokenizer
        .add_tokens([AddedToken::from("ml:|x", false).normalized(false)])
        .unwrap();
    assert_eq!(
        reason(tokenizer),
        r#"added token "ml:|x" can start inside normalized added token "<dsml:""#
    );
}

#[test]
fn a_token_ending_with_another_is_safe() {
    // "x<think>" cannot start before a match of "<think>" and end after it.
    let tok = incremental(with_token(
        AddedToken::from("x<think>", false).normalized(false),
    ));
    assert!(tok.safe(), "{:?}", tok.fallback_reason());
}

#[test]
fn unsafe_tokenizers_still_encode_exactly() {
    let mut tok = incremental(with_token(
        AddedToken::from("<|im_end|>\n", false).normalized(false),
    ));
    assert!(!tok.safe());
    for text in ["<|im_start|>a<|im_end|>", "<|im_start|>a<|im_end|>\nb"] {
        assert_eq!(
            tok.encode("s", text).unwrap(),
            tok.encode_full(text).unwrap()
        );
    }
    assert_eq!(tok.sessions(), 0);
    assert_eq!(tok.reused_ids(), 0);
}

#[test]
fn a_bad_json_is_a_tokenizer_error() {
    assert!(matches!(
        IncrementalTokenizer::from_json("{"),
        Err(Error::Tokenizer(_))
    ));
}

#[test]
fn byte_prefix() {
    let long = vec![7u8; 1000];
    let mut other = long.clone();
    other[700] = 8;
    assert_eq!(common_prefix_bytes(&long, &other), 700);
    assert_eq!(common_prefix_bytes(&long, &long[..300]), 300);
    assert_eq!(common_prefix_bytes(b"", b"abc"), 0);
}
