//! Compact turn storage for one session: a prompt is the prefix it shares with its parent turn's
//! tokens plus its own tail, kept in flat arenas, so memory grows with the session's unique
//! tokens, not with turns x context. Replay tapes (routed experts, indexer top-k) keep each
//! position's row once, in the turn that computed it.
use std::mem;

use crate::builder::checked_logprobs;
use crate::error::Error;
use crate::linearize::{linearize_from, Linearized, Settings, TurnRef, TurnSource};
use crate::prefix::common_prefix_len;
use crate::tape::{Channel, Column, Input, Shape, Status, Tape};

/// Every turn of one session. Turn ids are 0, 1, 2, ... in push order, and a turn's parent
/// always has a smaller id.
///
/// Memory: one `Entry` per turn, and three arenas (tails, outputs, logprobs) that hold each
/// turn's pieces back to back; plus one full token sequence, the last turn pushed, which the
/// next push almost always continues; plus, per replay tape, the rows of the positions each
/// turn is the origin of.
///
/// A position's origin is the turn that first fed it forward: positions before a turn's
/// `origin` (the prefix it shares with its parent's tokens, short of the parent's last token,
/// which the parent sampled but never fed forward) are its parent's, the rest its own.
#[derive(Debug, Clone, Default)]
pub struct TurnStore {
    arena: Arena,
    cursor: Cursor,
    routed_experts: Option<Tape>,
    indexer_topk: Option<Tape>,
}

