//! A run of SGLang stream events that each add only new tokens (`--incremental-streaming-
//! output`, or a stream not yet known to be cumulative), read as one: the bytes of one read,
//! `data: ` + the events' JSON joined by `\n\ndata: ` + `\n\n`, parsed without the interpreter
//! and without an object per event.
//!
//! An event is taken where it has exactly the plain shape: a JSON object whose `meta_info` is
//! an object with `output_token_logprobs` (rows `[logprob, id, text]`: a number, an integer
//! that fits 64 bits, `null` or a string) and `completion_tokens` (such an integer); an
//! `output_ids` that is absent, `null` or an array of such integers; no `error` key; no key
//! of these given twice. Other keys are skipped. The run is taken where every event is, each
//! event's count takes the tokens so far to its `completion_tokens`, and each `output_ids`
//! given is that event's own ids; anything else is `None`, and the caller reads the events
//! one at a time.
use std::fmt;

use memchr::memmem;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

/// The tokens of a run taken, in order: each one's logprob and id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Taken {
    pub logprobs: Vec<f64>,
    pub ids: Vec<i64>,
}

/// One row of `output_token_logprobs`: its logprob, its id and its text, which is checked and
/// not kept (a stream's text is the decode of its ids).
type Entry = (f64, i64, Text);

/// A row's text: `null` or a string, read without making it.
struct Text;

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("null or a string")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Text, E> {
                Ok(Text)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Text, E> {
                Ok(Text)
            }
        }
        d.deserialize_any(V)
    }
}

const OPEN: &[u8] = b"data: ";
const SEP: &[u8] = b"\n\ndata: ";
const CLOSE: &[u8] = b"\n\n";

/// The run whose bytes are `body`, following `have` tokens already taken; `None` where any
/// event is not of the plain shape or the counts do not add up.
pub fn take(body: &[u8], have: usize) -> Option<Taken> {
    let inner = body.strip_prefix(OPEN)?.strip_suffix(CLOSE)?;
    let text = std::str::from_utf8(inner).ok()?;
    let mut taken = Taken::default();
    let mut total = i64::try_from(have).ok()?;
    let mut start = 0;
    let cuts = memmem::find_iter(inner, SEP).chain(std::iter::once(inner.len()));
    for end in cuts {
        let event: Event = serde_json::from_str(&text[start..end]).ok()?;
        start = end + SEP.len();
        let Meta {
            entries,
            completion_tokens,
        } = event.meta_info;
        total = total.checked_add(i64::try_from(entries.len()).ok()?)?;
        if total != completion_tokens {
            return None;
        }
        if let Some(out) = event.output_ids {
            if out.len() != entries.len() || out.iter().zip(&entries).any(|(a, e)| *a != e.1) {
                return None;
            }
        }
        for (logprob, id, Text) in entries {
            taken.logprobs.push(logprob);
            taken.ids.push(id);
        }
    }
    Some(taken)
}

struct Event {
    meta_info: Meta,
    output_ids: Option<Vec<i64>>,
}

struct Meta {
    entries: Vec<Entry>,
    completion_tokens: i64,
}

/// A key given twice, a missing one, or `error` at all.
fn refuse<E: de::Error>(why: &str) -> E {
    E::custom(why)
}

/// The keys read, as JSON decodes them (escapes and all); the rest are skipped.
enum Key {
    MetaInfo,
    OutputIds,
    Error,
    Entries,
    Count,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
                Ok(match key {
                    "meta_info" => Key::MetaInfo,
                    "output_ids" => Key::OutputIds,
                    "error" => Key::Error,
                    "output_token_logprobs" => Key::Entries,
                    "completion_tokens" => Key::Count,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Event;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an SGLang stream event (an object)")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Event, A::Error> {
                let mut meta: Option<Meta> = None;
                let mut out: Option<Option<Vec<i64>>> = None;
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::MetaInfo if meta.is_none() => meta = Some(map.next_value()?),
                        Key::OutputIds if out.is_none() => out = Some(map.next_value()?),
                        Key::MetaInfo | Key::OutputIds => return Err(refuse("a key given twice")),
                        Key::Error => return Err(refuse("an error event")),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Event {
                    meta_info: meta.ok_or_else(|| refuse("no meta_info"))?,
                    output_ids: out.flatten(),
                })
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for Meta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Meta;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an SGLang meta_info (an object)")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Meta, A::Error> {
                let mut entries = None;
                let mut count = None;
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Entries if entries.is_none() => entries = Some(map.next_value()?),
                        Key::Count if count.is_none() => count = Some(map.next_value()?),
                        Key::Entries | Key::Count => {
                            return Err(refuse("a key given twice"));
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Meta {
                    entries: entries.ok_or_else(|| refuse("no output_token_logprobs"))?,
                    completion_tokens: count.ok_or_else(|| refuse("no completion_tokens"))?,
                })
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[&str]) -> Vec<u8> {
        format!("data: {}\n\n", events.join("\n\ndata: ")).into_bytes()
    }

    #[test]
    fn a_plain_run_is_taken_in_order() {
        let body = run(&[
            r#"{"text":"","output_ids":[5],"meta_info":{"id":"a","output_token_logprobs":[[-0.5,5,null]],"completion_tokens":3}}"#,
            r#"{"meta_info":{"completion_tokens":5,"output_token_logprobs":[[-1,6,"x"],[0.25,7,null]]},"output_ids":null}"#,
        ]);
        let taken = take(&body, 2).unwrap();
        assert_eq!(taken.ids, vec![5, 6, 7]);
        assert_eq!(taken.logprobs, vec![-0.5, -1.0, 0.25]);
    }

    #[test]
    fn anything_else_is_left_to_the_caller() {
        let ok = r#"{"meta_info":{"output_token_logprobs":[[-0.5,5,null]],"completion_tokens":1}}"#;
        assert!(take(&run(&[ok]), 0).is_some());
        assert_eq!(take(&run(&[ok]), 1), None); // the count does not add up
        for bad in [
            r#"{"meta_info":{"output_token_logprobs":[[-0.5,5,null]],"completion_tokens":2}}"#,
            r#"{"error":null,"meta_info":{"output_token_logprobs":[[-0.5,5,null]],"completion_tokens":1}}"#,
            r#"{"output_ids":[6],"meta_info":{"output_token_logprobs":[[-0.5,5,null]],"completion_tokens":1}}"#,
            r#"{"meta_info":{"output_token_logprobs":[[-0.5,5,1]],"completion_tokens":1}}"#,
            r#"{"meta_info":{"output_token_logprobs":[[-0.5,5.0,null]],"completion_tokens":1}}"#,
            r#"{"meta_info":{"output_token_logprobs":[[-0.5,5]],"completion_tokens":1}}"#,
            r#"{"meta_info":[[[-0.5,5,null]],1]}"#,
            r#"[{"output_token_logprobs":[[-0.5,5,null]],"completion_tokens":1}]"#,
            r#"{"meta_info":{"output_token_logprobs":[[-0.5,5,null]],"completion_tokens":1,"completion_tokens":1}}"#,
            r#"{"meta_info":{"output_token_logprobs":[[NaN,5,null]],"completion_tokens":1}}"#,
        ] {
            assert_eq!(take(&run(&[bad]), 0), None, "{bad}");
        }
    }
}
