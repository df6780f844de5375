//! What memcached 1.6.18's own `t/` tests check, run through memring against
//! real memcached processes. The Debian package ships no `t/` directory, so
//! these are equivalents of the checks memring disagreed with (issue 48):
//! `t/malicious-commands.t` (an HTTP request line closes the connection),
//! `t/getset.t` (a long multi-get; a too-large `set` leaves no stale value),
//! and `flush_all` refused by a server started with `-F`. Each sends the same
//! bytes to one memcached directly and through memring where memcached's
//! answer is the reference.

use crate::common::{show, Client, Memcached, Proxy};
use memring::protocol::ReplyKind;

/// Everything the peer sends until it closes (panics on a read timeout, so a
/// connection left open fails the test).
fn until_closed(client: &mut Client) -> Vec<u8> {
    let mut got = Vec::new();
    loop {
        let before = got.len();
        match client.try_reply(ReplyKind::Line) {
            Some(line) => got.extend(line),
            None => return got,
        }
        assert!(got.len() > before);
    }
}

#[test]
fn an_http_request_line_closes_the_connection_without_a_reply_and_runs_nothing() {
    let direct = Memcached::start();
    let pool: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "");
    // A browser or HTTP client made to post to the cache port (t/malicious-commands.t).
    let post = b"POST / HTTP/1.1\r\nHost: cache\r\nContent-Length: 16\r\n\r\nset k 0 0 1\r\nx\r\n";
    for addr in [direct.addr(), proxy.addr.to_string()] {
        let mut client = Client::connect(&addr);
        client.send(post);
        assert_eq!(show(&until_closed(&mut client)), "", "{addr}");
        let mut check = Client::connect(&addr);
        assert_eq!(check.get("k"), None, "{addr}: the body ran as a command");
    }
    // Replies owed before the line are still written (memcached drops them;
    // memring's close never cuts off what it owes), nothing after it runs.
    let mut client = proxy.client();
    client.send(b"version\r\nGET /x HTTP/1.0\r\nset k 0 0 1\r\ny\r\n");
    let got = until_closed(&mut client);
    assert!(got.starts_with(b"VERSION "), "{}", show(&got));
    assert_eq!(
        got.iter().filter(|&&b| b == b'\n').count(),
        1,
        "{}",
        show(&got)
    );
    assert_eq!(proxy.client().get("k"), None);
    // Known commands read an `HTTP/` token as memcached does.
    let mut direct_client = direct.client();
    let mut proxied = proxy.client();
    for line in [
        &b"get k HTTP/1.1\r\n"[..],
        b"gets k HTTP/1.1\r\n",
        b"verbosity HTTP/1.1\r\n",
        b"axx HTTP/1.1\r\n",
    ] {
        direct_client.send(line);
        proxied.send(line);
        assert_eq!(
            show(&proxied.reply(ReplyKind::Line)),
            show(&direct_client.reply(ReplyKind::Line)),
            "{}",
            show(line)
        );
    }
}

#[test]
fn flush_all_refused_by_a_server_answers_memcacheds_words_without_an_address() {
    // memcached started with `-F` refuses `flush_all`.
    let direct = Memcached::start_with(&["-F"]);
    let refusing = Memcached::start_with(&["-F"]);
    let others: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&[&others[0], &refusing, &others[1]], "");
    let expected = direct.client().call(b"flush_all\r\n", ReplyKind::Line);
    assert_eq!(show(&expected), "CLIENT_ERROR flush_all not allowed\\r\\n");
    let mut client = proxy.client();
    let reply = client.call(b"flush_all\r\n", ReplyKind::Line);
    assert_eq!(show(&reply), show(&expected));
    let reply = client.call(b"flush_all 10\r\n", ReplyKind::Line);
    assert_eq!(show(&reply), show(&expected));
    // Quietly refused with `noreply`, as memcached does; the connection stays in step.
    client.send(b"flush_all noreply\r\n");
    assert_eq!(client.set("after", b"1"), b"STORED\r\n");
}

