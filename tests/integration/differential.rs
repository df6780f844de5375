//! Differential tests: the same bytes sent straight to one memcached and through
//! memring to a pool of three, the replies compared byte for byte (cas ids
//! masked, as they are per server).

use crate::common::{normalize_cas, show, Client, Memcached, Proxy};

const SENTINEL_SET: &[u8] = b"set __sentinel__ 0 0 8\r\nSENTINEL\r\n";
const SENTINEL_GET: &[u8] = b"get __sentinel__\r\n";
const SENTINEL_REPLY: &[u8] = b"VALUE __sentinel__ 0 8\r\nSENTINEL\r\nEND\r\n";

/// One side of a differential run.
struct Side {
    client: Client,
    last_cas: u64,
}

impl Side {
    fn new(addr: &str) -> Side {
        let mut client = Client::connect(addr);
        client.send(SENTINEL_SET);
        assert_eq!(client.read_until_suffix(b"STORED\r\n"), b"");
        Side {
            client,
            last_cas: 0,
        }
    }

    /// Fills `{cas}` with the last cas id this side saw.
    fn render(&self, step: &[u8]) -> Vec<u8> {
        let text = String::from_utf8_lossy(step);
        if text.contains("{cas}") && step.is_ascii() {
            text.replace("{cas}", &self.last_cas.to_string())
                .into_bytes()
        } else {
            step.to_vec()
        }
    }

    /// Sends one step, then the sentinel; returns everything the step caused.
    fn step(&mut self, step: &[u8]) -> Vec<u8> {
        let request = self.render(step);
        self.client.send(&request);
        self.client.send(SENTINEL_GET);
        let reply = self.client.read_until_suffix(SENTINEL_REPLY);
        let (normalized, cas_ids) = normalize_cas(&reply);
        if let Some(&last) = cas_ids.last() {
            self.last_cas = last;
        }
        normalized
    }

    /// Sends every step in one write, then the sentinel; returns all replies.
    fn pipelined(&mut self, steps: &[&[u8]]) -> Vec<u8> {
        let mut all = Vec::new();
        for step in steps {
            all.extend(self.render(step));
        }
        all.extend_from_slice(SENTINEL_GET);
        self.client.send(&all);
        normalize_cas(&self.client.read_until_suffix(SENTINEL_REPLY)).0
    }
}

/// A direct memcached and memring over three memcached, all with `args`.
struct Rig {
    direct: Memcached,
    _pool: Vec<Memcached>,
    proxy: Proxy,
}

impl Rig {
    fn new(args: &[&str]) -> Rig {
        let direct = Memcached::start_with(args);
        let pool: Vec<Memcached> = (0..3).map(|_| Memcached::start_with(args)).collect();
        let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "");
        Rig {
            direct,
            _pool: pool,
            proxy,
        }
    }

    /// Runs `steps` one at a time on both sides and compares each step's replies.
    fn compare_steps(&self, steps: &[&[u8]]) {
        let mut direct = Side::new(&self.direct.addr());
        let mut proxied = Side::new(&self.proxy.addr.to_string());
        for step in steps {
            let expected = direct.step(step);
            let got = proxied.step(step);
            assert_eq!(
                show(&got),
                show(&expected),
                "step {:?}: memring differs from memcached",
                show(step)
            );
        }
    }

    /// Runs `steps` pipelined in one write on both sides and compares.
    fn compare_pipelined(&self, steps: &[&[u8]]) {
        let expected = Side::new(&self.direct.addr()).pipelined(steps);
        let got = Side::new(&self.proxy.addr.to_string()).pipelined(steps);
        assert_eq!(show(&got), show(&expected), "pipelined run differs");
    }
}

