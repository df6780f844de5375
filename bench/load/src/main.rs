//! `memring-load`: a closed-loop load generator for the memcached text
//! protocol, used by `bench/harness` to compare memring, twemproxy and
//! memcached on one machine.
//!
//! Each connection sends a batch of `--pipeline` requests (sets and gets in
//! the `--ratio` mix, keys uniform in `--key-range`), waits for all their
//! replies, checks every one of them (`reply.rs`), and sends the next batch.
//! Latency is from the batch's write to the reply, in microseconds, in an HDR
//! histogram. Only replies that arrive in the measured window (after
//! `--warmup`, for `--duration-secs`) are counted as operations; errors are
//! counted over the whole run, warm-up included. The result is one JSON object
//! on stdout.
//!
//! It runs on ONE thread (tokio's current-thread runtime) so that it takes at
//! most one core from whatever it measures, the same for every target; its
//! own CPU time over the window is in the report (`loadgen_cpu_ticks`) to show
//! when it, and not the target, was the limit. It only connects to loopback
//! addresses, and every phase has a deadline.
//!
//! Layout: `workload.rs` (keys, values, mix, request encoding), `reply.rs`
//! (reply framing and checking), `procstat.rs` (CPU ticks from /proc).

#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

mod procstat;
mod reply;
mod workload;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use clap::Parser;
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use reply::{Desync, Outcome, Wrong};
use workload::{Expect, Key, Ratio, Rng, ValueShape};

const MAX_DURATION_SECS: u64 = 120;
const MAX_WARMUP_SECS: u64 = 60;
const MAX_CONNECTIONS: usize = 2000;
const MAX_PIPELINE: usize = 1024;
const MAX_KEYS_PER_GET: usize = 100;
const MAX_VALUE_BYTES: usize = 1024 * 1024;
/// Prefill sends this many sets per batch on each connection.
const PREFILL_PIPELINE: usize = 32;
/// The whole prefill must finish within this time.
const PREFILL_DEADLINE_SECS: u64 = 120;
const CONNECT_TIMEOUT_MS: u64 = 1000;
/// Pause between reconnection attempts after a failure.
const RECONNECT_PAUSE_MS: u64 = 100;
/// Latencies above this are clamped into the histogram's top bucket.
const MAX_LATENCY_US: u64 = 60_000_000;
const READ_BUFFER_BYTES: usize = 64 * 1024;
const MAX_IDLE_CONNECTIONS: usize = 15_000;
const MAX_IDLE_SETTLE_SECS: u64 = 30;
/// Opening all idle connections, and checking them all at the end, must each
/// finish within this time.
const IDLE_PHASE_DEADLINE_SECS: u64 = 60;
/// Connect timeout and `version` reply timeout of one idle connection.
const IDLE_TIMEOUT_MS: u64 = 5000;