impl TurnStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store that also keeps the replay tapes whose shapes are given.
    pub fn with_tapes(routed_experts: Option<Shape>, indexer_topk: Option<Shape>) -> Self {
        TurnStore {
            routed_experts: routed_experts.map(|s| Tape::new(Channel::RoutedExperts, s)),
            indexer_topk: indexer_topk.map(|s| Tape::new(Channel::IndexerTopk, s)),
            ..Self::default()
        }
    }

    /// The tape of `channel`, when the store keeps one.
    pub fn tape(&self, channel: Channel) -> Option<&Tape> {
        match channel {
            Channel::RoutedExperts => self.routed_experts.as_ref(),
            Channel::IndexerTopk => self.indexer_topk.as_ref(),
        }
    }

    fn tape_for(&self, channel: Channel, given: bool) -> Result<Option<&Tape>, Error> {
        match self.tape(channel) {
            None if given => Err(Error::Replay(format!(
                "{0}: given, but the store was made without a {0} shape",
                channel.as_str()
            ))),
            tape => Ok(tape),
        }
    }

    /// How many turns are stored.
    pub fn len(&self) -> usize {
        self.arena.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.arena.entries.is_empty()
    }

    /// Store a turn and return its id. `parent` is the turn whose tokens (prompt + output) the
    /// prompt continues, or -1 for none; only their common prefix is shared, the rest of the
    /// prompt is stored as the turn's tail.
    ///
    /// Checked in the reference's order: the logprobs (`Error::LogprobLength`; empty ones are
    /// none), then the parent (`Error::NoSuchTurn`). Continuing the previous push costs a
    /// prefix comparison and a copy of the tail and output.
    pub fn push(
        &mut self,
        parent: i64,
        prompt: &[u32],
        output: &[u32],
        logprobs: Option<&[f32]>,
    ) -> Result<usize, Error> {
        self.push_replay(parent, prompt, output, logprobs, [Input::Absent; 2])
    }

    /// `push` with the turn's replay data: `[routed_experts, indexer_topk]`. After the
    /// logprobs and the parent, each input is checked against its tape (an input for a tape
    /// the store does not keep is an `Error::Replay`), so a refused push stores nothing.
    pub fn push_replay(
        &mut self,
        parent: i64,
        prompt: &[u32],
        output: &[u32],
        logprobs: Option<&[f32]>,
        replay: [Input<'_>; 2],
    ) -> Result<usize, Error> {
        let logprobs = checked_logprobs(logprobs, output.len())?;
        let parent = match parent {
            -1 => None,
            _ => Some(self.checked("parent turn", parent)?),
        };
        let prefix = self.shared(parent, prompt);
        for (channel, input) in [Channel::RoutedExperts, Channel::IndexerTopk]
            .iter()
            .zip(&replay)
        {
            let given = !matches!(input, Input::Absent);
            if let Some(tape) = self.tape_for(*channel, given)? {
                tape.check(input, prompt.len(), output.len())?;
            }
        }
        self.arena
            .push(parent, prefix, &prompt[prefix..], output, logprobs);
        let turn = self.len() - 1;
        let (origin, full) = (self.arena.origin(turn), self.arena.full_len(turn));
        let [routed, indexer] = replay;
        for (tape, input) in [
            (&mut self.routed_experts, routed),
            (&mut self.indexer_topk, indexer),
        ] {
            if let Some(tape) = tape {
                tape.append(input, origin, full);
            }
        }
        self.cursor.hold(&self.arena, turn);
        Ok(turn)
    }

    /// How many of `prompt`'s first tokens `parent`'s tokens hold.
    fn shared(&mut self, parent: Option<usize>, prompt: &[u32]) -> usize {
        match parent {
            Some(parent) => {
                self.cursor.hold(&self.arena, parent);
                common_prefix_len(&self.cursor.tokens, prompt)
            }
            None => 0,
        }
    }

    /// The first position whose replay rows a turn with this prompt, pushed under `parent`
    /// (-1 for none), would take from its own request: the start to ask the engine for.
    /// Positions before it are rows its parents already hold.
    pub fn replay_start(&mut self, parent: i64, prompt: &[u32]) -> Result<usize, Error> {
        let parent = match parent {
            -1 => None,
            _ => Some(self.checked("parent turn", parent)?),
        };
        let prefix = self.shared(parent, prompt);
        Ok(parent.map_or(0, |p| prefix.min(self.arena.full_len(p).saturating_sub(1))))
    }

    /// `turn`'s first `length` positions on `channel`: rows `[length, layers, width]` (C
    /// order) in the tape's element type and one `Status` code per position. Each row is the
    /// one its origin turn stored; a position without one is zeros with the reason.
    pub fn replay_rows(
        &self,
        channel: Channel,
        turn: usize,
        length: usize,
    ) -> Result<(Column, Vec<u8>), Error> {
        let tape = self.tape(channel).ok_or_else(|| {
            Error::Replay(format!(
                "{0}: the store was made without a {0} shape",
                channel.as_str()
            ))
        })?;
        let full = self.arena.full_len(turn);
        if length > full {
            return Err(Error::Replay(format!(
                "{}: length {length} is past turn {turn}'s {full} tokens",
                channel.as_str()
            )));
        }
        let mut rows = Column::zeros(tape.dtype(), length * tape.shape().row());
        let mut status = vec![Status::Present as u8; length];
        if length == full && full > 0 {
            status[full - 1] = Status::FinalToken as u8;
        }
        let (mut at, mut hi) = (Some(turn), length.min(full.saturating_sub(1)));
        while let Some(t) = at.filter(|_| hi > 0) {
            let lo = self.arena.origin(t).min(hi);
            tape.fill(t, (lo, hi), &mut rows, &mut status);
            (at, hi) = (self.arena.parent(t), lo);
        }
        Ok((rows, status))
    }

    /// `turn` as an id, or `Error::NoSuchTurn` when it names no stored turn.
    pub fn index(&self, turn: i64) -> Result<usize, Error> {
        self.checked("turn", turn)
    }

    fn checked(&self, what: &'static str, turn: i64) -> Result<usize, Error> {
        usize::try_from(turn)
            .ok()
            .filter(|&t| t < self.len())
            .ok_or(Error::NoSuchTurn {
                what,
                turn,
                turns: self.len(),
            })
    }

    /// The turn's prompt. Panics unless `turn < len()`, as every accessor does.
    pub fn prompt(&self, turn: usize) -> Vec<u32> {
        let mut prompt = self.tokens(turn);
        prompt.truncate(self.arena.prompt_len(turn));
        prompt
    }

    /// How many tokens the turn's prompt and output hold together.
    pub fn token_count(&self, turn: usize) -> usize {
        self.arena.full_len(turn)
    }

    /// The turn's prompt then output.
    pub fn tokens(&self, turn: usize) -> Vec<u32> {
        self.cursor.snapshot(&self.arena, turn)
    }

    pub fn output(&self, turn: usize) -> &[u32] {
        self.arena.output(turn)
    }

    /// The turn's logprobs, one per output token, or none when it was pushed without any.
    pub fn logprobs(&self, turn: usize) -> Option<&[f32]> {
        self.arena.logprobs(turn)
    }

    /// The reference's count of bytes held: 4 per stored id (tails and outputs), 4 per
    /// logprob, 8 per turn, and each tape's values at their element size.
    pub fn nbytes(&self) -> usize {
        let Arena {
            entries,
            tails,
            outputs,
            logprobs,
        } = &self.arena;
        let tapes: usize = self.tapes().map(Tape::nbytes).sum();
        4 * (tails.len() + outputs.len()) + 4 * logprobs.len() + 8 * entries.len() + tapes
    }

    fn tapes(&self) -> impl Iterator<Item = &Tape> {
        self.routed_experts.iter().chain(&self.indexer_topk)
    }

    /// Bytes the store's buffers have allocated: the arenas, the turn entries and the held
    /// sequence, at their capacity.
    pub fn heap_bytes(&self) -> usize {
        let Arena {
            entries,
            tails,
            outputs,
            logprobs,
        } = &self.arena;
        let Cursor {
            tokens,
            path,
            replay,
        } = &self.cursor;
        bytes(entries)
            + bytes(tails)
            + bytes(outputs)
            + bytes(logprobs)
            + bytes(tokens)
            + bytes(path)
            + bytes(replay)
            + self.tapes().map(Tape::heap_bytes).sum::<usize>()
    }

    /// `linearize` over the stored turns: chains name turn ids. Each prompt is rebuilt when a
    /// chain reaches it, from the one sequence held for the previous turn read, so a chain
    /// that walks down the tree costs its tails and outputs, not turns x context.
    pub fn linearize(&self, chains: &[Vec<i64>], settings: Settings) -> Result<Linearized, Error> {
        let mut turns = Replayed {
            arena: &self.arena,
            cursor: Cursor::default(),
        };
        linearize_from(&mut turns, chains, settings)
    }
}

