//! Replay tapes: what an engine reports for each token beyond its id, kept per turn in the
//! smallest integer type that holds the values.
//!
//! MoE trainers replay the experts each token was routed to (`[layers, top_k]` expert ids per
//! token, SGLang's `return_routed_experts`); sparse-attention trainers the indexer's top-k
//! (`return_indexer_topk`). A turn keeps rows only for the positions it is the origin of, the
//! ones no earlier turn of its chain fed forward; the store fills the rest from its parents.
use crate::error::Error;

/// What a materialized position holds: a row, or why it has none. A status's code is its index
/// in `NAMES`, the byte the per-position status arrays hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    Present = 0,
    /// The sequence's last token: it was never fed forward, so no engine reports it.
    FinalToken,
    /// The turn was recorded without this data.
    NotRequested,
    /// Asked for, but the engine's answer had none (a server without the flag, an abort).
    EngineReturnedNone,
    /// The engine's rows do not fit the model's shape or value range.
    ShapeMismatch,
    /// The turn is the origin of the position, but the engine was asked from a later start: the
    /// prompt re-rendered tokens an earlier turn held.
    RerenderedPrefix,
    /// The engine has no way to report this data.
    NotSupported,
}

impl Status {
    pub const NAMES: [&'static str; 7] = [
        "present",
        "final_token",
        "not_requested",
        "engine_returned_none",
        "shape_mismatch",
        "rerendered_prefix",
        "not_supported",
    ];

    /// The reasons a caller may give for a turn that has no rows.
    pub const GAPS: [Status; 5] = [
        Status::NotRequested,
        Status::EngineReturnedNone,
        Status::ShapeMismatch,
        Status::RerenderedPrefix,
        Status::NotSupported,
    ];

    pub fn as_str(self) -> &'static str {
        Status::NAMES[self as usize]
    }

    /// The gap reason named `name`.
    pub fn gap(name: &str) -> Option<Status> {
        Status::GAPS.into_iter().find(|gap| gap.as_str() == name)
    }
}

/// Which tape of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    RoutedExperts,
    IndexerTopk,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::RoutedExperts => "routed_experts",
            Channel::IndexerTopk => "indexer_topk",
        }
    }
}

/// The element type a tape keeps its values in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    U8,
    U16,
    U32,
    I32,
}

impl Dtype {
    pub fn itemsize(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::U16 => 2,
            Dtype::U32 | Dtype::I32 => 4,
        }
    }

    /// numpy's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::U8 => "uint8",
            Dtype::U16 => "uint16",
            Dtype::U32 => "uint32",
            Dtype::I32 => "int32",
        }
    }
}

/// A tape's row shape and the range its values lie in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub layers: usize,
    pub width: usize,
    pub min: i64,
    pub max: i64,
}

impl Shape {
    /// Routed experts: `top_k` expert ids in `[0, num_experts)` per layer.
    pub fn routing(layers: i64, top_k: i64, num_experts: i64) -> Result<Shape, Error> {
        let dims = [layers, top_k, num_experts];
        match dims.map(|d| usize::try_from(d).ok().filter(|&d| d >= 1)) {
            [Some(layers), Some(width), Some(_)] if num_experts <= i64::from(u32::MAX) => {
                Ok(Shape {
                    layers,
                    width,
                    min: 0,
                    max: num_experts - 1,
                })
            }
            _ => Err(Error::Replay(format!(
                "routed_experts: layers, top_k and num_experts must lie in [1, 2**32), got \
                 ({layers}, {top_k}, {num_experts})"
            ))),
        }
    }

    /// Indexer top-k: `top_k` indices per layer, -1 for an empty slot.
    pub fn indexer(layers: i64, top_k: i64) -> Result<Shape, Error> {
        match [layers, top_k].map(|d| usize::try_from(d).ok().filter(|&d| d >= 1)) {
            [Some(layers), Some(width)] => Ok(Shape {
                layers,
                width,
                min: -1,
                max: i64::from(i32::MAX),
            }),
            _ => Err(Error::Replay(format!(
                "indexer_topk: layers and top_k must be >= 1, got ({layers}, {top_k})"
            ))),
        }
    }

    /// Values per row.
    pub fn row(&self) -> usize {
        self.layers * self.width
    }

    /// The smallest element type that holds every value in range.
    pub fn dtype(&self) -> Dtype {
        match (self.min, self.max) {
            (0.., ..=0xFF) => Dtype::U8,
            (0.., ..=0xFFFF) => Dtype::U16,
            (0.., _) => Dtype::U32,
            _ => Dtype::I32,
        }
    }
}