/// Command-line options. Every count and time has an upper bound so that a
/// run is always bounded.
#[derive(Parser, Debug)]
#[command(name = "memring-load", version, about)]
struct Args {
    /// Server to load, IP:port; must be a loopback address (127.0.0.0/8 or ::1).
    #[arg(long)]
    target: SocketAddr,
    /// Concurrent client connections (1..=2000).
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// Requests each connection sends before waiting for their replies (1..=1024).
    #[arg(long, default_value_t = 1)]
    pipeline: usize,
    /// SETS:GETS mix, e.g. 1:10.
    #[arg(long, default_value = "1:10")]
    ratio: String,
    /// Keys in each get (1..=100); a multi-key get counts as one operation.
    #[arg(long, default_value_t = 1)]
    keys_per_get: usize,
    /// Bytes per value (1..=1048576).
    #[arg(long, default_value_t = 32)]
    value_size: usize,
    /// Keys are drawn uniformly from this many (1..=10^12).
    #[arg(long, default_value_t = 100_000)]
    key_range: u64,
    /// Measured time in seconds (1..=120).
    #[arg(long, default_value_t = 10)]
    duration_secs: u64,
    /// Unmeasured load before the measured window, in seconds (0..=60).
    #[arg(long, default_value_t = 1)]
    warmup: u64,
    /// First set every key of the key range once (not measured), so that gets
    /// hit from the start.
    #[arg(long)]
    prefill: bool,
    /// A batch not fully answered in this time is a timeout; its connection is
    /// dropped and reopened (1..=60000).
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
    /// Report this process's CPU ticks (utime+stime) over the measured window.
    /// Repeatable.
    #[arg(long = "watch-pid")]
    watch_pids: Vec<u32>,
    /// Seed for key choice; connection i uses seed + i.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also open this many connections (0..=15000) after the prefill and
    /// before the run, keep them open without sending anything during the
    /// run, and at the end send one `version` on each and check that it is
    /// answered with `VERSION ...` (reported under `idle`). Needs a file
    /// descriptor limit above it (`ulimit -n`).
    #[arg(long, default_value_t = 0)]
    idle_connections: usize,
    /// Pause this long (0..=30 s) after opening the idle connections and
    /// before the run starts (so that another process can sample the target).
    #[arg(long, default_value_t = 0)]
    idle_settle_secs: u64,
    /// Add this to every key id (0..=10^11), so that two load generators on
    /// one target can use disjoint keys (`key:` + 12 digits).
    #[arg(long, default_value_t = 0)]
    key_base: u64,
}

/// The validated run plan, shared by every connection task.
#[derive(Debug, Clone)]
struct Plan {
    target: SocketAddr,
    connections: usize,
    pipeline: usize,
    ratio: Ratio,
    keys_per_get: usize,
    value: ValueShape,
    key_range: u64,
    key_base: u64,
    request_timeout: Duration,
    seed: u64,
    measure_start: Instant,
    end: Instant,
}

fn check(args: &Args) -> Result<Ratio, String> {
    if !args.target.ip().is_loopback() {
        return Err(format!(
            "--target {}: only loopback addresses are allowed",
            args.target
        ));
    }
    let in_range = |name: &str, v: u64, lo: u64, hi: u64| {
        if (lo..=hi).contains(&v) {
            Ok(())
        } else {
            Err(format!("--{name} {v} is out of range {lo}..={hi}"))
        }
    };
    in_range(
        "connections",
        args.connections as u64,
        1,
        MAX_CONNECTIONS as u64,
    )?;
    in_range("pipeline", args.pipeline as u64, 1, MAX_PIPELINE as u64)?;
    in_range(
        "keys-per-get",
        args.keys_per_get as u64,
        1,
        MAX_KEYS_PER_GET as u64,
    )?;
    in_range(
        "value-size",
        args.value_size as u64,
        1,
        MAX_VALUE_BYTES as u64,
    )?;
    in_range("key-range", args.key_range, 1, workload::MAX_KEY_RANGE)?;
    in_range("key-base", args.key_base, 0, workload::MAX_KEY_RANGE / 10)?;
    if args.key_base + args.key_range > workload::MAX_KEY_RANGE {
        return Err("--key-base + --key-range exceeds 10^12".to_string());
    }
    in_range("duration-secs", args.duration_secs, 1, MAX_DURATION_SECS)?;
    in_range("warmup", args.warmup, 0, MAX_WARMUP_SECS)?;
    in_range("timeout-ms", args.timeout_ms, 1, 60_000)?;
    in_range(
        "idle-connections",
        args.idle_connections as u64,
        0,
        MAX_IDLE_CONNECTIONS as u64,
    )?;
    in_range("idle-settle-secs", args.idle_settle_secs, 0, MAX_IDLE_SETTLE_SECS)?;
    if (args.keys_per_get as u64) > args.key_range {
        return Err(format!(
            "--keys-per-get {} needs at least as many keys in --key-range ({})",
            args.keys_per_get, args.key_range
        ));
    }
    Ratio::parse(&args.ratio)
}