fn bytes<T>(values: &Vec<T>) -> usize {
    values.capacity() * mem::size_of::<T>()
}

/// Where one turn's pieces end in the arenas; each starts where the previous turn's ends.
#[derive(Debug, Clone, Copy)]
struct Entry {
    parent: Option<usize>,
    /// How many of the parent's tokens (prompt + output) the prompt starts with.
    prefix: usize,
    tail_end: usize,
    output_end: usize,
    logprobs_end: usize,
}

/// Every turn's stored pieces, back to back in push order.
#[derive(Debug, Clone, Default)]
struct Arena {
    entries: Vec<Entry>,
    tails: Vec<u32>,
    outputs: Vec<u32>,
    logprobs: Vec<f32>,
}

impl Arena {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn push(
        &mut self,
        parent: Option<usize>,
        prefix: usize,
        tail: &[u32],
        output: &[u32],
        logprobs: Option<&[f32]>,
    ) {
        append(&mut self.tails, tail);
        append(&mut self.outputs, output);
        append(&mut self.logprobs, logprobs.unwrap_or_default());
        self.entries.push(Entry {
            parent,
            prefix,
            tail_end: self.tails.len(),
            output_end: self.outputs.len(),
            logprobs_end: self.logprobs.len(),
        });
    }

    fn parent(&self, turn: usize) -> Option<usize> {
        self.entries[turn].parent
    }

    fn prefix(&self, turn: usize) -> usize {
        self.entries[turn].prefix
    }

    /// Where `turn`'s piece lies in an arena whose ends `end` reads.
    fn range(&self, turn: usize, end: fn(&Entry) -> usize) -> std::ops::Range<usize> {
        let start = match turn {
            0 => 0,
            _ => end(&self.entries[turn - 1]),
        };
        start..end(&self.entries[turn])
    }

    fn tail(&self, turn: usize) -> &[u32] {
        &self.tails[self.range(turn, |e| e.tail_end)]
    }

    fn output(&self, turn: usize) -> &[u32] {
        &self.outputs[self.range(turn, |e| e.output_end)]
    }

    /// None for a turn pushed without logprobs: its range is empty, since empty logprobs are
    /// stored as none and present ones have one entry per output token.
    fn logprobs(&self, turn: usize) -> Option<&[f32]> {
        let logprobs = &self.logprobs[self.range(turn, |e| e.logprobs_end)];
        (!logprobs.is_empty()).then_some(logprobs)
    }

    fn prompt_len(&self, turn: usize) -> usize {
        self.prefix(turn) + self.tail(turn).len()
    }

    fn full_len(&self, turn: usize) -> usize {
        self.prompt_len(turn) + self.output(turn).len()
    }

    /// Where `turn`'s own positions start: before it, its parent fed every shared token
    /// forward (all but the parent's last, which it sampled).
    fn origin(&self, turn: usize) -> usize {
        self.parent(turn).map_or(0, |parent| {
            self.prefix(turn)
                .min(self.full_len(parent).saturating_sub(1))
        })
    }
}