/// Rows as a caller hands them over, in whatever integer type it holds them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Values<'a> {
    U8(&'a [u8]),
    U16(&'a [u16]),
    U32(&'a [u32]),
    I32(&'a [i32]),
    I64(&'a [i64]),
}

/// `$body` with `$s` bound to the slice of whichever variant `$values` is.
macro_rules! with_values {
    ($values:expr, |$s:ident| $body:expr) => {
        match $values {
            Values::U8($s) => $body,
            Values::U16($s) => $body,
            Values::U32($s) => $body,
            Values::I32($s) => $body,
            Values::I64($s) => $body,
        }
    };
}

impl Values<'_> {
    pub fn len(&self) -> usize {
        with_values!(self, |s| s.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first value outside `[min, max]`, with its index.
    fn outside(&self, min: i64, max: i64) -> Option<(usize, i64)> {
        fn scan<S: Copy + Into<i64>>(s: &[S], min: i64, max: i64) -> Option<(usize, i64)> {
            s.iter()
                .map(|&v| v.into())
                .enumerate()
                .find(|&(_, v)| !(min..=max).contains(&v))
        }
        with_values!(self, |s| scan(s, min, max))
    }
}

/// A tape's values, or rows built from them, in the tape's element type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Column {
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
}

impl Column {
    pub fn zeros(dtype: Dtype, len: usize) -> Column {
        match dtype {
            Dtype::U8 => Column::U8(vec![0; len]),
            Dtype::U16 => Column::U16(vec![0; len]),
            Dtype::U32 => Column::U32(vec![0; len]),
            Dtype::I32 => Column::I32(vec![0; len]),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Column::U8(v) => v.len(),
            Column::U16(v) => v.len(),
            Column::U32(v) => v.len(),
            Column::I32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> Dtype {
        match self {
            Column::U8(_) => Dtype::U8,
            Column::U16(_) => Dtype::U16,
            Column::U32(_) => Dtype::U32,
            Column::I32(_) => Dtype::I32,
        }
    }

    fn capacity_bytes(&self) -> usize {
        let capacity = match self {
            Column::U8(v) => v.capacity(),
            Column::U16(v) => v.capacity(),
            Column::U32(v) => v.capacity(),
            Column::I32(v) => v.capacity(),
        };
        capacity * self.dtype().itemsize()
    }

    /// Append `values[range]`, already checked to lie in this column's range.
    fn extend(&mut self, values: Values<'_>, range: std::ops::Range<usize>) {
        fn narrow<S: Copy + Into<i64>, T: TryFrom<i64>>(dst: &mut Vec<T>, src: &[S]) {
            grow(dst, src.len());
            dst.extend(src.iter().map(|&v| {
                T::try_from(v.into()).unwrap_or_else(|_| unreachable!("values are range-checked"))
            }));
        }
        with_values!(values, |s| match self {
            Column::U8(dst) => narrow(dst, &s[range]),
            Column::U16(dst) => narrow(dst, &s[range]),
            Column::U32(dst) => narrow(dst, &s[range]),
            Column::I32(dst) => narrow(dst, &s[range]),
        })
    }

    /// Copy `src[from..from + len]` to `self[to..to + len]`; both are the same element type.
    fn copy_from(&mut self, to: usize, src: &Column, from: usize, len: usize) {
        match (self, src) {
            (Column::U8(d), Column::U8(s)) => d[to..to + len].copy_from_slice(&s[from..from + len]),
            (Column::U16(d), Column::U16(s)) => {
                d[to..to + len].copy_from_slice(&s[from..from + len])
            }
            (Column::U32(d), Column::U32(s)) => {
                d[to..to + len].copy_from_slice(&s[from..from + len])
            }
            (Column::I32(d), Column::I32(s)) => {
                d[to..to + len].copy_from_slice(&s[from..from + len])
            }
            _ => unreachable!("rows are built in their tape's element type"),
        }
    }
}

/// Reserve room for `more` values, growing by a quarter rather than doubling (see
/// `store::append`).
fn grow<T>(values: &mut Vec<T>, more: usize) {
    let needed = values.len() + more;
    if needed > values.capacity() {
        let grown = needed.max(values.capacity() + values.capacity() / 4);
        values.reserve_exact(grown - values.len());
    }
}

/// One turn's data for a tape, as a push hands it over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Input<'a> {
    /// Nothing was recorded: the turn's positions are `NotRequested`.
    Absent,
    /// No rows, for this reason (one of `Status::GAPS`).
    Gap(Status),
    /// Rows `[rows, layers, width]` (C order) for positions `start..` of prompt + output, up to
    /// but not including the last token, as SGLang returns them.
    Rows {
        start: usize,
        dims: [usize; 3],
        values: Values<'a>,
    },
}

/// Where one turn's own rows are: positions `from..` with rows ending at `rows_end` in the
/// column; or its status when it has none.
#[derive(Debug, Clone, Copy)]
struct TapeTurn {
    from: usize,
    rows_end: usize,
    status: Status,
}

/// One channel's rows for every turn of a store, back to back in push order.
#[derive(Debug, Clone)]
pub struct Tape {
    channel: Channel,
    shape: Shape,
    column: Column,
    turns: Vec<TapeTurn>,
}

impl Tape {
    pub fn new(channel: Channel, shape: Shape) -> Tape {
        Tape {
            channel,
            shape,
            column: Column::zeros(shape.dtype(), 0),
            turns: Vec::new(),
        }
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    pub fn dtype(&self) -> Dtype {
        self.column.dtype()
    }

    /// Bytes of stored values.
    pub fn nbytes(&self) -> usize {
        self.column.len() * self.dtype().itemsize()
    }

    /// Bytes allocated: the values and the per-turn entries.
    pub fn heap_bytes(&self) -> usize {
        self.column.capacity_bytes() + self.turns.capacity() * std::mem::size_of::<TapeTurn>()
    }

    fn refuse(&self, problem: String) -> Error {
        Error::Replay(format!("{}: {problem}", self.channel.as_str()))
    }

    /// Refuse an input that does not fit a turn of `prompt` + `output` tokens: the start, then
    /// the row shape, then the row count, then the values.
    pub fn check(&self, input: &Input<'_>, prompt: usize, output: usize) -> Result<(), Error> {
        let Input::Rows {
            start,
            dims,
            values,
        } = *input
        else {
            return Ok(());
        };
        if start > prompt {
            return Err(self.refuse(format!(
                "start {start} is outside [0, {prompt}], the prompt"
            )));
        }
        let [rows, layers, width] = dims;
        let Shape {
            layers: want_layers,
            width: want_width,
            min,
            max,
        } = self.shape;
        if (layers, width) != (want_layers, want_width) || values.len() != rows * layers * width {
            return Err(self.refuse(format!(
                "rows of shape ({rows}, {layers}, {width}) for a store of {want_layers} layers \
                 x {want_width}"
            )));
        }
        let expected = (prompt + output).saturating_sub(1).saturating_sub(start);
        if rows != expected {
            return Err(self.refuse(format!(
                "{rows} rows from position {start}; a turn of {prompt} + {output} tokens has \
                 {expected} there"
            )));
        }
        if let Some((at, value)) = values.outside(min, max) {
            let row = at / self.shape.row();
            return Err(self.refuse(format!(
                "value {value} at row {row} is outside [{min}, {max}]"
            )));
        }
        Ok(())
    }

    /// Store a checked input for the next turn, whose positions before `origin` are its
    /// parents' and which has `full` tokens.
    pub fn append(&mut self, input: Input<'_>, origin: usize, full: usize) {
        let (from, status) = match input {
            Input::Absent => (origin, Status::NotRequested),
            Input::Gap(status) => (origin, status),
            Input::Rows { start, values, .. } => {
                let (from, end) = (origin.max(start), full.saturating_sub(1));
                if from < end {
                    let row = self.shape.row();
                    self.column
                        .extend(values, (from - start) * row..(end - start) * row);
                }
                (from, Status::Present)
            }
        };
        let rows_end = self.column.len() / self.shape.row();
        self.turns.push(TapeTurn {
            from,
            rows_end,
            status,
        });
    }

    /// Fill positions `lo..hi` of `turn`'s sequence, which lie at or after its origin and
    /// before its last token, into `out` (rows) and `status`.
    pub fn fill(&self, turn: usize, (lo, hi): (usize, usize), out: &mut Column, status: &mut [u8]) {
        let entry = self.turns[turn];
        if entry.status != Status::Present {
            status[lo..hi].fill(entry.status as u8);
            return;
        }
        let gap_end = entry.from.clamp(lo, hi);
        status[lo..gap_end].fill(Status::RerenderedPrefix as u8);
        if gap_end < hi {
            let row = self.shape.row();
            let rows_start = match turn {
                0 => 0,
                _ => self.turns[turn - 1].rows_end,
            };
            let first = rows_start + (gap_end - entry.from);
            out.copy_from(
                gap_end * row,
                &self.column,
                first * row,
                (hi - gap_end) * row,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_type_holds_the_expert_count() {
        let dtype = |experts| Shape::routing(2, 2, experts).unwrap().dtype();
        assert_eq!(dtype(2), Dtype::U8);
        assert_eq!(dtype(256), Dtype::U8);
        assert_eq!(dtype(257), Dtype::U16);
        assert_eq!(dtype(65_536), Dtype::U16);
        assert_eq!(dtype(65_537), Dtype::U32);
        assert_eq!(Shape::indexer(3, 4).unwrap().dtype(), Dtype::I32);
        assert_eq!(Shape::routing(48, 8, 128).unwrap().row(), 384);
    }

    #[test]
    fn shapes_must_be_positive() {
        assert_eq!(
            Shape::routing(0, 8, 128).unwrap_err().to_string(),
            "routed_experts: layers, top_k and num_experts must lie in [1, 2**32), got (0, 8, 128)"
        );
        assert!(Shape::routing(4, 2, 1 << 32).is_err());
        assert_eq!(
            Shape::indexer(2, -1).unwrap_err().to_string(),
            "indexer_topk: layers and top_k must be >= 1, got (2, -1)"
        );
    }

    #[test]
    fn statuses_and_gaps_have_names() {
        assert_eq!(Status::gap("shape_mismatch"), Some(Status::ShapeMismatch));
        assert_eq!(Status::gap("present"), None);
        assert_eq!(Status::gap("final_token"), None);
        for (code, name) in Status::NAMES.iter().enumerate() {
            let status = Status::GAPS.into_iter().find(|s| *s as usize == code);
            if let Some(status) = status {
                assert_eq!(status.as_str(), *name);
            }
        }
    }

    fn rows(start: usize, n: usize, values: &[i32]) -> Input<'_> {
        Input::Rows {
            start,
            dims: [n, 1, 2],
            values: Values::I32(values),
        }
    }

    #[test]
    fn inputs_are_checked_start_shape_count_then_values() {
        let tape = Tape::new(Channel::RoutedExperts, Shape::routing(1, 2, 4).unwrap());
        let refused = |input: Input<'_>, prompt, output| {
            tape.check(&input, prompt, output).unwrap_err().to_string()
        };
        assert_eq!(
            refused(rows(3, 0, &[]), 2, 1),
            "routed_experts: start 3 is outside [0, 2], the prompt"
        );
        let wide = Input::Rows {
            start: 0,
            dims: [1, 1, 3],
            values: Values::U8(&[0, 1, 2]),
        };
        assert_eq!(
            refused(wide, 1, 1),
            "routed_experts: rows of shape (1, 1, 3) for a store of 1 layers x 2"
        );
        assert_eq!(
            refused(rows(0, 1, &[0, 1]), 2, 1),
            "routed_experts: 1 rows from position 0; a turn of 2 + 1 tokens has 2 there"
        );
        assert_eq!(
            refused(rows(0, 2, &[0, 1, 3, 4]), 2, 1),
            "routed_experts: value 4 at row 1 is outside [0, 3]"
        );
        assert!(tape.check(&rows(0, 2, &[0, 1, 3, 2]), 2, 1).is_ok());
        assert!(tape.check(&rows(1, 1, &[3, 2]), 2, 1).is_ok());
        assert!(tape.check(&Input::Gap(Status::NotSupported), 0, 0).is_ok());
    }

    #[test]
    fn a_turn_keeps_only_the_rows_it_is_the_origin_of() {
        let mut tape = Tape::new(Channel::RoutedExperts, Shape::routing(1, 2, 8).unwrap());
        // Turn 0: 3 prompt + 2 output tokens, rows for positions 0..4.
        tape.append(rows(0, 4, &[0, 1, 1, 2, 2, 3, 3, 4]), 0, 5);
        // Turn 1 continues 4 of them: rows asked from 2, kept from 4.
        tape.append(rows(2, 3, &[5, 6, 5, 6, 7, 0]), 4, 6);
        // Turn 2 was asked from 5 though its origin is 3: positions 3 and 4 are a gap.
        tape.append(rows(5, 1, &[1, 7]), 3, 7);
        assert_eq!(
            tape.column,
            Column::U8(vec![0, 1, 1, 2, 2, 3, 3, 4, 7, 0, 1, 7])
        );
        let mut out = Column::zeros(Dtype::U8, 14);
        let mut status = vec![0; 7];
        tape.fill(2, (3, 6), &mut out, &mut status);
        tape.fill(0, (0, 3), &mut out, &mut status);
        assert_eq!(status, [0, 0, 0, 5, 5, 0, 0]);
        assert_eq!(
            out,
            Column::U8(vec![0, 1, 1, 2, 2, 3, 0, 0, 0, 0, 1, 7, 0, 0])
        );
    }
}