/// What one connection task saw.
struct ConnStats {
    hist: Histogram<u64>,
    ops: u64,
    sets: u64,
    gets: u64,
    get_keys: u64,
    hits: u64,
    error_replies: u64,
    not_stored: u64,
    unexpected_keys: u64,
    bad_values: u64,
    desyncs: u64,
    timeouts: u64,
    io_errors: u64,
    connect_errors: u64,
    prefilled: u64,
}

impl ConnStats {
    fn new() -> ConnStats {
        ConnStats {
            hist: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                .expect("constant histogram bounds are valid"),
            ops: 0,
            sets: 0,
            gets: 0,
            get_keys: 0,
            hits: 0,
            error_replies: 0,
            not_stored: 0,
            unexpected_keys: 0,
            bad_values: 0,
            desyncs: 0,
            timeouts: 0,
            io_errors: 0,
            connect_errors: 0,
            prefilled: 0,
        }
    }

    fn errors(&self) -> u64 {
        self.error_replies
            + self.not_stored
            + self.unexpected_keys
            + self.bad_values
            + self.desyncs
            + self.timeouts
            + self.io_errors
            + self.connect_errors
    }

    fn merge(&mut self, other: &ConnStats) {
        self.hist
            .add(&other.hist)
            .expect("histograms with the same bounds merge");
        self.ops += other.ops;
        self.sets += other.sets;
        self.gets += other.gets;
        self.get_keys += other.get_keys;
        self.hits += other.hits;
        self.error_replies += other.error_replies;
        self.not_stored += other.not_stored;
        self.unexpected_keys += other.unexpected_keys;
        self.bad_values += other.bad_values;
        self.desyncs += other.desyncs;
        self.timeouts += other.timeouts;
        self.io_errors += other.io_errors;
        self.connect_errors += other.connect_errors;
        self.prefilled += other.prefilled;
    }

    /// Counts one complete reply; `measured` says whether it falls in the
    /// measured window.
    fn count(&mut self, outcome: Outcome, expect: &Expect, latency: Duration, measured: bool) {
        match outcome {
            Outcome::Stored | Outcome::Got { .. } if measured => {
                self.ops += 1;
                let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
                self.hist.saturating_record(micros.clamp(1, MAX_LATENCY_US));
                match (outcome, expect) {
                    (Outcome::Got { hits }, Expect::Get { count, .. }) => {
                        self.gets += 1;
                        self.get_keys += *count as u64;
                        self.hits += hits as u64;
                    }
                    _ => self.sets += 1,
                }
            }
            Outcome::Stored | Outcome::Got { .. } => {}
            Outcome::ErrorReply => self.error_replies += 1,
            Outcome::Wrong(Wrong::NotStored) => self.not_stored += 1,
            Outcome::Wrong(Wrong::UnexpectedKey) => self.unexpected_keys += 1,
            Outcome::Wrong(Wrong::BadValue) => self.bad_values += 1,
        }
    }
}

/// Why a batch could not be completed; the connection is dropped after any.
enum BatchError {
    Io,
    Eof,
    Desync,
}

impl From<std::io::Error> for BatchError {
    fn from(_: std::io::Error) -> BatchError {
        BatchError::Io
    }
}

impl From<Desync> for BatchError {
    fn from(_: Desync) -> BatchError {
        BatchError::Desync
    }
}

/// One batch's requests: the bytes to send, the replies expected in order,
/// and the keys the gets asked for.
struct Batch {
    bytes: Vec<u8>,
    expects: Vec<Expect>,
    keys: Vec<Key>,
}

impl Batch {
    fn new() -> Batch {
        Batch {
            bytes: Vec::new(),
            expects: Vec::new(),
            keys: Vec::new(),
        }
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.expects.clear();
        self.keys.clear();
    }

    fn push_set(&mut self, id: u64, value: &ValueShape) {
        let key = workload::key_of(id);
        workload::encode_set(&key, value, &mut self.bytes);
        self.expects.push(Expect::Set);
    }

