//! Replay rows in and out of numpy: 3-D integer arrays `[rows, layers, width]` read in place
//! when they are contiguous arrays of a type the core reads, and tapes handed back without a
//! copy, reshaped.
use numpy::{
    IntoPyArray, PyArray3, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray3, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::PackError;
use crate::error::Error;
use crate::tape::{Column, Input, Status, Values};

/// A 3-D integer array as the core reads it.
pub(super) enum Rows<'py> {
    U8(PyReadonlyArray3<'py, u8>),
    U16(PyReadonlyArray3<'py, u16>),
    U32(PyReadonlyArray3<'py, u32>),
    I32(PyReadonlyArray3<'py, i32>),
    I64(PyReadonlyArray3<'py, i64>),
}

impl Rows<'_> {
    pub(super) fn values(&self) -> Values<'_> {
        let slice = "replay rows are made contiguous";
        match self {
            Rows::U8(a) => Values::U8(a.as_slice().expect(slice)),
            Rows::U16(a) => Values::U16(a.as_slice().expect(slice)),
            Rows::U32(a) => Values::U32(a.as_slice().expect(slice)),
            Rows::I32(a) => Values::I32(a.as_slice().expect(slice)),
            Rows::I64(a) => Values::I64(a.as_slice().expect(slice)),
        }
    }

    pub(super) fn dims(&self) -> [usize; 3] {
        let shape = match self {
            Rows::U8(a) => a.shape(),
            Rows::U16(a) => a.shape(),
            Rows::U32(a) => a.shape(),
            Rows::I32(a) => a.shape(),
            Rows::I64(a) => a.shape(),
        };
        [shape[0], shape[1], shape[2]]
    }
}

fn replay_error(message: String) -> PyErr {
    Error::Replay(message).into()
}

/// `value` as numpy's `asarray` reads it, which must be a 3-D integer array; contiguous, in a
/// type the core reads (other integer types become int64, range-checked first).
pub(super) fn read_rows<'py>(value: &Bound<'py, PyAny>, what: &str) -> PyResult<Rows<'py>> {
    let numpy = PyModule::import(value.py(), "numpy")?;
    let array = numpy.call_method1("ascontiguousarray", (value,))?;
    let untyped = array.cast::<PyUntypedArray>()?;
    let dtype = untyped.dtype();
    if untyped.ndim() != 3 || !matches!(dtype.kind(), b'i' | b'u') {
        let shape = untyped.getattr("shape")?;
        return Err(replay_error(format!(
            "{what}: rows must be a 3-D integer array, got {dtype}{shape}"
        )));
    }
    if let Ok(a) = array.cast::<PyArray3<u8>>() {
        return Ok(Rows::U8(a.readonly()));
    }
    if let Ok(a) = array.cast::<PyArray3<u16>>() {
        return Ok(Rows::U16(a.readonly()));
    }
    if let Ok(a) = array.cast::<PyArray3<u32>>() {
        return Ok(Rows::U32(a.readonly()));
    }
    if let Ok(a) = array.cast::<PyArray3<i32>>() {
        return Ok(Rows::I32(a.readonly()));
    }
    if let Ok(a) = array.cast::<PyArray3<i64>>() {
        return Ok(Rows::I64(a.readonly()));
    }
    if !untyped.is_empty() {
        let top: i128 = array.call_method0("max")?.extract()?;
        if i64::try_from(top).is_err() {
            return Err(replay_error(format!(
                "{what}: value {top} does not fit int64"
            )));
        }
    }
    let wide = array.call_method1("astype", ("int64",))?;
    Ok(Rows::I64(wide.cast::<PyArray3<i64>>()?.readonly()))
}

/// One push argument for a tape: None, a reason, or `(start, rows)`.
pub(super) enum Given<'py> {
    Absent,
    Gap(Status),
    Rows { start: usize, rows: Rows<'py> },
}

impl Given<'_> {
    pub(super) fn input(&self) -> Input<'_> {
        match self {
            Given::Absent => Input::Absent,
            Given::Gap(status) => Input::Gap(*status),
            Given::Rows { start, rows } => Input::Rows {
                start: *start,
                dims: rows.dims(),
                values: rows.values(),
            },
        }
    }
}