/// One turn's full tokens (prompt + output), rebuilt from the arena, with the ancestors it
/// was built through.
///
/// `path` runs from a root turn down to the turn held (so its turn ids increase); an entry
/// `(turn, valid)` says that `tokens[..valid]` are that turn's first tokens. `valid` never
/// decreases down the path, and the last entry's is the whole held sequence. Moving to a
/// nearby turn then replays only the tails and outputs below the deepest entry that still
/// holds enough.
#[derive(Debug, Clone, Default)]
struct Cursor {
    tokens: Vec<u32>,
    path: Vec<(usize, usize)>,
    /// Scratch for `hold`: the turns to replay.
    replay: Vec<usize>,
}

impl Cursor {
    /// How to build `turn`: the turns to replay, into `replay` from `turn` up (so they are
    /// applied in reverse), and the path level they start from with how many of its tokens,
    /// or none to start from nothing.
    fn plan(&self, arena: &Arena, turn: usize, replay: &mut Vec<usize>) -> Option<(usize, usize)> {
        replay.clear();
        let (mut at, mut need) = (Some(turn), arena.full_len(turn));
        while let Some(t) = at {
            if let Ok(level) = self.path.binary_search_by_key(&t, |&(turn, _)| turn) {
                if self.path[level].1 >= need {
                    return Some((level, need));
                }
            }
            replay.push(t);
            need = arena.prefix(t);
            at = arena.parent(t);
        }
        None
    }

    /// Hold `turn`'s full tokens.
    fn hold(&mut self, arena: &Arena, turn: usize) {
        let mut replay = mem::take(&mut self.replay);
        match self.plan(arena, turn, &mut replay) {
            Some((level, need)) => {
                self.path.truncate(level + 1);
                self.cut(need);
            }
            None => {
                self.path.clear();
                self.tokens.clear();
            }
        }
        for &t in replay.iter().rev() {
            self.cut(arena.prefix(t));
            extend(&mut self.tokens, arena, t);
            self.path.push((t, self.tokens.len()));
        }
        self.replay = replay;
    }

    /// Keep the first `len` tokens; no path entry claims more.
    fn cut(&mut self, len: usize) {
        self.tokens.truncate(len);
        for (_, valid) in self.path.iter_mut().rev() {
            if *valid <= len {
                break;
            }
            *valid = len;
        }
    }

    /// `turn`'s full tokens, built from what the cursor holds without moving it.
    fn snapshot(&self, arena: &Arena, turn: usize) -> Vec<u32> {
        let mut replay = Vec::new();
        let mut out = Vec::with_capacity(arena.full_len(turn));
        if let Some((_, need)) = self.plan(arena, turn, &mut replay) {
            out.extend_from_slice(&self.tokens[..need]);
        }
        for &t in replay.iter().rev() {
            out.truncate(arena.prefix(t));
            extend(&mut out, arena, t);
        }
        out
    }
}

/// Append `turn`'s tail and output to its parent's first `prefix` tokens.
/// Append to an arena, growing it by a quarter rather than doubling: a session's memory is
/// its unique tokens, and doubling would leave up to as much again unused. Growth stays
/// geometric, so appends stay amortized O(1).
fn append<T: Copy>(arena: &mut Vec<T>, values: &[T]) {
    let needed = arena.len() + values.len();
    if needed > arena.capacity() {
        let grown = needed.max(arena.capacity() + arena.capacity() / 4);
        arena.reserve_exact(grown - arena.len());
    }
    arena.extend_from_slice(values);
}

fn extend(tokens: &mut Vec<u32>, arena: &Arena, turn: usize) {
    append(tokens, arena.tail(turn));
    append(tokens, arena.output(turn));
}

/// The stored turns as `linearize` reads them, each prompt rebuilt on demand.
struct Replayed<'a> {
    arena: &'a Arena,
    cursor: Cursor,
}

impl TurnSource for Replayed<'_> {
    fn count(&self) -> usize {
        self.arena.len()
    }

    /// A turn's prompt is its parent's prompt and output up to its prefix.
    fn known_shared(&self, index: usize, earlier: usize) -> usize {
        match self.arena.parent(index) {
            Some(parent) if parent == earlier => self.arena.prefix(index),
            _ => 0,
        }
    }

    fn turn(&mut self, index: usize) -> TurnRef<'_> {
        self.cursor.hold(self.arena, index);
        TurnRef {
            prompt: &self.cursor.tokens[..self.arena.prompt_len(index)],
            output: self.arena.output(index),
            logprobs: self.arena.logprobs(index),
        }
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