    fn push_get(&mut self, ids: &[u64]) {
        let first = self.keys.len();
        self.keys.extend(ids.iter().map(|&id| workload::key_of(id)));
        workload::encode_get(&self.keys[first..], &mut self.bytes);
        self.expects.push(Expect::Get {
            first,
            count: ids.len(),
        });
    }
}

/// Writes the batch and reads every reply, the two at once so that a large
/// batch cannot deadlock against the server's replies filling the socket.
async fn run_batch(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    batch: &Batch,
    plan: &Plan,
    stats: &mut ConnStats,
) -> Result<(), BatchError> {
    let sent = Instant::now();
    let (mut rd, mut wr) = stream.split();
    let write = async {
        wr.write_all(&batch.bytes).await?;
        Ok::<(), BatchError>(())
    };
    let read = async {
        for expect in &batch.expects {
            loop {
                if let Some((outcome, used)) =
                    reply::parse_reply(buf, expect, &batch.keys, &plan.value)?
                {
                    buf.advance(used);
                    let now = Instant::now();
                    let measured = now >= plan.measure_start && now <= plan.end;
                    stats.count(outcome, expect, now - sent, measured);
                    break;
                }
                buf.reserve(READ_BUFFER_BYTES);
                if rd.read_buf(buf).await? == 0 {
                    return Err(BatchError::Eof);
                }
            }
        }
        Ok::<(), BatchError>(())
    };
    tokio::try_join!(write, read).map(|_| ())
}

/// Opens a connection, retrying after failures until `deadline`.
async fn connect(plan: &Plan, stats: &mut ConnStats, deadline: Instant) -> Option<TcpStream> {
    while Instant::now() < deadline {
        let attempt = timeout(
            Duration::from_millis(CONNECT_TIMEOUT_MS),
            TcpStream::connect(plan.target),
        )
        .await;
        match attempt {
            Ok(Ok(stream)) => {
                // Requests are sent whole; Nagle would only add delay.
                if stream.set_nodelay(true).is_ok() {
                    return Some(stream);
                }
                stats.connect_errors += 1;
            }
            _ => stats.connect_errors += 1,
        }
        let pause = Instant::now() + Duration::from_millis(RECONNECT_PAUSE_MS);
        sleep_until(pause.min(deadline)).await;
    }
    None
}

/// Runs one batch under the request timeout and counts how it failed.
/// Returns false when the connection must be dropped.
async fn run_batch_counted(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    batch: &Batch,
    plan: &Plan,
    stats: &mut ConnStats,
) -> bool {
    match timeout(
        plan.request_timeout,
        run_batch(stream, buf, batch, plan, stats),
    )
    .await
    {
        Ok(Ok(())) => true,
        Ok(Err(BatchError::Io | BatchError::Eof)) => {
            stats.io_errors += 1;
            false
        }
        Ok(Err(BatchError::Desync)) => {
            stats.desyncs += 1;
            false
        }
        Err(_elapsed) => {
            stats.timeouts += 1;
            false
        }
    }
}

/// One connection of the measured run: batches until `plan.end`.
async fn drive(index: usize, plan: Arc<Plan>) -> ConnStats {
    let mut stats = ConnStats::new();
    let mut rng = Rng::new(plan.seed.wrapping_add(index as u64));
    let cycle = u64::from(plan.ratio.sets + plan.ratio.gets);
    // Start each connection at a different place in the mix so that the sets
    // of all connections do not arrive together.
    let mut op_number = rng.below(cycle);
    let mut batch = Batch::new();
    let mut ids = Vec::with_capacity(plan.keys_per_get);
    'connection: while let Some(mut stream) = connect(&plan, &mut stats, plan.end).await {
        let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
        while Instant::now() < plan.end {
            batch.clear();
            for _ in 0..plan.pipeline {
                if plan.ratio.is_set(op_number) {
                    batch.push_set(plan.key_base + rng.below(plan.key_range), &plan.value);
                } else {
                    workload::distinct_ids(&mut rng, plan.key_range, plan.keys_per_get, &mut ids);
                    ids.iter_mut().for_each(|id| *id += plan.key_base);
                    batch.push_get(&ids);
                }
                op_number += 1;
            }
            if !run_batch_counted(&mut stream, &mut buf, &batch, &plan, &mut stats).await {
                continue 'connection;
            }
        }
        break;
    }
    stats
}

