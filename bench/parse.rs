//! Protocol hot-path benches: client request parsing, backend reply framing and
//! the multi-get reply merge.
//!
//! Every client request goes through `parse_request` once and every backend
//! reply through `frame_reply` once, so these set the per-request CPU floor of
//! the proxy before any I/O. Inputs are built once, outside the timed loop, and
//! checked to take the success path so an error path is never timed by mistake.
//! Throughput is in bytes of input (or of output, for the merge). For the
//! 16 KiB cases that figure is not a bandwidth: a data block is framed by its
//! declared length and never scanned, so compare their time per op with the
//! 32-byte cases instead (they should be about equal).
//!
//! Run: `cargo bench --bench parse -- --warm-up-time 1 --measurement-time 2`.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use memring::protocol::encode::write_merged_values;
use memring::protocol::{frame_reply, parse_request, Limits, ReplyKind};

/// Size of the "small" values: a typical session token or counter blob.
const SMALL_VALUE_BYTES: usize = 32;

/// Size of the "large" values: big enough that copying or scanning the data
/// block, not the header, dominates.
const LARGE_VALUE_BYTES: usize = 16 * 1024;

fn key(i: usize) -> String {
    format!("user:{i}:profile")
}

fn value(len: usize) -> Vec<u8> {
    (0..len).map(|i| b'a' + (i % 26) as u8).collect()
}

fn set_request(key: &str, value_len: usize) -> Vec<u8> {
    let mut request = format!("set {key} 0 0 {value_len}\r\n").into_bytes();
    request.extend(value(value_len));
    request.extend(b"\r\n");
    request
}

fn value_block(out: &mut Vec<u8>, key: &str, value_len: usize) {
    out.extend(format!("VALUE {key} 0 {value_len}\r\n").into_bytes());
    out.extend(value(value_len));
    out.extend(b"\r\n");
}

/// A complete retrieval reply: one `VALUE` block per key, then `END`.
fn get_reply<'a>(keys: impl Iterator<Item = &'a str>, value_len: usize) -> Vec<u8> {
    let mut reply = Vec::new();
    for key in keys {
        value_block(&mut reply, key, value_len);
    }
    reply.extend(b"END\r\n");
    reply
}

/// Times one `parse_request` of a complete request that fills `input` exactly.
fn bench_parse(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    input: &[u8],
) {
    let limits = Limits::default();
    let (_, consumed) = parse_request(input, &limits)
        .expect("bench input is a valid request")
        .expect("bench input is a complete request");
    assert_eq!(consumed, input.len(), "{name}: one request, fully consumed");
    group.throughput(Throughput::Bytes(input.len() as u64));
    group.bench_function(name, |b| {
        b.iter(|| parse_request(black_box(input), black_box(&limits)))
    });
}

/// Request parsing: the single-key `get` is the most common request; the
/// 100-key `get` exercises the tokenizer and key validation at scale (and the
/// key list spilling to the heap); the two `set`s show whether the data block
/// is framed by its declared length (cost flat in value size) or scanned.
fn request_parsing(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse_request");

    bench_parse(
        &mut group,
        "get_1_key",
        format!("get {}\r\n", key(1)).as_bytes(),
    );

    let mut multi_get = String::from("get");
    for i in 0..100 {
        multi_get.push(' ');
        multi_get.push_str(&key(i));
    }
    multi_get.push_str("\r\n");
    bench_parse(&mut group, "get_100_keys", multi_get.as_bytes());

    bench_parse(
        &mut group,
        "set_32B",
        &set_request(&key(1), SMALL_VALUE_BYTES),
    );
    bench_parse(
        &mut group,
        "set_16KiB",
        &set_request(&key(1), LARGE_VALUE_BYTES),
    );

    group.finish();
}

/// Times one `frame_reply` of a complete reply that fills `input` exactly.
fn bench_frame(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    kind: ReplyKind,
    input: &[u8],
) {
    assert_eq!(
        frame_reply(input, kind),
        Ok(Some(input.len())),
        "{name}: one complete reply"
    );
    group.throughput(Throughput::Bytes(input.len() as u64));
    group.bench_function(name, |b| {
        b.iter(|| frame_reply(black_box(input), black_box(kind)))
    });
}

/// Reply framing, run by each backend connection on every reply to match it to
/// its waiting request: a one-line reply (`STORED`), a one-value hit, a
/// ten-value multi-get share, and a 16 KiB value whose data block should be
/// skipped by length rather than scanned.
fn reply_framing(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame_reply");

    bench_frame(&mut group, "line_stored", ReplyKind::Line, b"STORED\r\n");

    let one_key = key(1);
    let one_small = get_reply([one_key.as_str()].into_iter(), SMALL_VALUE_BYTES);
    bench_frame(&mut group, "get_1_value_32B", ReplyKind::Values, &one_small);

    let ten_keys: Vec<String> = (0..10).map(key).collect();
    let ten_small = get_reply(ten_keys.iter().map(String::as_str), SMALL_VALUE_BYTES);
    bench_frame(
        &mut group,
        "get_10_values_32B",
        ReplyKind::Values,
        &ten_small,
    );

    let one_large = get_reply([one_key.as_str()].into_iter(), LARGE_VALUE_BYTES);
    bench_frame(
        &mut group,
        "get_1_value_16KiB",
        ReplyKind::Values,
        &one_large,
    );

    group.finish();
}

/// Multi-get reply merge: a 10-key `get` whose keys were split over 3 servers
/// (key `i` on server `i % 3`, every key a hit with a 32-byte value), merged
/// back into the client's key order with one `END`. This runs once per split
/// multi-get, on top of framing each part.
fn multi_get_merge(c: &mut Criterion) {
    const KEYS: usize = 10;
    const PARTS: usize = 3;

    let keys: Vec<(Vec<u8>, usize)> = (0..KEYS)
        .map(|i| (key(i).into_bytes(), i % PARTS))
        .collect();
    let parts: Vec<Option<Bytes>> = (0..PARTS)
        .map(|part| {
            let part_keys: Vec<String> = (0..KEYS).filter(|i| i % PARTS == part).map(key).collect();
            let reply = get_reply(part_keys.iter().map(String::as_str), SMALL_VALUE_BYTES);
            Some(Bytes::from(reply))
        })
        .collect();

    // The merged reply holds every block of every part, and one `END` instead
    // of three.
    let mut expected = BytesMut::new();
    write_merged_values(
        &mut expected,
        keys.iter().map(|(k, p)| (k.as_slice(), *p)),
        &parts,
    );
    let blocks: usize = parts
        .iter()
        .flatten()
        .map(|part| part.len() - b"END\r\n".len())
        .sum();
    assert_eq!(expected.len(), blocks + b"END\r\n".len());

    let mut group = c.benchmark_group("merge");
    group.throughput(Throughput::Bytes(expected.len() as u64));
    let mut out = BytesMut::with_capacity(expected.len());
    group.bench_function("write_merged_values_10_keys_3_parts", |b| {
        b.iter(|| {
            // Reuses the buffer's capacity, so only the merge itself is timed.
            out.clear();
            write_merged_values(
                &mut out,
                black_box(&keys).iter().map(|(k, p)| (k.as_slice(), *p)),
                black_box(&parts),
            );
            black_box(&out);
        })
    });
    group.finish();
}

criterion_group!(benches, request_parsing, reply_framing, multi_get_merge);
criterion_main!(benches);
