//! Where each part of a JSON request body lies: the byte spans of its top-level fields and of
//! the elements of one array field (a request's `messages` or `input`).
//!
//! A harness resends the whole conversation every turn, and almost all of it is byte for byte
//! what it sent before. With two bodies indexed, [`diff`] says which fields changed and from
//! which element on the array did, so the adapter parses only those and reuses the rest of the
//! previous request's parse.
//!
//! The index checks the structure a parser would (UTF-8, strings, brackets, separators, one
//! object at the top) but treats each value as opaque bytes: whatever is new is parsed by a
//! JSON parser afterwards, and whatever is reused was parsed from the same bytes before. What
//! the index cannot take (a key written with escapes, a key given twice, broken structure) is
//! refused with a reason, and the caller parses the whole body instead.
//!
//! A session's next body starts with most of its previous one: [`index_after`] takes the
//! previous body's index for the bytes both share (one `memcmp`) and scans only from the
//! last array element that starts inside them, so a turn's index costs what it adds.
use std::fmt;

use memchr::memchr2;

use crate::prefix::common_prefix_bytes;

/// A byte range `start..end` of a body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

/// A body's layout: its top-level fields in order, and the elements of the array field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BodyIndex {
    /// Each top-level key and the span of its value.
    pub fields: Vec<(String, Span)>,
    /// The position in `fields` of the array field, when the body has it as an array.
    pub array_field: Option<usize>,
    /// The spans of that array's elements.
    pub elements: Vec<Span>,
    /// The deepest nesting of objects and arrays; the body itself is 1.
    pub depth: usize,
    /// Separators and openings (`,` `{` `[`) outside strings: how many values there are.
    pub structural: usize,
    /// Whether a string holds a `\uD800`..`\uDFFF` escape (which may be a lone surrogate).
    pub surrogate_escape: bool,
    /// The scan's counts where each element of the array starts (what [`index_after`]
    /// resumes from).
    pub marks: Vec<Mark>,
}

/// The scan's counts at the start of an array element: what the bytes before it hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub depth: usize,
    pub structural: usize,
    pub surrogate_escape: bool,
}

/// Why a body was not indexed; the caller then parses it whole (and reports its errors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanError {
    NotUtf8,
    /// The byte offset where the structure broke.
    Syntax(usize),
    /// A top-level key written with an escape: compared as bytes it would not be its text.
    EscapedKey(usize),
    /// A top-level key given twice (a parser keeps the last).
    DuplicateKey(String),
}

impl fmt::Display for ScanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanError::NotUtf8 => f.write_str("the body is not UTF-8"),
            ScanError::Syntax(at) => write!(f, "not a JSON object at byte {at}"),
            ScanError::EscapedKey(at) => write!(f, "a top-level key at byte {at} has escapes"),
            ScanError::DuplicateKey(key) => write!(f, "the top-level key {key:?} is repeated"),
        }
    }
}

/// What changed between two indexed bodies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyDiff {
    /// Fields of the new body (positions in its `fields`) whose value bytes differ from the
    /// same key's in the old one, or that the old one lacks.
    pub changed_fields: Vec<usize>,
    /// The first element of the array that differs: elements before it are byte-identical
    /// in both bodies (all of them when it equals the new body's element count).
    pub first_changed: usize,
}

/// Index `body`, whose array field `array` (if present and an array) gets element spans.
pub fn index(body: &[u8], array: &str) -> Result<BodyIndex, ScanError> {
    std::str::from_utf8(body).map_err(|_| ScanError::NotUtf8)?;
    let mut scan = Scanner {
        b: body,
        out: BodyIndex::default(),
    };
    scan.object(array.as_bytes())?;
    Ok(scan.out)
}

