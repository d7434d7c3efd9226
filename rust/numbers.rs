//! A JSON array of scalars, or of equally long rows of scalars, parsed flat: an engine's
//! per-token numbers (ids, logprobs, SGLang's `[logprob, id, null]` entries) read without a
//! Python object per row, and without the interpreter.
//!
//! It takes what `json.loads` reads the same way and nothing else: a number (an integer that
//! fits 64 bits, or a float, correctly rounded as Python rounds it), `true`, `false`, `null`,
//! JSON whitespace. Anything more (a string, a nested array, an empty row, rows of unequal
//! length, `NaN`, a huge integer, broken syntax) is `None`, and the caller parses it itself.

/// One value of the array.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Int(i64),
    Float(f64),
    Bool(bool),
    Null,
}

/// The array's values in order, flat: `width` 0 for an array of scalars, else the length of
/// every row.
#[derive(Clone, Debug, PartialEq)]
pub struct Flat {
    pub width: usize,
    pub values: Vec<Scalar>,
}

/// The elements of the array whose text between its brackets is `text`, or `None` when it is
/// not an array of scalars or of rows of scalars all as long as the first.
pub fn parse(text: &[u8]) -> Option<Flat> {
    let mut c = Cursor { s: text, at: 0 };
    c.skip_space();
    let Some(first) = c.peek() else {
        return Some(Flat {
            width: 0,
            values: Vec::new(),
        });
    };
    let rows = first == b'[';
    let mut values = Vec::with_capacity(text.len() / 4);
    let mut width = 0;
    loop {
        c.skip_space();
        if rows {
            c.expect(b'[')?;
            let before = values.len();
            loop {
                c.skip_space();
                values.push(c.scalar()?);
                c.skip_space();
                match c.next()? {
                    b',' => {}
                    b']' => break,
                    _ => return None,
                }
            }
            let n = values.len() - before;
            if width == 0 {
                width = n;
            } else if n != width {
                return None;
            }
        } else {
            values.push(c.scalar()?);
        }
        c.skip_space();
        match c.next() {
            None => break,
            Some(b',') => {}
            Some(_) => return None,
        }
    }
    Some(Flat { width, values })
}

/// The one kind every value of a column has (of the array, for scalars), or `Mixed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    Int,
    Float,
    Bool,
    Null,
    Mixed,
}

impl Column {
    fn of(value: &Scalar) -> Column {
        match value {
            Scalar::Int(_) => Column::Int,
            Scalar::Float(_) => Column::Float,
            Scalar::Bool(_) => Column::Bool,
            Scalar::Null => Column::Null,
        }
    }
}

/// The kind of each of `flat`'s columns (one for an array of scalars); none for no values.
pub fn columns(flat: &Flat) -> Vec<Column> {
    let width = flat.width.max(1);
    let mut out: Vec<Column> = flat.values.iter().take(width).map(Column::of).collect();
    for row in flat.values.chunks(width).skip(1) {
        for (kind, value) in out.iter_mut().zip(row) {
            if *kind != Column::Mixed && *kind != Column::of(value) {
                *kind = Column::Mixed;
            }
        }
    }
    out
}

struct Cursor<'a> {
    s: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        (self.next()? == b).then_some(())
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        self.at - start
    }

    fn word(&mut self, word: &[u8], value: Scalar) -> Option<Scalar> {
        let end = self.at + word.len();
        (self.s.get(self.at..end)? == word).then(|| {
            self.at = end;
            value
        })
    }

    fn scalar(&mut self) -> Option<Scalar> {
        match self.peek()? {
            b'n' => self.word(b"null", Scalar::Null),
            b't' => self.word(b"true", Scalar::Bool(true)),
            b'f' => self.word(b"false", Scalar::Bool(false)),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// JSON's number grammar; what follows it is the caller's to check (`01` fails there).
    fn number(&mut self) -> Option<Scalar> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return None;
            }
            float = true;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if self.digits() == 0 {
                return None;
            }
            float = true;
        }
        // ASCII by construction.
        let token = std::str::from_utf8(&self.s[start..self.at]).ok()?;
        if float {
            token.parse().ok().map(Scalar::Float)
        } else {
            token.parse().ok().map(Scalar::Int)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Scalar::{Bool, Float, Int, Null};

    fn flat(width: usize, values: &[Scalar]) -> Option<Flat> {
        Some(Flat {
            width,
            values: values.to_vec(),
        })
    }

    #[test]
    fn scalars_and_rows() {
        assert_eq!(
            parse(b" 1, -2 ,3.5e1 "),
            flat(0, &[Int(1), Int(-2), Float(35.0)])
        );
        assert_eq!(
            parse(b"[-0.25, 7, null], [ -1e-3 ,8,true]"),
            flat(
                3,
                &[
                    Float(-0.25),
                    Int(7),
                    Null,
                    Float(-0.001),
                    Int(8),
                    Bool(true)
                ]
            )
        );
        assert_eq!(parse(b"false"), flat(0, &[Bool(false)]));
        assert_eq!(parse(b"  "), flat(0, &[]));
    }

    #[test]
    fn the_kind_of_each_column() {
        let rows = parse(b"[-0.5, 7, null], [-1.0, 8, null], [0, 9, true]").unwrap();
        let kinds = [Column::Mixed, Column::Int, Column::Mixed];
        assert_eq!(columns(&rows), kinds);
        assert_eq!(columns(&parse(b"1.5, 2.0").unwrap()), [Column::Float]);
        assert_eq!(columns(&parse(b"").unwrap()), []);
    }

    #[test]
    fn what_it_leaves_to_the_caller() {
        for text in [
            &b"1,"[..],
            b"01",
            b"1.",
            b"-",
            b"1e",
            b"NaN",
            b"Infinity",
            b"\"a\"",
            b"[1],[2,3]",
            b"[]",
            b"[1],2",
            b"1,[2]",
            b"[[1]]",
            b"99999999999999999999",
            b"nul",
            b"1 2",
        ] {
            assert_eq!(parse(text), None, "{}", String::from_utf8_lossy(text));
        }
    }
}