fn storage_steps() -> Vec<&'static [u8]> {
    vec![
        b"set alpha 0 0 5\r\nhello\r\n",
        b"get alpha\r\n",
        b"add alpha 0 0 1\r\nx\r\n",
        b"add beta 7 0 3\r\nnew\r\n",
        b"replace gamma 0 0 1\r\nx\r\n",
        b"replace beta 8 0 4\r\nrepl\r\n",
        b"append beta 0 0 3\r\n+ap\r\n",
        b"prepend beta 0 0 3\r\npp+\r\n",
        b"append missing 0 0 1\r\nx\r\n",
        b"prepend missing 0 0 1\r\nx\r\n",
        b"get beta\r\n",
        b"gets beta\r\n",
        b"cas beta 0 0 3 {cas}\r\ncas\r\n",
        b"cas beta 0 0 3 {cas}\r\nold\r\n",
        b"cas nothere 0 0 1 1\r\nx\r\n",
        b"gets beta alpha\r\n",
        b"delete alpha\r\n",
        b"delete alpha\r\n",
        b"delete beta 0\r\n",
        b"get alpha beta\r\n",
        b"set counter 0 0 3\r\n100\r\n",
        b"incr counter 5\r\n",
        b"decr counter 6\r\n",
        b"decr counter 1000\r\n",
        b"get counter\r\n",
        b"set wrap 0 0 20\r\n18446744073709551615\r\n",
        b"incr wrap 1\r\n",
        b"incr missing 1\r\n",
        b"decr missing 1\r\n",
        b"set text 0 0 2\r\nhi\r\n",
        b"incr text 1\r\n",
        b"touch text 100\r\n",
        b"touch missing 100\r\n",
        b"gat 100 text\r\n",
        b"gats 100 text missing\r\n",
        b"gat 0\r\n",
        b"set flags 4294967295 0 1\r\nf\r\n",
        b"get flags\r\n",
        b"set expired 0 -1 1\r\nx\r\n",
        b"get expired\r\n",
        b"set empty 0 0 0\r\n\r\n",
        b"get empty\r\n",
        b"set crlf 0 0 8\r\na\r\nb\r\n\r\n\r\n",
        b"get crlf\r\n",
        b"set quirk +5 99999999999 1 extra\r\nq\r\n",
        b"get quirk\r\n",
        // A NUL ends the line; lengths wrap at 32 bits (memcached 1.6.18).
        b"set nul 0 0 1\0junk\r\nn\r\n",
        b"get nul\r\n",
        b"set wrapped 0 0 4294967298\r\nab\r\n",
        b"get wrapped\r\n",
        b"get quirk\r\n",
    ]
}

fn noreply_steps() -> Vec<&'static [u8]> {
    vec![
        b"set nr 0 0 1 noreply\r\n1\r\n",
        b"get nr\r\n",
        b"add nr 0 0 1 noreply\r\n2\r\n",
        b"add nr2 0 0 1 noreply\r\n2\r\n",
        b"replace nr 0 0 1 noreply\r\n3\r\n",
        b"append nr 0 0 1 noreply\r\n4\r\n",
        b"prepend nr 0 0 1 noreply\r\n5\r\n",
        b"get nr nr2\r\n",
        b"gets nr\r\n",
        b"cas nr 0 0 1 {cas} noreply\r\n6\r\n",
        b"get nr\r\n",
        b"incr nr 10 noreply\r\n",
        b"decr nr 1 noreply\r\n",
        b"get nr\r\n",
        b"incr nr2 abc noreply\r\n",
        b"touch nr 100 noreply\r\n",
        b"touch nr abc noreply\r\n",
        b"delete nr noreply\r\n",
        b"delete nr2 0 noreply\r\n",
        b"delete nr 1 noreply\r\n",
        b"get nr nr2\r\n",
        b"set bad 0 0 -1 noreply\r\n",
        b"set chunk 0 0 1 noreply\r\nzz\r\n",
        b"verbosity 1 noreply\r\n",
    ]
}

fn bad_input_steps() -> Vec<&'static [u8]> {
    vec![
        b"set a 0 0 -1\r\nxx\r\n",
        b"set a 0 0 2147483646\r\nxx\r\n",
        b"set a 0 0 4294967295\r\nxx\r\n",
        b"set a 0 0 abc\r\nxx\r\n",
        b"set a -1 0 1\r\nz\r\n",
        b"set a 0 0 1\r\nzz\r\n",
        b"set a 0 0\r\n",
        b"set a 0 0 1 noreply extra\r\nz\r\n",
        b"cas a 0 0 1\r\nz\r\n",
        b"cas a 0 0 1 -1\r\nz\r\n",
        b"incr a abc\r\n",
        b"incr a -1\r\n",
        b"incr a 18446744073709551616\r\n",
        b"touch a abc\r\n",
        b"gat abc a\r\n",
        b"delete a 1\r\n",
        b"delete a x y\r\n",
        b"\r\n",
        b"GET a\r\n",
        b"foo bar\r\n",
        b"s\r\n",
        b"get\r\n",
        b"gets\r\n",
        b"incr\r\n",
        b"touch a\r\n",
        b"delete\r\n",
        b"verbosity\r\n",
        b"verbosity x\r\n",
        b"verbosity 1\r\n",
        b"flush_all x\r\n",
        b"flush_all 3600 2\r\n",
        b"flush_all noreply 2\r\n",
        b"  get a\r\n",
        b"get  a   a\n",
    ]
}

#[test]
fn every_command_matches_memcached_one_step_at_a_time() {
    let rig = Rig::new(&[]);
    rig.compare_steps(&storage_steps());
}

#[test]
fn every_command_matches_memcached_when_pipelined() {
    let rig = Rig::new(&[]);
    rig.compare_pipelined(&storage_steps());
}

#[test]
fn noreply_matches_memcached() {
    let rig = Rig::new(&[]);
    rig.compare_steps(&noreply_steps());
    rig.compare_pipelined(&noreply_steps());
}

#[test]
fn bad_input_gets_memcacheds_replies() {
    let rig = Rig::new(&[]);
    rig.compare_steps(&bad_input_steps());
    rig.compare_pipelined(&bad_input_steps());
}