/// One connection of the prefill: sets keys `index, index + connections, ...`.
async fn prefill(index: usize, plan: Arc<Plan>, deadline: Instant) -> ConnStats {
    let mut stats = ConnStats::new();
    let mut batch = Batch::new();
    let step = plan.connections as u64;
    let mut next = index as u64;
    'connection: while next < plan.key_range {
        let Some(mut stream) = connect(&plan, &mut stats, deadline).await else {
            break;
        };
        let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
        while next < plan.key_range && Instant::now() < deadline {
            batch.clear();
            let mut id = next;
            while batch.expects.len() < PREFILL_PIPELINE && id < plan.key_range {
                batch.push_set(plan.key_base + id, &plan.value);
                id += step;
            }
            if !run_batch_counted(&mut stream, &mut buf, &batch, &plan, &mut stats).await {
                continue 'connection;
            }
            stats.prefilled += batch.expects.len() as u64;
            next = id;
        }
        break;
    }
    stats
}

/// Waits for every task, aborting any still running at `deadline`.
async fn collect(
    mut tasks: tokio::task::JoinSet<ConnStats>,
    deadline: Instant,
    total: &mut ConnStats,
) -> usize {
    let mut lost = 0;
    loop {
        match tokio::time::timeout_at(deadline, tasks.join_next()).await {
            Ok(Some(Ok(stats))) => total.merge(&stats),
            Ok(Some(Err(_))) => lost += 1,
            Ok(None) => return lost,
            Err(_) => {
                lost += tasks.len();
                tasks.abort_all();
                return lost;
            }
        }
    }
}

/// What happened to the `--idle-connections`.
#[derive(Default)]
struct IdleStats {
    opened: u64,
    connect_failures: u64,
    open_secs: f64,
    answered: u64,
    unanswered: u64,
    check_secs: f64,
}

/// Opens `count` connections one after another (each with its own timeout,
/// all within IDLE_PHASE_DEADLINE_SECS); a failed one is counted, not retried.
async fn open_idle(target: SocketAddr, count: usize, stats: &mut IdleStats) -> Vec<TcpStream> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(IDLE_PHASE_DEADLINE_SECS);
    let mut streams = Vec::with_capacity(count);
    for _ in 0..count {
        if Instant::now() >= deadline {
            stats.connect_failures += 1;
            continue;
        }
        let attempt = timeout(
            Duration::from_millis(IDLE_TIMEOUT_MS),
            TcpStream::connect(target),
        )
        .await;
        match attempt {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                streams.push(stream);
            }
            _ => stats.connect_failures += 1,
        }
    }
    stats.opened = streams.len() as u64;
    stats.open_secs = started.elapsed().as_secs_f64();
    streams
}

/// Sends `version` on one idle connection and reads one line; true when the
/// line is `VERSION ...`.
async fn idle_answers(stream: &mut TcpStream) -> bool {
    let exchange = async {
        stream.write_all(b"version\r\n").await?;
        let mut line = Vec::with_capacity(64);
        let mut chunk = [0u8; 256];
        while !line.ends_with(b"\r\n") {
            let n = stream.read(&mut chunk).await?;
            if n == 0 || line.len() > 4096 {
                return Ok::<bool, std::io::Error>(false);
            }
            line.extend_from_slice(&chunk[..n]);
        }
        Ok(line.starts_with(b"VERSION "))
    };
    matches!(
        timeout(Duration::from_millis(IDLE_TIMEOUT_MS), exchange).await,
        Ok(Ok(true))
    )
}