/// Index `body` as [`index`] does (the same result, or the same refusal), taking `old`'s
/// index of `old_body` for the bytes the two bodies share: the scan resumes at the last
/// element of `old`'s array that starts inside their common prefix. Without such an
/// element (another array field, a change before it) it is [`index`].
pub fn index_after(
    old_body: &[u8],
    old: &BodyIndex,
    body: &[u8],
    array: &str,
) -> Result<BodyIndex, ScanError> {
    let Some(at) = old.array_field else {
        return index(body, array);
    };
    let (key, span) = &old.fields[at];
    if key.as_bytes() != array.as_bytes() || old.marks.len() != old.elements.len() {
        return index(body, array);
    }
    let shared = common_prefix_bytes(old_body, body);
    // The first element starting at or past the shared bytes: the scan reads the byte an
    // element starts at (to stop skipping whitespace), so that byte must be shared too.
    let k = old.elements.partition_point(|e| e.start < shared);
    if k == 0 {
        return index(body, array);
    }
    let k = k - 1;
    let resume = old.elements[k].start;
    // The shared bytes were valid UTF-8 in `old_body` and end at a character boundary (the
    // byte before an element is ASCII), so only what follows is checked.
    std::str::from_utf8(&body[resume..]).map_err(|_| ScanError::NotUtf8)?;
    let mark = old.marks[k];
    let mut scan = Scanner {
        b: body,
        out: BodyIndex {
            fields: old.fields[..at].to_vec(),
            array_field: Some(at),
            elements: old.elements[..k].to_vec(),
            depth: mark.depth,
            structural: mark.structural,
            surrogate_escape: mark.surrogate_escape,
            marks: old.marks[..k].to_vec(),
        },
    };
    let end = scan.elements(resume)?;
    if let Some(next) = scan.close_field(key.clone(), span.start, end)? {
        scan.fields(next, array.as_bytes())?;
    }
    Ok(scan.out)
}

/// Which fields and elements of `new` differ from `old` (see [`BodyDiff`]).
pub fn diff<'a>(
    old_body: &'a [u8],
    old: &BodyIndex,
    new_body: &'a [u8],
    new: &BodyIndex,
) -> BodyDiff {
    let bytes = |body: &'a [u8], span: Span| -> &'a [u8] { &body[span.start..span.end] };
    let mut changed_fields = Vec::new();
    for (pos, (key, span)) in new.fields.iter().enumerate() {
        let before = old.fields.iter().find(|(k, _)| k == key);
        let same = match before {
            Some((_, was)) => {
                Some(pos) == new.array_field && old.array_field.is_some()
                    || bytes(old_body, *was) == bytes(new_body, *span)
            }
            None => false,
        };
        if !same {
            changed_fields.push(pos);
        }
    }
    let mut first_changed = 0;
    if old.array_field.is_some() {
        for (was, now) in old.elements.iter().zip(&new.elements) {
            if old_body[was.start..was.end] != new_body[now.start..now.end] {
                break;
            }
            first_changed += 1;
        }
    }
    BodyDiff {
        changed_fields,
        first_changed,
    }
}

struct Scanner<'a> {
    b: &'a [u8],
    out: BodyIndex,
}

