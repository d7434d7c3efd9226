//! Tests of `store.rs`, kept apart so the module itself stays readable.
use super::*;
use crate::drift::Policy;
use crate::linearize::{linearize, Turn};
use crate::tape::Values;

// Named tokens: system S, users U1..U3, assistant outputs A (turn 0), B (turn 1), C,
// a re-rendering R of A2, and a stray X.
const S: u32 = 1;
const U1: u32 = 2;
const U2: u32 = 3;
const U3: u32 = 4;
const A1: u32 = 10;
const A2: u32 = 11;
const B1: u32 = 20;
const C1: u32 = 30;
const R2: u32 = 40;
const X: u32 = 99;

fn settings(policy: Policy, fork_threshold: usize) -> Settings {
    Settings {
        policy,
        fork_threshold,
        max_sample_tokens: 0,
    }
}

/// Turn 0: [S U1] -> [A1 A2]; turn 1 continues it; turn 2 re-renders A2 as R2; turn 3
/// continues turn 1 again after turn 2 moved the held sequence away.
fn session() -> TurnStore {
    let mut store = TurnStore::new();
    store
        .push(-1, &[S, U1], &[A1, A2], Some(&[-1.0, -2.0]))
        .unwrap();
    store.push(0, &[S, U1, A1, A2, U2], &[B1], None).unwrap();
    store
        .push(0, &[S, U1, A1, R2, U3], &[C1], Some(&[]))
        .unwrap();
    store
        .push(1, &[S, U1, A1, A2, U2, B1, U3], &[], None)
        .unwrap();
    store
}

#[test]
fn a_prompt_is_stored_as_the_shared_prefix_and_a_tail() {
    let store = session();
    assert_eq!(store.len(), 4);
    let prefixes: Vec<_> = (0..4).map(|t| store.arena.prefix(t)).collect();
    assert_eq!(prefixes, [0, 4, 3, 6]);
    assert_eq!(store.arena.tail(1), [U2]);
    assert_eq!(store.arena.tail(2), [R2, U3]);
    assert_eq!(store.arena.tail(3), [U3]);
    // Tails S U1 | U2 | R2 U3 | U3, outputs A1 A2 | B1 | C1, logprobs for turn 0, 4 turns.
    assert_eq!(store.nbytes(), 4 * (6 + 4) + 4 * 2 + 8 * 4);
    assert!(store.heap_bytes() >= store.nbytes());
}

#[test]
fn prompts_and_tokens_are_materialized_from_the_parents() {
    let store = session();
    assert_eq!(store.prompt(0), [S, U1]);
    assert_eq!(store.tokens(0), [S, U1, A1, A2]);
    assert_eq!(store.prompt(2), [S, U1, A1, R2, U3]);
    assert_eq!(store.tokens(2), [S, U1, A1, R2, U3, C1]);
    assert_eq!(store.prompt(3), [S, U1, A1, A2, U2, B1, U3]);
    assert_eq!(store.tokens(1), [S, U1, A1, A2, U2, B1]);
    assert_eq!(store.output(1), [B1]);
    assert_eq!(store.logprobs(0), Some(&[-1.0, -2.0][..]));
    assert_eq!(store.logprobs(1), None);
    assert_eq!(store.logprobs(2), None, "empty logprobs are none");
    assert_eq!(store.output(3), [] as [u32; 0]);
}

#[test]
fn a_cut_prompt_shares_only_what_it_keeps() {
    let mut store = TurnStore::new();
    store.push(-1, &[S, U1], &[A1, A2], None).unwrap();
    store.push(0, &[S, U1, A1], &[B1], None).unwrap();
    assert_eq!(store.arena.prefix(1), 3);
    assert!(store.arena.tail(1).is_empty());
    assert_eq!(store.tokens(1), [S, U1, A1, B1]);
    // A prompt unrelated to its parent shares nothing.
    store.push(1, &[X], &[C1], None).unwrap();
    assert_eq!(store.arena.prefix(2), 0);
    assert_eq!(store.tokens(2), [X, C1]);
}

#[test]
fn bad_input_is_refused_in_the_reference_order() {
    let mut store = session();
    let missing = |turn| Error::NoSuchTurn {
        what: "parent turn",
        turn,
        turns: 4,
    };
    assert_eq!(store.push(4, &[S], &[], None), Err(missing(4)));
    assert_eq!(store.push(-2, &[S], &[], None), Err(missing(-2)));
    // The logprobs are checked before the parent.
    assert_eq!(
        store.push(9, &[S], &[A1], Some(&[-1.0, -2.0])),
        Err(Error::LogprobLength {
            logprobs: 2,
            outputs: 1
        })
    );
    assert_eq!(store.len(), 4, "a refused push stores nothing");
    assert_eq!(store.index(3), Ok(3));
    assert_eq!(
        store.index(-1),
        Err(Error::NoSuchTurn {
            what: "turn",
            turn: -1,
            turns: 4
        })
    );
    let chains = [vec![0, 4]];
    assert_eq!(
        store.linearize(&chains, settings(Policy::Minimal, 1024)),
        Err(Error::TurnOutOfRange {
            chain: 0,
            turn: 4,
            turns: 4
        })
    );
}