#[test]
fn long_keys_match_memcached() {
    let rig = Rig::new(&[]);
    let long = "k".repeat(251);
    let ok = "k".repeat(250);
    let steps: Vec<Vec<u8>> = vec![
        format!("set {long} 0 0 1\r\nz\r\n").into_bytes(),
        format!("set {ok} 0 0 1\r\nz\r\n").into_bytes(),
        format!("get {ok}\r\n").into_bytes(),
        format!("get {long}\r\n").into_bytes(),
        format!("get {ok} {long}\r\n").into_bytes(),
        format!("delete {long}\r\n").into_bytes(),
        format!("incr {long} 1\r\n").into_bytes(),
        format!("touch {long} 1\r\n").into_bytes(),
        format!("gat 1 {long}\r\n").into_bytes(),
        format!("set {long} 0 0 1 noreply\r\nz\r\n").into_bytes(),
    ];
    let steps: Vec<&[u8]> = steps.iter().map(Vec::as_slice).collect();
    rig.compare_steps(&steps);
}

#[test]
fn binary_values_match_memcached() {
    let rig = Rig::new(&[]);
    let all_bytes: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let mut set = format!("set bin 3 0 {}\r\n", all_bytes.len()).into_bytes();
    set.extend_from_slice(&all_bytes);
    set.extend_from_slice(b"\r\n");
    rig.compare_steps(&[
        &set,
        b"get bin\r\n",
        b"append bin 0 0 2\r\n\r\n\r\n",
        b"gets bin\r\n",
    ]);
}

#[test]
fn one_mebibyte_values_and_oversized_values_match_memcached() {
    // memcached's item size includes its header, so the pool is started with
    // 2 MiB items to hold a 1 MiB value; memring's own limit stays 1 MiB.
    let rig = Rig::new(&["-I", "2m"]);
    let mib = vec![b'v'; 1024 * 1024];
    let mut set = b"set big 0 0 1048576\r\n".to_vec();
    set.extend_from_slice(&mib);
    set.extend_from_slice(b"\r\n");
    let huge_len = 3 * 1024 * 1024;
    let mut too_big = format!("set huge 0 0 {huge_len}\r\n").into_bytes();
    too_big.extend(std::iter::repeat_n(b'h', huge_len));
    too_big.extend_from_slice(b"\r\n");
    let mut too_big_noreply = format!("set huge 0 0 {huge_len} noreply\r\n").into_bytes();
    too_big_noreply.extend(std::iter::repeat_n(b'h', huge_len));
    too_big_noreply.extend_from_slice(b"\r\n");
    let steps: Vec<&[u8]> = vec![
        &set,
        b"get big\r\n",
        &too_big,
        b"get huge\r\n",
        &too_big_noreply,
        b"get big huge\r\n",
    ];
    rig.compare_steps(&steps);
    rig.compare_pipelined(&steps);
}

#[test]
fn multi_get_across_three_servers_keeps_key_order_with_misses() {
    let rig = Rig::new(&[]);
    let mut steps: Vec<Vec<u8>> = Vec::new();
    let mut get = b"get".to_vec();
    let mut gets = b"gets".to_vec();
    for i in 0..40 {
        if i % 4 != 3 {
            steps.push(
                format!(
                    "set key:{i} {i} 0 {}\r\nvalue-{i}\r\n",
                    format!("value-{i}").len()
                )
                .into_bytes(),
            );
        }
        get.extend(format!(" key:{i}").bytes());
        gets.extend(format!(" key:{}", 39 - i).bytes());
        if i % 10 == 0 {
            get.extend(b" key:0");
        }
    }
    get.extend(b"\r\n");
    gets.extend(b"\r\n");
    steps.push(get);
    steps.push(gets);
    steps.push(b"gat 100 key:1 nothing key:2 key:1\r\n".to_vec());
    let steps: Vec<&[u8]> = steps.iter().map(Vec::as_slice).collect();
    rig.compare_steps(&steps);
    rig.compare_pipelined(&steps);

    // The keys really were spread: every server of the pool holds some.
    for server in &rig._pool {
        let mut direct = server.client();
        let held = (0..40)
            .filter(|i| i % 4 != 3)
            .filter(|i| direct.get(&format!("key:{i}")).is_some())
            .count();
        assert!(held > 0, "server {} holds none of the keys", server.addr());
    }
}

#[test]
fn admin_commands_are_refused_and_the_connection_stays_usable() {
    // Meta commands are forwarded (tests/integration/meta_ring.rs); these are not.
    let rig = Rig::new(&[]);
    let mut client = rig.proxy.client();
    for command in [
        &b"shutdown\r\n"[..],
        b"slabs reassign 1 2\r\n",
        b"lru_crawler metadump all\r\n",
    ] {
        client.send(command);
        assert_eq!(
            client.read_until_suffix(b"ERROR\r\n"),
            b"",
            "{}",
            show(command)
        );
    }
    assert_eq!(client.set("still", b"ok"), b"STORED\r\n");
}
