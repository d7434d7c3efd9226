//! Criterion benches of the hot path: prefix diffing next to `memcmp` on the same buffers, and
//! the sample builder over a long session. `cargo bench --bench core`.
use std::hint::black_box;

use _core::builder::SampleBuilder;
use _core::drift::Policy;
use _core::prefix::common_prefix_len;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn tokens(n: usize) -> Vec<u32> {
    // Token-like values: ids below the Qwen vocabulary size.
    (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 151_643)
        .collect()
}

fn prefix(c: &mut Criterion) {
    let mut group = c.benchmark_group("prefix");
    for n in [4_096usize, 65_536, 1 << 20] {
        let a = tokens(n);
        let b = a.clone();
        group.throughput(Throughput::Bytes((n * 4) as u64));
        group.bench_with_input(BenchmarkId::new("common_prefix_len", n), &n, |bench, _| {
            bench.iter(|| common_prefix_len(black_box(&a), black_box(&b)))
        });
        // Slice equality of u32 compiles to memcmp: the speed limit for an equal prefix.
        group.bench_with_input(BenchmarkId::new("memcmp", n), &n, |bench, _| {
            bench.iter(|| black_box(&a[..]) == black_box(&b[..]))
        });
    }
    group.finish();
}

fn builder(c: &mut Criterion) {
    let mut group = c.benchmark_group("builder");
    for turns in [32usize, 128] {
        // Every turn adds 500 prompt tokens and 100 sampled ones: a clean, growing session.
        let mut held: Vec<u32> = Vec::new();
        let mut session = Vec::with_capacity(turns);
        for t in 0..turns {
            let mut prompt = held.clone();
            prompt.extend(tokens(500).iter().map(|x| x ^ t as u32));
            let output = tokens(100);
            held = prompt.clone();
            held.extend(&output);
            session.push((prompt, output, vec![-0.5f32; 100]));
        }
        let total: usize = session.iter().map(|(p, o, _)| p.len() + o.len()).sum();
        group.throughput(Throughput::Bytes((total * 4) as u64));
        group.bench_with_input(
            BenchmarkId::new("append_turns", turns),
            &turns,
            |bench, _| {
                bench.iter(|| {
                    let mut b = SampleBuilder::with_threshold(Policy::Minimal, 1024);
                    for (t, (prompt, output, lps)) in session.iter().enumerate() {
                        b.append_turn(prompt, output, Some(lps), true, t as i64)
                            .unwrap();
                    }
                    black_box(b.len())
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, prefix, builder);
criterion_main!(benches);