#[test]
fn memory_grows_with_the_unique_tokens_not_with_turns_times_context() {
    let mut store = TurnStore::new();
    let mut context: Vec<u32> = Vec::new();
    for t in 0..100u32 {
        context.extend((0..10).map(|k| 1000 + 10 * t + k));
        store.push(i64::from(t) - 1, &context, &[], None).unwrap();
    }
    assert_eq!(store.arena.tails.len(), 1000, "not 100 x 505 = 50,500");
    assert_eq!(store.nbytes(), 4 * 1000 + 8 * 100);
    // Arenas, entries and the held sequence: a few times the ids, far from 200 KB.
    assert!(store.heap_bytes() < 40_000, "{}", store.heap_bytes());
    assert_eq!(store.tokens(99), context);
    assert_eq!(store.prompt(42), context[..430]);
}

/// A small deterministic generator, so the random trees below need no dependency.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// A turn as pushed: prompt, output, logprobs (none when absent or empty).
type Pushed = (Vec<u32>, Vec<u32>, Option<Vec<f32>>);

/// A random tree of turns with drift, cut prompts, empty outputs and mixed logprobs, as
/// the store holds it and as pushed, with a chain from the root to every leaf.
fn random_session(rng: &mut Lcg, n: usize) -> (TurnStore, Vec<Pushed>, Vec<Vec<i64>>) {
    let mut store = TurnStore::new();
    let mut turns: Vec<Pushed> = Vec::new();
    let mut full: Vec<Vec<u32>> = Vec::new();
    let mut parents = Vec::new();
    for t in 0..n {
        // Mostly the previous turn, sometimes an older one or none.
        let parent = match rng.below(6) {
            0 => None,
            1 | 2 if t > 0 => Some(rng.below(t)),
            _ => t.checked_sub(1),
        };
        let mut prompt = parent.map_or_else(Vec::new, |p| full[p].clone());
        prompt.extend((0..rng.below(6)).map(|_| rng.below(8) as u32));
        match rng.below(4) {
            0 if !prompt.is_empty() => {
                let at = rng.below(prompt.len());
                prompt[at] = rng.below(8) as u32;
            }
            1 => prompt.truncate(rng.below(prompt.len() + 1)),
            _ => {}
        }
        let output: Vec<u32> = (0..rng.below(5)).map(|_| rng.below(8) as u32).collect();
        let logprobs = match rng.below(3) {
            0 => None,
            1 => Some(vec![]),
            _ => Some(output.iter().map(|&id| -(id as f32)).collect()),
        };
        let parent_id = parent.map_or(-1, |p| p as i64);
        let id = store
            .push(parent_id, &prompt, &output, logprobs.as_deref())
            .unwrap();
        assert_eq!(id, t);
        full.push([prompt.clone(), output.clone()].concat());
        turns.push((prompt, output, logprobs.filter(|l| !l.is_empty())));
        parents.push(parent);
    }
    let chains = (0..n)
        .filter(|t| !parents.contains(&Some(*t)))
        .map(|leaf| {
            let mut chain = vec![leaf as i64];
            let mut at = parents[leaf];
            while let Some(p) = at {
                chain.push(p as i64);
                at = parents[p];
            }
            chain.reverse();
            chain
        })
        .collect();
    (store, turns, chains)
}

#[test]
fn random_trees_materialize_as_pushed_in_any_order() {
    let mut rng = Lcg(7);
    for _ in 0..200 {
        let n = 1 + rng.below(12);
        let (store, turns, _) = random_session(&mut rng, n);
        let mut cursor = Cursor::default();
        for _ in 0..2 * n {
            let t = rng.below(n);
            let (prompt, output, logprobs) = &turns[t];
            assert_eq!(&store.prompt(t), prompt);
            assert_eq!(store.output(t), output);
            assert_eq!(store.logprobs(t), logprobs.as_deref());
            let full = [&prompt[..], output].concat();
            assert_eq!(store.tokens(t), full);
            cursor.hold(&store.arena, t);
            assert_eq!(cursor.tokens, full);
        }
    }
}