/// Checks every idle connection, one after another, within the deadline.
async fn check_idle(streams: &mut [TcpStream], stats: &mut IdleStats) {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(IDLE_PHASE_DEADLINE_SECS);
    for stream in streams.iter_mut() {
        if Instant::now() < deadline && idle_answers(stream).await {
            stats.answered += 1;
        } else {
            stats.unanswered += 1;
        }
    }
    stats.check_secs = started.elapsed().as_secs_f64();
}

fn ticks_of(pids: &[String]) -> Vec<Option<u64>> {
    pids.iter().map(|pid| procstat::cpu_ticks(pid)).collect()
}

async fn run(args: Args, ratio: Ratio) -> String {
    let now = Instant::now();
    let mut plan = Plan {
        target: args.target,
        connections: args.connections,
        pipeline: args.pipeline,
        ratio,
        keys_per_get: args.keys_per_get,
        value: ValueShape::new(args.value_size),
        key_range: args.key_range,
        key_base: args.key_base,
        request_timeout: Duration::from_millis(args.timeout_ms),
        seed: args.seed,
        measure_start: now,
        end: now,
    };

    let mut prefill_stats = ConnStats::new();
    let prefill_started = Instant::now();
    if args.prefill {
        let deadline = prefill_started + Duration::from_secs(PREFILL_DEADLINE_SECS);
        let shared = Arc::new(plan.clone());
        let mut tasks = tokio::task::JoinSet::new();
        for index in 0..plan.connections {
            tasks.spawn(prefill(index, Arc::clone(&shared), deadline));
        }
        collect(tasks, deadline + Duration::from_secs(1), &mut prefill_stats).await;
    }
    let prefill_secs = prefill_started.elapsed().as_secs_f64();

    let mut idle = IdleStats::default();
    let mut idle_streams = Vec::new();
    if args.idle_connections > 0 {
        idle_streams = open_idle(plan.target, args.idle_connections, &mut idle).await;
        eprintln!(
            "memring-load: {} idle connections open ({} failed) in {:.2} s",
            idle.opened, idle.connect_failures, idle.open_secs
        );
        sleep(Duration::from_secs(args.idle_settle_secs)).await;
    }

    let start = Instant::now();
    plan.measure_start = start + Duration::from_secs(args.warmup);
    plan.end = plan.measure_start + Duration::from_secs(args.duration_secs);
    let plan = Arc::new(plan);
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..plan.connections {
        tasks.spawn(drive(index, Arc::clone(&plan)));
    }

    let mut pids: Vec<String> = args.watch_pids.iter().map(u32::to_string).collect();
    pids.push("self".to_string());
    sleep_until(plan.measure_start).await;
    let window_start = Instant::now();
    let ticks_before = ticks_of(&pids);
    sleep_until(plan.end).await;
    let ticks_after = ticks_of(&pids);
    let window_secs = window_start.elapsed().as_secs_f64();

    let mut total = ConnStats::new();
    let lost = collect(
        tasks,
        plan.end + plan.request_timeout + Duration::from_secs(2),
        &mut total,
    )
    .await;
    if args.idle_connections > 0 {
        check_idle(&mut idle_streams, &mut idle).await;
        drop(idle_streams);
    }
    // Give sockets closed by the tasks a moment to be torn down before exit,
    // so the next run does not meet our TIME_WAIT burst mid-connect.
    sleep(Duration::from_millis(10)).await;

    let deltas: Vec<Option<u64>> = ticks_before
        .iter()
        .zip(&ticks_after)
        .map(|(b, a)| Some(a.as_ref()?.saturating_sub(*b.as_ref()?)))
        .collect();
    report(
        &args,
        &plan,
        &total,
        &prefill_stats,
        prefill_secs,
        window_secs,
        &deltas,
        lost,
        &idle,
    )
}

