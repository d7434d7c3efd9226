//! Where the complete events of one read of a server-sent-events stream end, where every one
//! of them is a single `data: ` line and a blank one and nothing else is there: the shape an
//! engine streams in, which the engine client then keeps as one run (`engines.streaming.Run`).
//!
//! One pass over the bytes: the read must start with `data: `, hold no CR, and every LF up to
//! the last blank line must be one of a pair that a `data: ` follows (or that ends the run),
//! and neither the run nor what follows it may pass the bound on an event's bytes. An event
//! `[DONE]` (the stream's end) ends the run before it; what follows it is not read.
use memchr::{memchr, memchr_iter, memrchr};

const OPEN: &[u8] = b"data: ";
const DONE: &[u8] = b"[DONE]\n\n";

/// Where a run ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// The run is `buf[..end]`.
    pub end: usize,
    /// How many events it holds.
    pub events: usize,
    /// Whether a `[DONE]` event follows it (the stream is over).
    pub done: bool,
}

/// The run at the start of `buf`; None where `buf` is not of that shape (or holds no complete
/// event).
pub fn run_shape(buf: &[u8], max_event: usize) -> Option<Shape> {
    let end = last_blank(buf)? + 2;
    if !buf.starts_with(OPEN) || buf.len() - end > max_event || memchr(b'\r', buf).is_some() {
        return None;
    }
    let body = &buf[..end];
    // An event of n bytes counts n + 1 against the bound (its LF), as the line reader counts it.
    if body.len().saturating_sub(7) > max_event {
        return None;
    }
    let done = |end, events| {
        Some(Shape {
            end,
            events,
            done: true,
        })
    };
    if body[OPEN.len()..].starts_with(DONE) {
        return done(0, 0);
    }
    let mut events = 0;
    let mut lines = memchr_iter(b'\n', body);
    while let Some(at) = lines.next() {
        // Each LF is the first of a pair, and the pair ends the run or a `data: ` follows.
        if lines.next() != Some(at + 1) {
            return None;
        }
        events += 1;
        let next = &body[at + 2..];
        if next.is_empty() {
            return Some(Shape {
                end,
                events,
                done: false,
            });
        }
        if !next.starts_with(OPEN) {
            return None;
        }
        if next[OPEN.len()..].starts_with(DONE) {
            return done(at + 2, events);
        }
    }
    None
}

/// Where the last `\n\n` of `buf` starts.
fn last_blank(buf: &[u8]) -> Option<usize> {
    let mut upto = buf.len();
    while let Some(at) = memrchr(b'\n', &buf[..upto]) {
        if at > 0 && buf[at - 1] == b'\n' {
            return Some(at - 1);
        }
        upto = at;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_single_line_events_are_cut_after_their_last_blank_line() {
        let buf = b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: {\"c\"";
        let shape = |end, events, done| Some(Shape { end, events, done });
        assert_eq!(run_shape(buf, 1024), shape(30, 2, false));
        assert_eq!(run_shape(b"data: x\n\n", 1024), shape(9, 1, false));
        assert_eq!(run_shape(b"data: \n\n", 1024), shape(8, 1, false));
        // `[DONE]` ends the run before it, whatever follows it.
        assert_eq!(run_shape(b"data: [DONE]\n\n", 1024), shape(0, 0, true));
        let end = b"data: x\n\ndata: [DONE]\n\ndata: y\n\n";
        assert_eq!(run_shape(end, 1024), shape(9, 1, true));
        assert_eq!(run_shape(b"data: [DONE]x\n\n", 1024), shape(15, 1, false));
        // Two data lines make one event, `[DONE]\ny`: not the end.
        assert_eq!(
            run_shape(b"data: x\n\ndata: [DONE]\ndata: y\n\n", 1024),
            None
        );
    }

    #[test]
    fn anything_else_is_left_to_the_general_reader() {
        for buf in [
            &b"data: x"[..],             // no complete event
            b"data: x\n",                // no blank line
            b": comment\n\ndata: x\n\n", // a comment
            b"data: x\r\n\r\n",          // CR
            b"data: x\n\n\ndata: y\n\n", // three LFs
            b"data: x\ndata: y\n\n",     // two data lines
            b"data: x\n\nevent: y\n\n",  // another field
            b"data:x\n\n",               // no space
            b"data: x\n\ndata: y\n\nid", // (the rest is fine...)
        ] {
            let got = run_shape(buf, 1024);
            if buf.ends_with(b"id") {
                assert_eq!(got.map(|s| (s.end, s.events, s.done)), Some((18, 2, false)));
            } else {
                assert_eq!(got, None, "{:?}", String::from_utf8_lossy(buf));
            }
        }
        // Too long: the rest past the bound, or the run itself.
        assert_eq!(run_shape(b"data: x\n\ndata: yyyy", 3), None);
        assert_eq!(run_shape(b"data: xxxxxxx\n\n", 3), None);
        // An event of the bound's length is over it, with its LF.
        assert_eq!(run_shape(b"data: xxx\n\n", 3), None);
        assert!(run_shape(b"data: xx\n\n", 3).is_some());
    }
}