#[test]
fn stats_reset_answers_reset_and_counts_memrings_own_counters_from_zero() {
    let pool: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "");
    let mut client = proxy.client();
    assert_eq!(client.set("k", b"v"), b"STORED\r\n");
    for _ in 0..3 {
        assert_eq!(client.get("k"), Some(b"v".to_vec()));
    }
    assert_eq!(client.get("missing"), None);
    assert_eq!(client.stat("get_hits"), 3);
    // Sent together: the `stats` before the reset still counts everything.
    client.send(b"stats\r\nstats reset\r\n");
    let before = String::from_utf8(client.read_until_suffix(b"END\r\nRESET\r\n")).unwrap();
    assert!(before.contains("STAT get_hits 3\r\n"), "{before}");
    let stats: std::collections::HashMap<String, String> = client.stats("").into_iter().collect();
    for name in [
        "cmd_get",
        "cmd_set",
        "get_hits",
        "get_misses",
        "total_connections",
    ] {
        assert_eq!(stats[name], "0", "STAT {name}");
    }
    assert_eq!(stats["curr_connections"], "1", "a gauge is not reset");
    assert_eq!(client.get("k"), Some(b"v".to_vec()));
    assert_eq!(client.stat("get_hits"), 1);
    // memcached ignores what follows `reset`.
    assert_eq!(
        client.call(b"stats reset now\r\n", ReplyKind::Line),
        b"RESET\r\n"
    );
    assert_eq!(client.stat("get_hits"), 0);
    // `/metrics` is never reset: Prometheus counters only grow.
    let metrics = proxy.running().stats.prometheus_text();
    let gets: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("memring_client_requests_total{command=\"get\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no get counter in {metrics}"));
    assert!(gets >= 5.0, "{gets}");
}

/// A request whose value (`2 MiB` of `z`) is over the item size of memcached
/// and of memring (1 MiB both).
fn too_large(head: &str) -> Vec<u8> {
    const SIZE: usize = 2 * 1024 * 1024;
    let mut bytes = head.replace("{n}", &SIZE.to_string()).into_bytes();
    bytes.resize(bytes.len() + SIZE, b'z');
    bytes.extend(b"\r\n");
    bytes
}

#[test]
fn a_value_too_large_removes_the_key_exactly_when_memcached_does() {
    let direct = Memcached::start();
    let pool: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "");
    // memcached's t/getset.t: "doesn't leave stale data"; probed on 1.6.18
    // for every storage command, noreply, meta `ms` (quiet, modes, `b`) and
    // lengths that are not numbers.
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (too_large("set {k} 0 0 {n}\r\n"), "set"),
        (too_large("set {k} 0 0 {n} noreply\r\n"), "set noreply"),
        (too_large("add {k} 0 0 {n}\r\n"), "add"),
        (too_large("append {k} 0 0 {n}\r\n"), "append"),
        (too_large("replace {k} 0 0 {n}\r\n"), "replace"),
        (too_large("cas {k} 0 0 {n} 1\r\n"), "cas"),
        (too_large("ms {k} {n} T0\r\n"), "ms"),
        (too_large("ms {k} {n} q\r\n"), "ms q"),
        (too_large("ms {k} {n} MA\r\n"), "ms append mode"),
        (too_large("ms {k} {n} Zbad\r\n"), "ms with a bad flag"),
        (b"set {k} 0 0 -1\r\n".to_vec(), "a negative length"),
        (
            b"set {k} 0 0 abc\r\n".to_vec(),
            "a length that is no number",
        ),
        (b"ms {k} abc\r\n".to_vec(), "ms with no number"),
    ];
    for (i, (request, what)) in cases.iter().enumerate() {
        let key = format!("stale:{i}");
        let request = String::from_utf8_lossy(request).replace("{k}", &key);
        let request = request.as_bytes();
        let mut answers = Vec::new();
        for addr in [direct.addr(), proxy.addr.to_string()] {
            let mut client = Client::connect(&addr);
            assert_eq!(client.set(&key, b"old"), b"STORED\r\n");
            client.send(request);
            client.send(b"mn\r\n");
            let reply = client.read_until_suffix(b"MN\r\n");
            answers.push((show(&reply), show(&client.get_raw(&key))));
        }
        assert_eq!(
            answers[1], answers[0],
            "{what}: memring differs from memcached"
        );
    }
    // A base64 `ms` key is deleted as its decoding.
    let mut client = proxy.client();
    assert_eq!(client.set("b64", b"old"), b"STORED\r\n");
    client.send(&too_large("ms YjY0 {n} b\r\n"));
    assert_eq!(
        client.reply(ReplyKind::Line),
        b"SERVER_ERROR object too large for cache\r\n"
    );
    assert_eq!(client.get("b64"), None);
}

#[test]
fn a_value_too_large_removes_the_key_on_every_replica() {
    let pool: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "replicas = 2\n");
    let mut client = proxy.client();
    for i in 0..10 {
        assert_eq!(client.set(&format!("r:{i}"), b"old"), b"STORED\r\n");
    }
    for i in 0..10 {
        client.send(&too_large(&format!("set r:{i} 0 0 {{n}}\r\n")));
        assert_eq!(
            client.reply(ReplyKind::Line),
            b"SERVER_ERROR object too large for cache\r\n"
        );
    }
    for server in &pool {
        let mut direct = server.client();
        for i in 0..10 {
            assert_eq!(direct.get(&format!("r:{i}")), None, "{}", server.addr());
        }
    }
}

