//! tokentrail's hot path: prefix diffing, drift classification, loss masks, linearization,
//! packing, the replay tapes (routed experts, indexer top-k) kept per turn, and the index of a
//! request body that lets a turn parse only what changed since the session's previous request.
//!
//! The algorithm modules are plain Rust; only the binding modules under `python/` know about
//! Python, and `python/mod.rs` declares the extension module `tokentrail._core`.
pub mod added;
pub mod body;
pub mod bpe;
pub mod builder;
pub mod counts;
pub mod detokenize;
pub mod drift;
pub mod error;
pub mod fast;
pub mod http_chunks;
pub mod linearize;
pub mod numbers;
pub mod pack;
pub mod prefix;
pub mod pretokenize;
mod python;
pub mod sglang_run;
pub mod sse_run;
pub mod store;
pub mod tape;
pub mod tokenize;