#[test]
fn the_store_linearizes_like_its_turns_with_forks() {
    let mut rng = Lcg(11);
    for round in 0..200 {
        let n = 1 + rng.below(12);
        let (store, pushed, mut chains) = random_session(&mut rng, n);
        let turns: Vec<Turn> = pushed
            .into_iter()
            .map(|(prompt, output, logprobs)| Turn::new(prompt, output, logprobs).unwrap())
            .collect();
        if round % 3 == 0 {
            // Chains that jump around the tree, revisiting turns.
            chains.push((0..rng.below(8)).map(|_| rng.below(n) as i64).collect());
        }
        for policy in [Policy::Minimal, Policy::Slime] {
            for threshold in [0, 2, 1024] {
                let settings = settings(policy, threshold);
                assert_eq!(
                    store.linearize(&chains, settings),
                    linearize(&turns, &chains, settings)
                );
            }
        }
    }
}

/// A turn's replay input as pushed, owned.
#[derive(Debug, Clone)]
enum Given {
    Absent,
    Gap(Status),
    Rows { start: usize, values: Vec<i32> },
}

impl Given {
    fn input(&self) -> Input<'_> {
        match self {
            Given::Absent => Input::Absent,
            Given::Gap(status) => Input::Gap(*status),
            Given::Rows { start, values } => Input::Rows {
                start: *start,
                dims: [values.len() / 2, 1, 2],
                values: Values::I32(values),
            },
        }
    }
}

/// Routed experts of one layer, top-2 of 6.
fn routing_store() -> TurnStore {
    TurnStore::with_tapes(Some(Shape::routing(1, 2, 6).unwrap()), None)
}

/// Rows for positions `start..` of a turn of `full` tokens, each position's pair derived
/// from `seed` so rows from different turns differ.
fn rows_from(start: usize, full: usize, seed: usize) -> Given {
    let values = (start..full.saturating_sub(1))
        .flat_map(|i| [((i + seed) % 6) as i32, ((i * seed + 1) % 6) as i32])
        .collect();
    Given::Rows { start, values }
}

#[test]
fn a_continued_prefix_keeps_the_rows_of_the_turn_that_computed_it() {
    let mut store = routing_store();
    // Turn 0: [S U1] -> [A1 A2]: rows for S U1 A1 (A2 was sampled, never fed forward).
    let t0 = rows_from(0, 4, 1);
    store
        .push_replay(-1, &[S, U1], &[A1, A2], None, [t0.input(), Input::Absent])
        .unwrap();
    // Turn 1 continues all four tokens; the engine is asked from position 3, where A2 is.
    let prompt = [S, U1, A1, A2, U2];
    assert_eq!(store.replay_start(0, &prompt), Ok(3));
    let t1 = rows_from(3, 6, 2);
    store
        .push_replay(0, &prompt, &[B1], None, [t1.input(), Input::Absent])
        .unwrap();
    let (rows, status) = store.replay_rows(Channel::RoutedExperts, 1, 6).unwrap();
    let Given::Rows { values: v0, .. } = &t0 else {
        unreachable!()
    };
    let Given::Rows { values: v1, .. } = &t1 else {
        unreachable!()
    };
    let want: Vec<u8> = [&v0[..], &v1[..], &[0, 0]]
        .concat()
        .iter()
        .map(|&v| v as u8)
        .collect();
    assert_eq!(rows, Column::U8(want));
    assert_eq!(status, [0, 0, 0, 0, 0, Status::FinalToken as u8]);
    // One byte per value: 3 + 2 rows of two values, nothing stored twice.
    assert_eq!(store.tape(Channel::RoutedExperts).unwrap().nbytes(), 10);
    // A shorter read is a prefix, with no final token.
    let (_, status) = store.replay_rows(Channel::RoutedExperts, 1, 4).unwrap();
    assert_eq!(status, [0; 4]);
}

#[test]
fn replay_input_is_checked_after_the_parent_and_a_refusal_stores_nothing() {
    let mut store = routing_store();
    let bad = Given::Rows {
        start: 0,
        values: vec![0, 9],
    };
    let err = store
        .push_replay(-1, &[S, U1], &[A1], None, [bad.input(), Input::Absent])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "routed_experts: 1 rows from position 0; a turn of 2 + 1 tokens has 2 there"
    );
    let missing = store.push_replay(3, &[S], &[], None, [bad.input(), Input::Absent]);
    assert!(matches!(missing, Err(Error::NoSuchTurn { .. })));
    let unkept = store.push_replay(-1, &[S], &[], None, [Input::Absent, bad.input()]);
    assert_eq!(
        unkept.unwrap_err().to_string(),
        "indexer_topk: given, but the store was made without a indexer_topk shape"
    );
    assert!(store.is_empty() && store.nbytes() == 0);
    store.push(-1, &[S], &[A1], None).unwrap();
    let (_, status) = store.replay_rows(Channel::RoutedExperts, 0, 2).unwrap();
    assert_eq!(
        status,
        [Status::NotRequested as u8, Status::FinalToken as u8]
    );
    assert!(store.replay_rows(Channel::RoutedExperts, 0, 3).is_err());
    assert!(store.replay_rows(Channel::IndexerTopk, 0, 1).is_err());
}