impl Scanner<'_> {
    fn ws(&self, mut i: usize) -> usize {
        while i < self.b.len() && matches!(self.b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    }

    fn expect(&self, i: usize, byte: u8) -> Result<usize, ScanError> {
        if self.b.get(i) == Some(&byte) {
            Ok(i + 1)
        } else {
            Err(ScanError::Syntax(i))
        }
    }

    /// The top-level object.
    fn object(&mut self, array: &[u8]) -> Result<(), ScanError> {
        self.out.depth = 1;
        let i = self.expect(self.ws(0), b'{')?;
        self.out.structural += 1;
        let i = self.ws(i);
        if self.b.get(i) == Some(&b'}') {
            return self.end(i + 1);
        }
        self.fields(i, array)
    }

    /// The object's fields from the key at `i` to its end.
    fn fields(&mut self, mut i: usize, array: &[u8]) -> Result<(), ScanError> {
        loop {
            let key_start = i;
            let key_end = self.string(i)?;
            let key = &self.b[key_start + 1..key_end - 1];
            if key.contains(&b'\\') {
                return Err(ScanError::EscapedKey(key_start));
            }
            // UTF-8 was checked for the whole body.
            let key = String::from_utf8_lossy(key).into_owned();
            if self.out.fields.iter().any(|(k, _)| *k == key) {
                return Err(ScanError::DuplicateKey(key));
            }
            i = self.ws(self.expect(self.ws(key_end), b':')?);
            let start = i;
            let is_array = key.as_bytes() == array && self.b.get(i) == Some(&b'[');
            i = if is_array {
                self.out.array_field = Some(self.out.fields.len());
                self.array(i)?
            } else {
                self.value(i, 1)?
            };
            match self.close_field(key, start, i)? {
                Some(next) => i = next,
                None => return Ok(()),
            }
        }
    }

    /// Record the field `key` whose value spans `start..i`; returns where the next key
    /// starts, or None at the end of the object (and of the body).
    fn close_field(
        &mut self,
        key: String,
        start: usize,
        i: usize,
    ) -> Result<Option<usize>, ScanError> {
        self.out.fields.push((key, Span { start, end: i }));
        let i = self.ws(i);
        match self.b.get(i) {
            Some(b',') => {
                self.out.structural += 1;
                Ok(Some(self.ws(i + 1)))
            }
            Some(b'}') => self.end(i + 1).map(|()| None),
            _ => Err(ScanError::Syntax(i)),
        }
    }

    fn end(&self, i: usize) -> Result<(), ScanError> {
        let i = self.ws(i);
        if i == self.b.len() {
            Ok(())
        } else {
            Err(ScanError::Syntax(i))
        }
    }

    /// The array field at `i`, one span per element; returns the offset after it.
    fn array(&mut self, i: usize) -> Result<usize, ScanError> {
        self.out.structural += 1;
        self.out.depth = self.out.depth.max(2);
        let i = self.ws(i + 1);
        if self.b.get(i) == Some(&b']') {
            return Ok(i + 1);
        }
        self.elements(i)
    }

    /// The array's elements from the one at `i`; returns the offset after the array.
    fn elements(&mut self, mut i: usize) -> Result<usize, ScanError> {
        loop {
            let start = i;
            self.out.marks.push(Mark {
                depth: self.out.depth,
                structural: self.out.structural,
                surrogate_escape: self.out.surrogate_escape,
            });
            i = self.value(i, 2)?;
            self.out.elements.push(Span { start, end: i });
            i = self.ws(i);
            match self.b.get(i) {
                Some(b',') => {
                    self.out.structural += 1;
                    i = self.ws(i + 1);
                }
                Some(b']') => return Ok(i + 1),
                _ => return Err(ScanError::Syntax(i)),
            }
        }
    }

    /// One value at `i`, inside `depth` containers; returns the offset after it. Containers
    /// are followed bracket by bracket (strings skipped whole); scalars run to a delimiter.
    fn value(&mut self, i: usize, depth: usize) -> Result<usize, ScanError> {
        match self.b.get(i) {
            None => Err(ScanError::Syntax(i)),
            Some(b'"') => self.string(i),
            Some(b'{' | b'[') => self.container(i, depth),
            Some(_) => self.scalar(i),
        }
    }

    fn scalar(&self, i: usize) -> Result<usize, ScanError> {
        let mut j = i;
        while j < self.b.len()
            && !matches!(
                self.b[j],
                b',' | b']' | b'}' | b':' | b'"' | b'[' | b'{' | b' ' | b'\t' | b'\n' | b'\r'
            )
        {
            j += 1;
        }
        if j == i {
            Err(ScanError::Syntax(i))
        } else {
            Ok(j)
        }
    }

    /// The string starting at `i` (its opening quote); returns the offset after its closing
    /// quote.
    fn string(&mut self, i: usize) -> Result<usize, ScanError> {
        if self.b.get(i) != Some(&b'"') {
            return Err(ScanError::Syntax(i));
        }
        let mut j = i + 1;
        loop {
            let at = match memchr2(b'"', b'\\', &self.b[j..]) {
                Some(k) => j + k,
                None => return Err(ScanError::Syntax(i)),
            };
            if self.b[at] == b'"' {
                return Ok(at + 1);
            }
            // An escape: `\uD800`..`\uDFFF` may be half of a pair or a lone surrogate.
            let esc = self.b.get(at + 1..at + 4);
            if let Some([b'u', b'd' | b'D', b'8' | b'9' | b'a'..=b'f' | b'A'..=b'F']) = esc {
                self.out.surrogate_escape = true;
            }
            if at + 1 >= self.b.len() {
                return Err(ScanError::Syntax(at));
            }
            j = at + 2;
        }
    }

    /// The object or array at `i`, nested in `depth` containers.
    fn container(&mut self, i: usize, depth: usize) -> Result<usize, ScanError> {
        // The closing bracket each open container expects.
        let mut open: Vec<u8> = Vec::new();
        let mut j = i;
        while j < self.b.len() {
            match self.b[j] {
                b'"' => {
                    j = self.string(j)?;
                    continue;
                }
                c @ (b'{' | b'[') => {
                    open.push(if c == b'{' { b'}' } else { b']' });
                    self.out.structural += 1;
                    self.out.depth = self.out.depth.max(depth + open.len());
                }
                c @ (b'}' | b']') => {
                    if open.pop() != Some(c) {
                        return Err(ScanError::Syntax(j));
                    }
                    if open.is_empty() {
                        return Ok(j + 1);
                    }
                }
                b',' => self.out.structural += 1,
                _ => {}
            }
            j += 1;
        }
        Err(ScanError::Syntax(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(body: &str, index: &BodyIndex) -> Vec<String> {
        index
            .elements
            .iter()
            .map(|s| body[s.start..s.end].to_owned())
            .collect()
    }

    #[test]
    fn fields_and_elements() {
        let body = r#" {"model": "m", "messages": [ {"role":"user","content":"a]\"}"} , "x", 3 ],
            "tools": [{"a": [1, {"b": 2}]}]} "#;
        let index = index(body.as_bytes(), "messages").unwrap();
        let keys: Vec<&str> = index.fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["model", "messages", "tools"]);
        assert_eq!(index.array_field, Some(1));
        assert_eq!(
            spans(body, &index),
            [r#"{"role":"user","content":"a]\"}"}"#, r#""x""#, "3"]
        );
        let (_, tools) = &index.fields[2];
        assert_eq!(&body[tools.start..tools.end], r#"[{"a": [1, {"b": 2}]}]"#);
        assert_eq!(index.depth, 5);
        assert!(!index.surrogate_escape);
    }

    #[test]
    fn an_array_key_that_is_not_an_array_has_no_elements() {
        let index = index(br#"{"messages": "hi"}"#, "messages").unwrap();
        assert_eq!(index.array_field, None);
        assert!(index.elements.is_empty());
        let empty = super::index(br#"{"messages": []}"#, "messages").unwrap();
        assert_eq!(empty.array_field, Some(0));
        assert!(empty.elements.is_empty());
    }

    #[test]
    fn broken_bodies_are_refused() {
        for body in [
            "",
            "[]",
            "{",
            r#"{"a" 1}"#,
            r#"{"a": 1,}"#,
            r#"{"a": [1, 2}"#,
            r#"{"a": "x}"#,
            r#"{"a": 1} x"#,
            r#"{"a": {"b": 1]}"#,
            r#"{"messages": [1 2]}"#,
            r#"{"messages": [1,]}"#,
        ] {
            assert!(index(body.as_bytes(), "messages").is_err(), "{body:?}");
        }
        assert_eq!(index(b"{\"a\": \xff}", "m"), Err(ScanError::NotUtf8));
        assert_eq!(
            index(br#"{"a": 1, "a": 2}"#, "m"),
            Err(ScanError::DuplicateKey("a".into()))
        );
        assert_eq!(
            index(br#"{"\u0061": 1}"#, "m"),
            Err(ScanError::EscapedKey(1))
        );
    }

    #[test]
    fn surrogate_escapes_are_flagged() {
        assert!(index(br#"{"a": "\ud800"}"#, "m").unwrap().surrogate_escape);
        assert!(
            index(br#"{"a": ["\uDBFF\uDFFF"]}"#, "m")
                .unwrap()
                .surrogate_escape
        );
        assert!(
            !index(br#"{"a": "\u00e9 \\ud800"}"#, "m")
                .unwrap()
                .surrogate_escape
        );
    }

    #[test]
    fn diff_names_changed_fields_and_the_first_changed_element() {
        let old = br#"{"system": "s", "messages": [1, {"a": 2}, 3], "tools": [1]}"#;
        let new = br#"{"messages": [1, {"a": 2}, 4, 5], "tools": [1], "system": "t", "x": 0}"#;
        let (a, b) = (
            index(old, "messages").unwrap(),
            index(new, "messages").unwrap(),
        );
        let d = diff(old, &a, new, &b);
        let names: Vec<&str> = d
            .changed_fields
            .iter()
            .map(|&i| b.fields[i].0.as_str())
            .collect();
        assert_eq!(names, ["system", "x"]);
        assert_eq!(d.first_changed, 2);
        assert_eq!(diff(new, &b, new, &b).first_changed, 4);
    }
    /// A small deterministic generator (xorshift) for the differential tests.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// One array element: nested values, escapes (surrogate ones included), non-ASCII text
    /// and whitespace, sometimes broken.
    fn element(rng: &mut Rng, depth: usize) -> String {
        let pieces = [
            r#""a""#,
            r#""\ud83d\ude00""#,
            r#""é ] } \" ,""#,
            "12",
            "true",
            " ",
            "\n",
            r#""x\\""#,
        ];
        match rng.below(if depth > 2 { 4 } else { 7 }) {
            0..=2 => pieces[rng.below(pieces.len())].to_owned(),
            3 => format!("{}{}", pieces[rng.below(3)], pieces[5 + rng.below(2)]),
            4 => {
                let n = rng.below(4);
                let inner: Vec<String> = (0..n)
                    .map(|i| format!(r#""k{i}": {}"#, element(rng, depth + 1)))
                    .collect();
                format!("{{{}}}", inner.join(", "))
            }
            5 => {
                let n = rng.below(4);
                let inner: Vec<String> = (0..n).map(|_| element(rng, depth + 1)).collect();
                format!("[{}]", inner.join(","))
            }
            _ => ["{", "]", r#""open"#, "\u{ff}"][rng.below(4)].to_owned(),
        }
    }

    fn body(rng: &mut Rng, elements: &[String]) -> String {
        let before = [r#""model": "m", "#, r#""system": [1, {"a": "b"}], "#, ""];
        let after = [r#", "tools": [{"name": "t"}]"#, r#", "x": 0"#, ""];
        format!(
            "{{{}\"messages\": [{}]{}}}",
            before[rng.below(3)],
            elements.join(if rng.below(4) == 0 { " ,\n" } else { "," }),
            after[rng.below(3)]
        )
    }

    #[test]
    fn index_after_equals_a_full_index() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut resumed_ok = 0;
        for _ in 0..3000 {
            let mut elements: Vec<String> =
                (0..rng.below(6)).map(|_| element(&mut rng, 1)).collect();
            let old = body(&mut rng, &elements);
            // The next body: the same elements with some appended, the tail changed or cut,
            // or another field changed.
            match rng.below(4) {
                0 => elements.truncate(rng.below(elements.len() + 1)),
                1 => {
                    if let Some(last) = elements.last_mut() {
                        *last = element(&mut rng, 1);
                    }
                }
                _ => {}
            }
            for _ in 0..rng.below(4) {
                elements.push(element(&mut rng, 1));
            }
            let new = body(&mut rng, &elements);
            let Ok(old_index) = index(old.as_bytes(), "messages") else {
                continue;
            };
            for array in ["messages", "system"] {
                let full = index(new.as_bytes(), array);
                let resumed = index_after(old.as_bytes(), &old_index, new.as_bytes(), array);
                resumed_ok += usize::from(
                    array == "messages" && old_index.elements.len() > 1 && full.is_ok(),
                );
                assert_eq!(resumed, full, "{old:?} -> {new:?} ({array})");
            }
        }
        // Enough of them valid, with elements to resume from, for the test to say something.
        assert!(resumed_ok > 300, "{resumed_ok}");
    }

    #[test]
    fn index_after_resumes_inside_the_shared_bytes() {
        let old = r#"{"messages": [{"a": "\ud800"}, [[1]], "x"], "tools": []}"#;
        let new =
            r#"{"messages": [{"a": "\ud800"}, [[1]], "xy", {"b": [2]}], "tools": [], "z": 1}"#;
        let a = index(old.as_bytes(), "messages").unwrap();
        let b = index_after(old.as_bytes(), &a, new.as_bytes(), "messages").unwrap();
        assert_eq!(b, index(new.as_bytes(), "messages").unwrap());
        assert_eq!(b.marks.len(), b.elements.len());
        assert!(b.surrogate_escape);
        assert_eq!(b.depth, 4);
        // Broken past the shared bytes: refused as a full index refuses it.
        let broken = r#"{"messages": [{"a": "\ud800"}, [[1]], "x", {]}"#;
        let c = index_after(old.as_bytes(), &a, broken.as_bytes(), "messages");
        assert_eq!(c, index(broken.as_bytes(), "messages"));
        assert!(c.is_err());
        let not_utf8 = b"{\"messages\": [{\"a\": \"\\ud800\"}, [[1]], \"\xff\"]}";
        assert_eq!(
            index_after(old.as_bytes(), &a, not_utf8, "messages"),
            Err(ScanError::NotUtf8)
        );
    }

    #[test]
    fn common_prefix_counts_shared_bytes() {
        let a = vec![7u8; 10_000];
        let mut b = a.clone();
        assert_eq!(common_prefix_bytes(&a, &b), 10_000);
        b[9_000] = 1;
        assert_eq!(common_prefix_bytes(&a, &b), 9_000);
        assert_eq!(common_prefix_bytes(&a[..5], &b), 5);
        assert_eq!(common_prefix_bytes(b"", &b), 0);
    }
}