fn json_opt(v: Option<u64>) -> String {
    v.map_or_else(|| "null".to_string(), |v| v.to_string())
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    plan: &Plan,
    total: &ConnStats,
    prefill: &ConnStats,
    prefill_secs: f64,
    window_secs: f64,
    deltas: &[Option<u64>],
    lost_tasks: usize,
    idle: &IdleStats,
) -> String {
    let duration = args.duration_secs as f64;
    let hit_ratio = if total.get_keys == 0 {
        "null".to_string()
    } else {
        format!("{:.4}", total.hits as f64 / total.get_keys as f64)
    };
    let q = |quantile: f64| total.hist.value_at_quantile(quantile);
    let mut out = String::new();
    // Field names are stable: bench/harness reads them.
    let _ = write!(
        out,
        concat!(
            "{{\"target\":\"{}\",\"connections\":{},\"pipeline\":{},\"ratio\":\"{}:{}\",",
            "\"keys_per_get\":{},\"value_size\":{},\"key_range\":{},",
            "\"duration_secs\":{},\"window_secs\":{:.3},\"warmup_secs\":{},",
            "\"ops\":{},\"ops_per_sec\":{:.1},\"sets\":{},\"gets\":{},\"get_keys\":{},",
            "\"hits\":{},\"hit_ratio\":{},",
            "\"latency_us\":{{\"p50\":{},\"p90\":{},\"p99\":{},\"p999\":{},\"max\":{},\"mean\":{:.1}}},",
            "\"errors\":{},\"error_detail\":{{\"error_replies\":{},\"not_stored\":{},",
            "\"unexpected_keys\":{},\"bad_values\":{},\"desyncs\":{},\"timeouts\":{},",
            "\"io_errors\":{},\"connect_errors\":{},\"lost_tasks\":{}}},",
            "\"prefill\":{{\"keys\":{},\"secs\":{:.3},\"errors\":{}}},"
        ),
        plan.target,
        plan.connections,
        plan.pipeline,
        plan.ratio.sets,
        plan.ratio.gets,
        plan.keys_per_get,
        plan.value.size(),
        plan.key_range,
        args.duration_secs,
        window_secs,
        args.warmup,
        total.ops,
        total.ops as f64 / duration,
        total.sets,
        total.gets,
        total.get_keys,
        total.hits,
        hit_ratio,
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999),
        total.hist.max(),
        total.hist.mean(),
        total.errors() + lost_tasks as u64,
        total.error_replies,
        total.not_stored,
        total.unexpected_keys,
        total.bad_values,
        total.desyncs,
        total.timeouts,
        total.io_errors,
        total.connect_errors,
        lost_tasks,
        prefill.prefilled,
        prefill_secs,
        prefill.errors(),
    );
    let (watched, own) = deltas.split_at(deltas.len() - 1);
    out.push_str("\"watched\":[");
    for (i, (pid, ticks)) in args.watch_pids.iter().zip(watched).enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{{\"pid\":{pid},\"cpu_ticks\":{}}}", json_opt(*ticks));
    }
    let _ = write!(
        out,
        concat!(
            "],\"idle\":{{\"requested\":{},\"opened\":{},\"connect_failures\":{},",
            "\"open_secs\":{:.3},\"answered\":{},\"unanswered\":{},\"check_secs\":{:.3}}}"
        ),
        args.idle_connections,
        idle.opened,
        idle.connect_failures,
        idle.open_secs,
        idle.answered,
        idle.unanswered,
        idle.check_secs,
    );
    let _ = write!(out, ",\"loadgen_cpu_ticks\":{}}}", json_opt(own[0]));
    out
}

fn main() -> ExitCode {
    let args = Args::parse();
    let ratio = match check(&args) {
        Ok(ratio) => ratio,
        Err(message) => {
            eprintln!("memring-load: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("memring-load: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let json = runtime.block_on(run(args, ratio));
    println!("{json}");
    ExitCode::SUCCESS
}