/// A turn as pushed with its replay input: parent, prompt, output, rows or gap.
type PushedReplay = (Option<usize>, Vec<u32>, Vec<u32>, Given);

/// What position `i` of `turn`'s sequence holds, position by position from the pushes.
fn naive(pushed: &[PushedReplay], turn: usize, i: usize) -> ([i32; 2], Status) {
    let (parent, prompt, output, given) = &pushed[turn];
    if i + 1 == prompt.len() + output.len() {
        return ([0, 0], Status::FinalToken);
    }
    let origin = parent.map_or(0, |p| {
        let (_, pp, po, _) = &pushed[p];
        let full = [&pp[..], po].concat();
        common_prefix_len(&full, prompt).min(full.len().saturating_sub(1))
    });
    if i < origin {
        return naive(pushed, parent.unwrap(), i);
    }
    match given {
        Given::Absent => ([0, 0], Status::NotRequested),
        Given::Gap(status) => ([0, 0], *status),
        Given::Rows { start, .. } if i < *start => ([0, 0], Status::RerenderedPrefix),
        Given::Rows { start, values } => {
            let at = 2 * (i - start);
            ([values[at], values[at + 1]], Status::Present)
        }
    }
}

#[test]
fn random_trees_replay_each_position_from_its_origin() {
    let mut rng = Lcg(23);
    for _ in 0..300 {
        let n = 1 + rng.below(10);
        let mut store = routing_store();
        let mut pushed = Vec::new();
        let mut full: Vec<Vec<u32>> = Vec::new();
        for t in 0..n {
            let parent = match rng.below(5) {
                0 => None,
                1 if t > 0 => Some(rng.below(t)),
                _ => t.checked_sub(1),
            };
            let mut prompt = parent.map_or_else(Vec::new, |p| full[p].clone());
            prompt.extend((0..rng.below(4)).map(|_| rng.below(5) as u32));
            match rng.below(4) {
                0 if !prompt.is_empty() => {
                    let at = rng.below(prompt.len());
                    prompt[at] = rng.below(5) as u32;
                }
                1 => prompt.truncate(rng.below(prompt.len() + 1)),
                _ => {}
            }
            let output: Vec<u32> = (0..rng.below(4)).map(|_| rng.below(5) as u32).collect();
            let parent_id = parent.map_or(-1, |p| p as i64);
            let asked = store.replay_start(parent_id, &prompt).unwrap();
            let total = prompt.len() + output.len();
            let given = match rng.below(6) {
                0 => Given::Absent,
                1 => Given::Gap(Status::GAPS[rng.below(5)]),
                // A start before or after the one asked, as an engine or a replay gives it.
                2 => rows_from(rng.below(prompt.len() + 1), total, t + 7),
                _ => rows_from(asked.min(prompt.len()), total, t + 7),
            };
            store
                .push_replay(
                    parent_id,
                    &prompt,
                    &output,
                    None,
                    [given.input(), Input::Absent],
                )
                .unwrap();
            full.push([&prompt[..], &output].concat());
            pushed.push((parent, prompt, output, given));
        }
        for (t, tokens) in full.iter().enumerate() {
            let length = rng.below(tokens.len() + 1);
            let (rows, status) = store
                .replay_rows(Channel::RoutedExperts, t, length)
                .unwrap();
            let Column::U8(rows) = rows else {
                panic!("6 experts fit a byte")
            };
            for i in 0..length {
                let (want, why) = naive(&pushed, t, i);
                assert_eq!(status[i], why as u8, "turn {t} position {i}");
                assert_eq!(
                    rows[2 * i..2 * i + 2],
                    want.map(|v| v as u8),
                    "turn {t} at {i}"
                );
            }
        }
    }
}

#[test]
fn a_fork_from_an_older_turn_splits_the_run() {
    let store = session();
    let settings = settings(Policy::Minimal, 0);
    let out = store
        .linearize(&[vec![0, 1, 3], vec![0, 2]], settings)
        .unwrap();
    let turns: Vec<Turn> = (0..4)
        .map(|t| {
            let logprobs = store.logprobs(t).map(<[f32]>::to_vec);
            Turn::new(store.prompt(t), store.output(t).to_vec(), logprobs).unwrap()
        })
        .collect();
    assert_eq!(
        out,
        linearize(&turns, &[vec![0, 1, 3], vec![0, 2]], settings).unwrap()
    );
    // Chain 1 re-emits turn 0 and forks at R2 with threshold 0: two runs, one trained.
    assert_eq!(out.samples.len(), 2);
    assert_eq!(out.samples[1].tokens, [S, U1, A1, R2, U3, C1]);
    assert_eq!(out.samples[1].turns, [2]);
}