/// Sets `count` keys `prefix<i>` (`i` in five digits, value `v<i>`)
/// through `client`, pipelined.
fn set_many(client: &mut Client, prefix: &str, count: usize) {
    let mut batch = Vec::new();
    for i in 0..count {
        let value = format!("v{i}");
        batch.extend(format!("set {prefix}{i:05} 0 0 {}\r\n{value}\r\n", value.len()).bytes());
    }
    client.send(&batch);
    for _ in 0..count {
        assert_eq!(client.reply(ReplyKind::Line), b"STORED\r\n");
    }
}

/// The reply memcached gives to `get` of `keys` when `<prefix><i>` holds
/// `v<i>` for `i < stored` (and the others are missing).
fn expected_values(keys: &[String], prefix: &str, stored: usize) -> Vec<u8> {
    let mut reply = Vec::new();
    for key in keys {
        let i: usize = key[prefix.len()..].parse().unwrap_or(usize::MAX);
        if i < stored {
            let value = format!("v{i}");
            reply.extend(format!("VALUE {key} 0 {}\r\n{value}\r\n", value.len()).bytes());
        }
    }
    reply.extend(b"END\r\n");
    reply
}

#[test]
fn get_lines_of_any_length_are_served_in_key_order_with_one_end() {
    let direct = Memcached::start();
    let pool: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "");
    let mut client = proxy.client();
    let mut reference = direct.client();
    // memcached's t/getset.t: a 14 000-key get line of about 140 KB.
    let prefix = "mckey";
    set_many(&mut client, prefix, 14_000);
    set_many(&mut reference, prefix, 14_000);
    let mut keys: Vec<String> = (0..14_000).map(|i| format!("{prefix}{i:05}")).collect();
    keys.push("mckey_missing".into());
    keys.push("mckey00007".into());
    let line = format!("get {}\r\n", keys.join(" "));
    assert!(line.len() > 140_000, "{}", line.len());
    let expected = expected_values(&keys, prefix, 14_000);
    reference.send(line.as_bytes());
    assert_eq!(
        reference.read_until_suffix(b"END\r\n").len() + 5,
        expected.len()
    );
    // The line pipelined with requests before and after it, sent in
    // pieces: every value in key order, one END, and the requests behind it.
    let mut whole = b"version\r\n".to_vec();
    whole.extend(line.as_bytes());
    whole.extend(b"get mckey00001\r\n");
    for piece in whole.chunks(7_000) {
        client.send(piece);
    }
    let version = client.reply(ReplyKind::Line);
    assert!(version.starts_with(b"VERSION "));
    let got = client.reply(ReplyKind::Values);
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "values differ from memcached's");
    assert_eq!(
        client.reply(ReplyKind::Values),
        b"VALUE mckey00001 0 2\r\nv1\r\nEND\r\n"
    );
    // A 2 000-key multi-get of 30-byte keys, and `gets`/`gat`/`gats` lines
    // as long: the same values, one END.
    let prefix = "k".repeat(25);
    set_many(&mut client, &prefix, 2_000);
    let keys: Vec<String> = (0..2_000).map(|i| format!("{prefix}{i:05}")).collect();
    let expected = expected_values(&keys, &prefix, 2_000);
    for head in ["get", "gat 0"] {
        let line = format!("{head} {}\r\n", keys.join(" "));
        client.send(line.as_bytes());
        assert!(client.reply(ReplyKind::Values) == expected, "{head}");
    }
    for head in ["gets", "gats 0"] {
        let line = format!("{head} {}\r\n", keys.join(" "));
        client.send(line.as_bytes());
        let got = client.reply(ReplyKind::Values);
        assert_eq!(got.matches_end(), 1, "{head}");
        assert_eq!(
            String::from_utf8_lossy(&got).matches("VALUE ").count(),
            2_000,
            "{head}"
        );
    }
    // A 12 000-key line under 64 KiB: more keys than `max_keys_per_get`
    // (10 000) in one line, as memcached takes it.
    let keys: Vec<String> = (0..12_000).map(|i| format!("{}", i % 100)).collect();
    client.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
    assert_eq!(client.reply(ReplyKind::Values), b"END\r\n");
    // Still one connection, still in step.
    assert_eq!(client.set("after", b"1"), b"STORED\r\n");
}

trait EndCount {
    fn matches_end(&self) -> usize;
}

impl EndCount for Vec<u8> {
    fn matches_end(&self) -> usize {
        String::from_utf8_lossy(self).matches("\r\nEND\r\n").count()
            + usize::from(self.starts_with(b"END\r\n"))
    }
}
