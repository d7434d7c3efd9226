//! The body of an HTTP/1.1 response in chunked transfer coding, taken off its framing a read at
//! a time: what an engine's event stream arrives in, one chunk an event (RFC 9112, 7.1).
//!
//! A read may end anywhere: in a chunk's data (what is there is taken, and the state says how
//! much of the chunk is still to come), in the CRLF after it, or in a size line or the trailer
//! section (not taken: the caller hands those bytes back with the next read). A size line is
//! hex digits, then optional whitespace and chunk extensions (`;`, skipped), then CRLF; the last
//! chunk (size 0) is followed by trailer fields, skipped, and a blank line. Anything else is
//! refused with what is wrong, as an HTTP parser refuses it.
use memchr::memchr;

use crate::error::Error;

/// The longest size line, and the longest trailer section, taken (aiohttp's bound on a line).
pub const MAX_LINE: usize = 8190;

/// What one read gave.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unchunked {
    /// The chunks' data, joined.
    pub body: Vec<u8>,
    /// The bytes of the read taken; the rest starts a size line or the trailers.
    pub end: usize,
    /// Bytes of the current chunk still to come: its data left and its CRLF (0: a size line).
    pub left: usize,
    /// Whether the last chunk and its trailers ended the body at `end`.
    pub last: bool,
}

fn broken(what: &str) -> Error {
    Error::Chunked(what.to_owned())
}

/// The read `buf`, `left` bytes into the current chunk (its data and CRLF still to come; 0 at
/// a size line).
pub fn unchunk(buf: &[u8], mut left: usize) -> Result<Unchunked, Error> {
    let mut body = Vec::with_capacity(buf.len());
    let mut pos = 0;
    loop {
        if left > 2 {
            let take = (left - 2).min(buf.len() - pos);
            body.extend_from_slice(&buf[pos..pos + take]);
            pos += take;
            left -= take;
        }
        while left > 0 && pos < buf.len() {
            let want = if left == 2 { b'\r' } else { b'\n' };
            if buf[pos] != want {
                return Err(broken("a chunk's data is not followed by CRLF"));
            }
            pos += 1;
            left -= 1;
        }
        if left > 0 || pos == buf.len() {
            break;
        }
        let rest = &buf[pos..];
        let Some(line_end) = memchr(b'\n', rest) else {
            if rest.len() > MAX_LINE {
                return Err(broken("a chunk size line is too long"));
            }
            break;
        };
        let size = chunk_size(&rest[..line_end])?;
        if size > 0 {
            pos += line_end + 1;
            left = size
                .checked_add(2)
                .ok_or_else(|| broken("a chunk size is too large"))?;
            continue;
        }
        // The last chunk: trailer fields up to a blank line, all in this read or none taken.
        let mut at = line_end + 1;
        loop {
            let Some(n) = memchr(b'\n', &rest[at..]) else {
                if rest.len() > MAX_LINE {
                    return Err(broken("the trailer section is too long"));
                }
                return Ok(Unchunked {
                    body,
                    end: pos,
                    left: 0,
                    last: false,
                });
            };
            let line = &rest[at..at + n];
            if !line.ends_with(b"\r") {
                return Err(broken("a trailer line does not end with CRLF"));
            }
            at += n + 1;
            if line.len() == 1 {
                return Ok(Unchunked {
                    body,
                    end: pos + at,
                    left: 0,
                    last: true,
                });
            }
            if at > MAX_LINE {
                return Err(broken("the trailer section is too long"));
            }
        }
    }
    Ok(Unchunked {
        body,
        end: pos,
        left,
        last: false,
    })
}

/// The size a chunk's size line (without its LF) gives.
fn chunk_size(line: &[u8]) -> Result<usize, Error> {
    let line = line
        .strip_suffix(b"\r")
        .ok_or_else(|| broken("a chunk size line does not end with CRLF"))?;
    if line.len() > MAX_LINE {
        return Err(broken("a chunk size line is too long"));
    }
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(broken("a chunk size is not a hex number"));
    }
    let after = &line[digits..];
    let after = &after[after
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t'))
        .count()..];
    if !after.is_empty() && after[0] != b';' {
        return Err(broken("a chunk size is not a hex number"));
    }
    let mut size: usize = 0;
    for &b in &line[..digits] {
        let digit = (b as char).to_digit(16).unwrap_or(0) as usize;
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(digit))
            .ok_or_else(|| broken("a chunk size is too large"))?;
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(buf: &[u8]) -> Unchunked {
        unchunk(buf, 0).unwrap()
    }

    #[test]
    fn chunks_are_joined_and_the_last_ends_the_body() {
        let got = whole(b"5\r\nhello\r\n1;x=y\r\n!\r\n0\r\nA: b\r\n\r\n");
        assert_eq!(got.body, b"hello!");
        assert!(got.last);
        assert_eq!(got.end, 31);
    }

    #[test]
    fn a_read_may_end_anywhere() {
        let all: &[u8] = b"a\r\n0123456789\r\n3\r\nabc\r\n0\r\n\r\n";
        for cut in 0..=all.len() {
            let first = unchunk(&all[..cut], 0).unwrap();
            let mut body = first.body.clone();
            if !first.last {
                let second = unchunk(&all[first.end..], first.left).unwrap();
                body.extend_from_slice(&second.body);
                assert!(
                    second.last && first.end + second.end == all.len(),
                    "cut at {cut}"
                );
            }
            assert_eq!(body, b"0123456789abc", "cut at {cut}");
        }
    }

    #[test]
    fn broken_framing_is_refused() {
        for bad in [
            &b"5\r\nhelloX\r\n"[..],
            b"zz\r\n",
            b"5 x\r\n",
            b"5\n",
            b"0\r\nA: b\n\r\n",
            b"ffffffffffffffffffff\r\n",
        ] {
            assert!(matches!(unchunk(bad, 0), Err(Error::Chunked(_))), "{bad:?}");
        }
    }
}