/// What a push was given for `channel`, read as the reference reads it; `prompt` is the
/// prompt's length, for the message about a negative start.
pub(super) fn given<'py>(
    value: Option<&Bound<'py, PyAny>>,
    channel: &str,
    prompt: usize,
) -> PyResult<Given<'py>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(Given::Absent);
    };
    if let Ok(name) = value.extract::<String>() {
        return match Status::gap(&name) {
            Some(status) => Ok(Given::Gap(status)),
            None => {
                let known = Status::GAPS
                    .map(|gap| format!("'{}'", gap.as_str()))
                    .join(", ");
                Err(replay_error(format!(
                    "{channel}: unknown reason {}; expected one of ({known})",
                    value.repr()?
                )))
            }
        };
    }
    if let Ok(pair) = value.cast::<PyTuple>() {
        if pair.len() == 2 {
            let start: i64 = pair.get_item(0)?.extract()?;
            let start = usize::try_from(start).map_err(|_| {
                replay_error(format!(
                    "{channel}: start {start} is outside [0, {prompt}], the prompt"
                ))
            })?;
            let rows = read_rows(&pair.get_item(1)?, channel)?;
            return Ok(Given::Rows { start, rows });
        }
    }
    let got = value.get_type().name()?;
    Err(replay_error(format!(
        "{channel}: expected None, a reason or (start, rows), got {got}"
    )))
}

/// A column handed to numpy without a copy, shaped `dims`.
pub(super) fn column_array<'py>(
    py: Python<'py>,
    column: Column,
    dims: [usize; 3],
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match column {
        Column::U8(v) => v.into_pyarray(py).reshape(dims)?.into_any(),
        Column::U16(v) => v.into_pyarray(py).reshape(dims)?.into_any(),
        Column::U32(v) => v.into_pyarray(py).reshape(dims)?.into_any(),
        Column::I32(v) => v.into_pyarray(py).reshape(dims)?.into_any(),
    })
}

/// Per-sample replay rows for `pack`, all of one element type and row shape.
pub(super) enum RowLists<'py> {
    U8(Vec<PyReadonlyArray3<'py, u8>>),
    U16(Vec<PyReadonlyArray3<'py, u16>>),
    U32(Vec<PyReadonlyArray3<'py, u32>>),
    I32(Vec<PyReadonlyArray3<'py, i32>>),
}

/// The element types a tape holds, as `pack` accepts them.
const PACKED: &str = "uint8, uint16, uint32 or int32";

/// `pack`'s replay rows: each a 3-D array of one of the tape types, all of the first one's
/// element type and row shape; with that row shape.
pub(super) fn row_lists<'py>(
    values: &[Bound<'py, PyAny>],
    what: &str,
) -> PyResult<(RowLists<'py>, [usize; 2])> {
    let numpy = PyModule::import(values[0].py(), "numpy")?;
    let mut first: Option<(String, [usize; 2])> = None;
    let mut lists = None;
    for (i, value) in values.iter().enumerate() {
        let array = numpy.call_method1("ascontiguousarray", (value,))?;
        let untyped = array.cast::<PyUntypedArray>()?;
        let dtype = untyped.dtype().to_string();
        let shape = untyped.shape();
        let known = ["uint8", "uint16", "uint32", "int32"].contains(&dtype.as_str());
        if untyped.ndim() != 3 || !known || shape[1] == 0 || shape[2] == 0 {
            let shape = untyped.getattr("shape")?;
            return Err(PackError::new_err(format!(
                "{what}[{i}]: expected a 3-D array of {PACKED}, got {dtype}{shape}"
            )));
        }
        let row = [shape[1], shape[2]];
        match &first {
            None => first = Some((dtype.clone(), row)),
            Some((want, want_row)) if (want, want_row) != (&dtype, &row) => {
                return Err(PackError::new_err(format!(
                    "{what}[{i}]: rows of ({}, {}) {dtype}, but {what}[0] has ({}, {}) {want}",
                    row[0], row[1], want_row[0], want_row[1]
                )));
            }
            Some(_) => {}
        }
        let lists = lists.get_or_insert_with(|| match dtype.as_str() {
            "uint8" => RowLists::U8(Vec::new()),
            "uint16" => RowLists::U16(Vec::new()),
            "uint32" => RowLists::U32(Vec::new()),
            _ => RowLists::I32(Vec::new()),
        });
        match lists {
            RowLists::U8(l) => l.push(array.cast::<PyArray3<u8>>()?.readonly()),
            RowLists::U16(l) => l.push(array.cast::<PyArray3<u16>>()?.readonly()),
            RowLists::U32(l) => l.push(array.cast::<PyArray3<u32>>()?.readonly()),
            RowLists::I32(l) => l.push(array.cast::<PyArray3<i32>>()?.readonly()),
        }
    }
    let (_, row) = first.expect("row_lists is given at least one array");
    Ok((lists.expect("set with the first array"), row))
}
