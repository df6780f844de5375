//! Hand-off leases another sidecar placed (`memring::protocol::lease`), met
//! through memring, against real memcached: every kind of read answers a
//! lease as memcached answers a key that is not there, and a moved key whose
//! new owner holds a lease is read through from its previous owner.

use crate::common::{replace_by_rename, show, wait_for, Client, Memcached, Proxy, TempDir};
use memring::protocol::lease::{LEASE_FLAGS, LEASE_MARKER};
use memring::protocol::ReplyKind;

/// Stores `data` under `key` with the lease's flags, as a sidecar placing a
/// lease would (straight to the server).
fn place(server: &mut Client, key: &str, data: &[u8]) {
    let mut request = format!("set {key} {LEASE_FLAGS} 30 {}\r\n", data.len()).into_bytes();
    request.extend_from_slice(data);
    request.extend_from_slice(b"\r\n");
    assert_eq!(server.call(&request, ReplyKind::Line), b"STORED\r\n");
}

/// Places another sidecar's hand-off lease on `key` at `new_owner`, as its
/// read-through would: returns the lease's cas.
fn another_sidecars_lease(new_owner: &mut Client, key: &str) -> String {
    place(new_owner, key, LEASE_MARKER);
    new_owner.send(format!("mg {key} c\r\n").as_bytes());
    let lease = show(&new_owner.meta_reply());
    lease
        .trim_start_matches("HD c")
        .trim_end_matches("\\r\\n")
        .to_string()
}

/// The other sidecar's copy of `key` arrives late, by its `lease`'s cas and
/// with the TTL the previous owner had: it fails (`what` names it).
fn other_fill_fails(new_owner: &mut Client, key: &str, lease: &str, what: &str) {
    let fill = format!("ms {key} {} T120 C{lease}\r\n{key}=v\r\n", key.len() + 2);
    new_owner.send(fill.as_bytes());
    assert_eq!(show(&new_owner.meta_reply()), "EX\\r\\n", "{what}");
}

/// A meta request through memring and straight to memcached, where `absent`
/// names a key memcached does not hold: the lease must read as that miss.
fn meta_alike(through: &mut Client, direct: &mut Client, request: &str, key: &str, absent: &str) {
    through.send(request.replace("{key}", key).as_bytes());
    direct.send(request.replace("{key}", absent).as_bytes());
    let (got, want) = (through.meta_reply(), direct.meta_reply());
    assert_eq!(
        show(&got),
        show(&want).replace(absent, key),
        "{request} on a lease"
    );
}

#[test]
fn a_lease_reads_as_a_miss_in_every_kind_of_read() {
    let server = Memcached::start();
    let proxy = Proxy::start(&[&server], "");
    let (mut direct, mut client) = (server.client(), proxy.client());
    place(&mut direct, "leased", LEASE_MARKER);
    client.set("before", b"b");
    client.set("after", b"a");
    // Data with the lease's flags that is not a lease is a value, and so is
    // the marker under other flags.
    place(&mut direct, "flagged", b"not a lease");
    direct.set("marked", LEASE_MARKER);

    for get in ["get", "gets", "gat 100", "gats 100"] {
        let reply = client.call(
            format!("{get} before leased after\r\n").as_bytes(),
            ReplyKind::Values,
        );
        let text = show(&reply);
        assert!(!text.contains("leased"), "{get}: {text}");
        assert!(
            text.contains("VALUE before 0 1") && text.contains("VALUE after 0 1"),
            "{get}: {text}"
        );
        assert_eq!(client.get_raw("leased"), b"END\r\n", "{get}");
    }
    let both = client.call(b"get flagged marked\r\n", ReplyKind::Values);
    assert!(
        show(&both).contains(&format!("VALUE flagged {LEASE_FLAGS} 11"))
            && show(&both).contains("VALUE marked 0 24"),
        "{}",
        show(&both)
    );

    for request in [
        "mg {key} v\r\n",
        "mg {key} v f t c s\r\n",
        "mg {key} v k O77 f\r\n",
        "mg {key} k v t\r\n",
    ] {
        meta_alike(&mut client, &mut direct, request, "leased", "absent");
    }
    // A quiet mg says nothing on a miss: only the mn's MN comes.
    client.send(b"mg leased v q\r\nmg before v q\r\nmn\r\n");
    assert_eq!(client.meta_reply(), b"VA 1\r\nb\r\n");
    assert_eq!(client.meta_reply(), b"MN\r\n");

    // An append or a prepend that reached the lease leaves a lease: still a
    // miss, with or without the flags in a meta reply.
    for (change, read) in [
        (&b"append leased 0 0 3\r\n.v7\r\n"[..], "mg {key} v\r\n"),
        (b"prepend leased 0 0 2\r\nv6\r\n", "mg {key} v f\r\n"),
    ] {
        place(&mut direct, "leased", LEASE_MARKER);
        assert_eq!(direct.call(change, ReplyKind::Line), b"STORED\r\n");
        assert_eq!(client.get_raw("leased"), b"END\r\n");
        meta_alike(&mut client, &mut direct, read, "leased", "absent");
    }
    // The lease is still there: memring only read it.
    assert!(show(&direct.get_raw("leased")).contains("memring hand-off lease"));
}

/// Every `mg` that does not ask for the value (issue 48, item 2) answers
/// a lease as memcached answers an absent key: memring asks for the client
/// flags (and the size) it needs to know a lease by, and the client gets
/// memcached's bytes for its own request.
#[test]
fn a_lease_is_a_miss_to_an_mg_that_does_not_ask_for_the_value() {
    let server = Memcached::start();
    let proxy = Proxy::start(&[&server], "");
    let (mut direct, mut client) = (server.client(), proxy.client());
    place(&mut direct, "leased", LEASE_MARKER);
    let mut appended = LEASE_MARKER.to_vec();
    appended.extend_from_slice(b".v7");
    place(&mut direct, "appended", &appended);
    for leased in ["leased", "appended"] {
        for request in [
            "mg {key}\r\n",
            "mg {key} s\r\n",
            "mg {key} f\r\n",
            "mg {key} t\r\n",
            "mg {key} c\r\n",
            "mg {key} k O9\r\n",
            "mg {key} O9 k s f t c\r\n",
            "mg {key} v\r\n",
            "mg {key} u h l\r\n",
        ] {
            meta_alike(&mut client, &mut direct, request, leased, "absent");
        }
        // A quiet mg says nothing on a miss: only the mn's MN comes.
        client.send(format!("mg {leased} q s\r\nmg {leased} q k\r\nmn\r\n").as_bytes());
        assert_eq!(show(&client.meta_reply()), "MN\\r\\n", "{leased}");
    }
    // A value: the reply is memcached's own, the flags memring asked for
    // removed.
    direct.set("value", b"abc");
    for request in [
        "mg {key}\r\n",
        "mg {key} s\r\n",
        "mg {key} k O9 t\r\n",
        "mg {key} f O1\r\n",
        "mg {key} v k\r\n",
    ] {
        meta_alike(&mut client, &mut direct, request, "value", "value");
    }
    client.send(b"mg value q k\r\nmn\r\n");
    assert_eq!(show(&client.meta_reply()), "HD kvalue\\r\\n");
    assert_eq!(show(&client.meta_reply()), "MN\\r\\n");
}

/// Values that merely look like leases are values (issue 48, item 5): the
/// marker at an end of a value with other flags, and the marker in the
/// middle of a value with the lease's flags.
#[test]
fn values_that_look_like_leases_are_values_to_every_read() {
    let server = Memcached::start();
    let proxy = Proxy::start(&[&server], "");
    let (mut direct, mut client) = (server.client(), proxy.client());
    let mut starts = LEASE_MARKER.to_vec();
    starts.extend_from_slice(b"tail");
    let mut ends = b"head".to_vec();
    ends.extend_from_slice(LEASE_MARKER);
    direct.set("starts", &starts);
    direct.set("ends", &ends);
    direct.set("exactly", LEASE_MARKER);
    place(
        &mut direct,
        "middle",
        &[&b"head"[..], LEASE_MARKER, b"tail"].concat(),
    );
    for key in ["starts", "ends", "exactly", "middle"] {
        for request in ["get {key}\r\n", "gets {key}\r\n"] {
            let request = request.replace("{key}", key);
            assert_eq!(
                show(&client.call(request.as_bytes(), ReplyKind::Values)),
                show(&direct.call(request.as_bytes(), ReplyKind::Values)),
                "{request}"
            );
        }
        for request in ["mg {key} v\r\n", "mg {key} v f s t c\r\n"] {
            meta_alike(&mut client, &mut direct, request, key, key);
        }
        // Without the value, an item is known by its flags and size: only
        // the lease's flags are memring's (docs/handoff.md).
        if key != "middle" {
            for request in ["mg {key} s\r\n", "mg {key}\r\n"] {
                meta_alike(&mut client, &mut direct, request, key, key);
            }
        }
    }
}

/// Five memcached servers and a memring moved from the first four to all
/// five, in its hand-off window, with `count` keys (stored before the
/// change, as `<key>=v` unless `value` says) that the fifth server took over.
struct Joined {
    servers: Vec<Memcached>,
    proxy: Proxy,
    moved: Vec<String>,
    /// The ring of five.
    ring: memring::ring::Ring,
    _dir: TempDir,
}

impl Joined {
    /// The index in `servers` of `key`'s owner among five.
    fn owner(&self, key: &str) -> usize {
        let member = self.ring.owner(key.as_bytes()).unwrap();
        let identity = &self.ring.members()[member].identity;
        self.servers
            .iter()
            .position(|s| *identity == format!("cache-{}", s.port))
            .unwrap()
    }
}

impl Joined {
    fn start(name: &str, count: usize, value: impl Fn(&str) -> String) -> Joined {
        let dir = TempDir::new("leases", name);
        let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
        let all: Vec<&Memcached> = servers.iter().collect();
        // A generous request timeout: these tests are about answers, and a
        // loaded machine must not turn one into a timeout.
        let text = |servers: &[&Memcached]| {
            crate::common::named_config_text(servers, "request_timeout_ms = 5000")
        };
        let path = dir.path("memring.toml");
        std::fs::write(&path, text(&all[..4])).unwrap();
        let proxy = Proxy::start_file(&path);
        // Keys whose owner among four is not the one among five: the fifth
        // server's share.
        let five = memring::ring::Ring::build(
            memring::config::Config::parse(&text(&all), "five.toml")
                .unwrap()
                .members(),
        );
        let moved: Vec<String> = (0..5000)
            .map(|i| format!("{name}:{i}"))
            .filter(|key| {
                let owner = five.owner(key.as_bytes()).unwrap();
                five.members()[owner].identity == format!("cache-{}", servers[4].port)
            })
            .take(count)
            .collect();
        assert_eq!(moved.len(), count, "keys the fifth server takes over");
        let mut client = proxy.client();
        for key in &moved {
            client.set(key, value(key).as_bytes());
        }
        let version = proxy.ring_version();
        replace_by_rename(&path, &text(&all));
        wait_for("the ring of five", || proxy.ring_version() > version);
        Joined {
            servers,
            proxy,
            moved,
            ring: five,
            _dir: dir,
        }
    }
}

/// A moved key whose new owner holds another sidecar's lease (its copy not
/// yet landed) is read through from its previous owner, in both dialects;
/// the lease itself is left for its owner to replace.
#[test]
fn a_moved_key_leased_on_its_new_owner_is_read_through_from_its_previous_owner() {
    let joined = Joined::start("read-through", 2, |key| format!("{key}=v"));
    let (proxy, moved) = (&joined.proxy, &joined.moved);
    let mut client = proxy.client();
    let mut new_owner = joined.servers[4].client();
    for key in moved {
        place(&mut new_owner, key, LEASE_MARKER);
    }
    let (classic, meta) = (&moved[0], &moved[1]);
    assert_eq!(
        client.get(classic),
        Some(format!("{classic}=v").into_bytes())
    );
    client.send(format!("mg {meta} v\r\n").as_bytes());
    assert_eq!(
        show(&client.meta_reply()),
        show(format!("VA {}\r\n{meta}=v\r\n", meta.len() + 2).as_bytes())
    );
    // The copies found the lease there and stood back.
    wait_for("both copies skipped", || {
        proxy.client().stat("handoff_copies_skipped") == 2
    });
    for key in moved {
        assert!(
            show(&new_owner.get_raw(key)).contains("memring hand-off lease"),
            "{key}: the lease is its placer's to replace"
        );
    }
}

/// A read-through places its copy's lease on the new owner, and the copy
/// replaces it a little later. A client that changes the key right after
/// reading it, pipelined on the same connection, must change the copy and
/// not the lease: an `append` to the lease would be lost with it, and an
/// `incr` would find it non-numeric. So the client's writes of moved keys
/// wait for its own copies.
#[test]
fn a_write_right_after_the_same_clients_read_through_changes_the_copy() {
    let joined = Joined::start("own-lease", 4, |_| "5".into());
    let mut client = joined.proxy.client();
    let [incr, append, ma, meta_append] = &joined.moved[..] else {
        unreachable!()
    };
    client.send(format!("get {incr}\r\nincr {incr} 2\r\n").as_bytes());
    assert_eq!(
        show(&client.reply(ReplyKind::Values)),
        show(format!("VALUE {incr} 0 1\r\n5\r\nEND\r\n").as_bytes())
    );
    assert_eq!(show(&client.reply(ReplyKind::Line)), "7\\r\\n");
    assert_eq!(client.get(incr), Some(b"7".to_vec()), "{incr}");

    client.send(format!("get {append}\r\nappend {append} 0 0 1\r\nx\r\n").as_bytes());
    let got = show(&client.reply(ReplyKind::Values));
    assert!(got.contains("\\r\\n5\\r\\n"), "{append}: {got}");
    assert_eq!(show(&client.reply(ReplyKind::Line)), "STORED\\r\\n");
    assert_eq!(client.get(append), Some(b"5x".to_vec()), "{append}");

    client.send(format!("mg {ma} v\r\nma {ma} v\r\n").as_bytes());
    assert_eq!(show(&client.meta_reply()), "VA 1\\r\\n5\\r\\n");
    assert_eq!(show(&client.meta_reply()), "VA 1\\r\\n6\\r\\n");
    assert_eq!(client.get(ma), Some(b"6".to_vec()), "{ma}");

    client.send(format!("mg {meta_append} v\r\nms {meta_append} 1 MA\r\ny\r\n").as_bytes());
    assert_eq!(show(&client.meta_reply()), "VA 1\\r\\n5\\r\\n");
    assert_eq!(show(&client.meta_reply()), "HD\\r\\n");
    assert_eq!(
        client.get(meta_append),
        Some(b"5y".to_vec()),
        "{meta_append}"
    );
}

/// Another sidecar's read-through has just put its copy's lease on a moved
/// key's new owner when a client here increments the key: to memcached the
/// lease is a value that is not a number. The `incr` (and `ma`) makes the
/// copy itself, over that lease, and continues the count, instead of
/// answering `CLIENT_ERROR`.
#[test]
fn an_increment_meeting_another_sidecars_lease_continues_the_count() {
    let joined = Joined::start("incr-lease", 2, |_| "5".into());
    let mut new_owner = joined.servers[4].client();
    for key in &joined.moved {
        place(&mut new_owner, key, LEASE_MARKER);
    }
    let mut client = joined.proxy.client();
    let (classic, meta) = (&joined.moved[0], &joined.moved[1]);
    assert_eq!(
        show(&client.call(format!("incr {classic} 2\r\n").as_bytes(), ReplyKind::Line)),
        "7\\r\\n"
    );
    client.send(format!("ma {meta} v\r\n").as_bytes());
    assert_eq!(show(&client.meta_reply()), "VA 1\\r\\n6\\r\\n");
    for (key, count) in [(classic, "7"), (meta, "6")] {
        assert_eq!(client.get(key), Some(count.as_bytes().to_vec()), "{key}");
        assert_eq!(
            new_owner.get(key),
            Some(count.as_bytes().to_vec()),
            "{key} on its new owner"
        );
    }
}

/// A differential test: a leased key through memring and an absent key on
/// one memcached get the same random reads, in both dialects (`mg` with
/// every combination of the flags a read may carry, quiet or not, and
/// classic multi-key gets mixing the key with values), and must answer the
/// same bytes. Seeded, so a failure names its seed and repeats.
#[test]
fn a_leased_key_answers_every_read_as_an_absent_key_does() {
    let server = Memcached::start();
    let proxy = Proxy::start(&[&server], "");
    let (mut direct, mut client) = (server.client(), proxy.client());
    let mut appended = LEASE_MARKER.to_vec();
    appended.extend_from_slice(b"-appended");
    let mut prepended = b"prepended-".to_vec();
    prepended.extend_from_slice(LEASE_MARKER);
    // Leased keys and absent keys of the same length, so a `k` token or a
    // base64 key reads alike once the name is swapped.
    let leases = [
        ("lease0", LEASE_MARKER),
        ("lease1", &appended),
        ("lease2", &prepended),
    ];
    for (key, data) in leases {
        place(&mut direct, key, data);
    }
    client.set("value", b"v");
    let flags = ["v", "f", "s", "t", "c", "k", "h", "l", "u", "O", "q", "b"];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..600 {
        let (leased, _) = leases[(next() % 3) as usize];
        let absent = "absent";
        let mut chosen: Vec<&str> = flags.iter().copied().filter(|_| next() % 3 == 0).collect();
        // Any order memcached takes.
        for i in (1..chosen.len()).rev() {
            chosen.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        let base64 = chosen.contains(&"b");
        let token = |key: &str| {
            if base64 {
                base64_of(key.as_bytes())
            } else {
                key.to_string()
            }
        };
        let line = |key: &str| {
            let mut line = format!("mg {}", token(key));
            for flag in &chosen {
                line.push(' ');
                line.push_str(flag);
                if *flag == "O" {
                    line.push_str(&format!("{round}"));
                }
            }
            line.push_str("\r\n");
            if chosen.contains(&"q") {
                line.push_str("mn\r\n");
            }
            line
        };
        let (through, straight) = (line(leased), line(absent));
        client.send(through.as_bytes());
        direct.send(straight.as_bytes());
        let (got, want) = (
            replies_to_mn(&mut client, &through),
            replies_to_mn(&mut direct, &straight),
        );
        assert_eq!(
            show(&got),
            show(&want).replace(&token(absent), &token(leased)),
            "round {round}: {through:?} on a lease, {straight:?} on memcached"
        );

        // Classic: the key among values, in a random place.
        let get = ["get", "gets", "get", "gets"][(next() % 4) as usize];
        let first = next() % 2 == 0;
        let classic = |key: &str| {
            if first {
                format!("{get} {key} value\r\n")
            } else {
                format!("{get} value {key}\r\n")
            }
        };
        let got = client.call(classic(leased).as_bytes(), ReplyKind::Values);
        let want = direct.call(classic(absent).as_bytes(), ReplyKind::Values);
        // gets' cas of `value` is the same item's on both.
        assert_eq!(
            show(&got),
            show(&want),
            "round {round}: {}",
            classic(leased)
        );
    }
}

/// The replies to `request` up to its last line (`MN` when it ends with
/// `mn`).
fn replies_to_mn(client: &mut Client, request: &str) -> Vec<u8> {
    let mut all = Vec::new();
    loop {
        let reply = client.meta_reply();
        let done = !request.ends_with("mn\r\n") || reply == b"MN\r\n";
        all.extend_from_slice(&reply);
        if done {
            return all;
        }
    }
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A command that a lease would mislead (issue 48, items 2 and 3), inside
/// a hand-off window: `mg … N` vivifies, `mg … T` and `touch` miss and
/// leave no lease behind to stretch, `ma … N` autovivifies, `ma`, `incr`,
/// `decr` and `cas` find nothing, `add` and `ms … ME` store, `append`,
/// `prepend` and their `ms` modes store nothing, byte for byte as one
/// memcached where the key is absent; and the key is then what it is there.
#[test]
fn a_command_meeting_a_lease_answers_as_for_an_absent_key() {
    let joined = Joined::start("commands", 0, |_| String::new());
    let reference = Memcached::start();
    let (mut client, mut absent) = (joined.proxy.client(), reference.client());
    let cases = [
        "mg {key} N30 v\r\n",
        "mg {key} N30\r\n",
        "mg {key} N30 s t k O5\r\n",
        "mg {key} T3600 v\r\n",
        "mg {key} T3600\r\n",
        "mg {key} v T3600 N30\r\n",
        "ma {key} N0 J10 v\r\n",
        "ma {key} N0 J10 q O7\r\nmn\r\n",
        "ma {key}\r\n",
        "ma {key} MD v\r\n",
        "ms {key} 2 ME\r\nhi\r\n",
        "ms {key} 2 ME k O3 q\r\nhi\r\nmn\r\n",
        "mg {key} v N30 q\r\nmn\r\n",
        "ms {key} 1 MA\r\nx\r\n",
        "ms {key} 1 MP q\r\nx\r\nmn\r\n",
        "touch {key} 3600\r\n",
        "touch {key} 3600 noreply\r\n",
        "add {key} 0 0 1\r\nx\r\n",
        "incr {key} 1\r\n",
        "decr {key} 1\r\n",
        "cas {key} 0 0 1 77\r\nx\r\n",
        "append {key} 0 0 1\r\nx\r\n",
        "prepend {key} 0 0 1 noreply\r\nx\r\n",
    ];
    // Keys that did not move: their one owner answers (a moved key's
    // commands run the hand-off's own steps).
    let stay = (0..1000)
        .map(|i| format!("commands:{i}"))
        .filter(|key| joined.owner(key) != 4);
    for (request, key) in cases.iter().zip(stay) {
        let mut owner = joined.servers[joined.owner(&key)].client();
        place(&mut owner, &key, LEASE_MARKER);
        let (through, direct) = (
            request.replace("{key}", &key),
            request.replace("{key}", &key),
        );
        client.send(through.as_bytes());
        absent.send(direct.as_bytes());
        let reply = |to: &mut Client, request: &str| {
            if request.starts_with('m') {
                replies_to_mn(to, request)
            } else if request.contains("noreply") {
                Vec::new()
            } else {
                to.reply(ReplyKind::Line)
            }
        };
        assert_eq!(
            show(&reply(&mut client, &through)),
            show(&reply(&mut absent, &direct)),
            "{through:?} on a lease"
        );
        // What the key is afterwards, and that no lease is left to meet.
        let after = format!("mg {key} v f\r\n");
        client.send(after.as_bytes());
        absent.send(after.as_bytes());
        assert_eq!(
            show(&client.meta_reply()),
            show(&absent.meta_reply()),
            "{through:?}: the key afterwards"
        );
        let add = format!("add {key} 0 0 1\r\nx\r\n");
        assert_eq!(
            show(&client.call(add.as_bytes(), ReplyKind::Line)),
            show(&absent.call(add.as_bytes(), ReplyKind::Line)),
            "{through:?}: an add afterwards"
        );
    }
}

/// Another sidecar's read-through copy of a moved key has placed its lease
/// on the new owner and not yet filled it, when a client here touches,
/// appends to or (meta) appends to the key (issue 48, items 3 and 4). To
/// memcached the lease is an item: the touch stretched it to an hour and
/// the copy, filled by the lease's cas (a touch keeps the cas), then put
/// the old TTL back, losing the acknowledged touch; an append extended the
/// lease and was lost with it. Now the command takes the lease over (the
/// key's value copied over it by its cas) and acts on the value, and the
/// other copy's fill fails.
#[test]
fn a_change_meeting_another_sidecars_lease_is_never_lost_to_its_copy() {
    let joined = Joined::start("racing-copy", 4, |key| format!("{key}=v"));
    let mut new_owner = joined.servers[4].client();
    let mut client = joined.proxy.client();
    let [touch, touch_quiet, append, meta_append] = &joined.moved[..] else {
        unreachable!()
    };
    let cases = [
        (
            touch,
            format!("touch {touch} 3600\r\n"),
            "TOUCHED\r\n",
            "=v",
        ),
        (
            touch_quiet,
            format!("touch {touch_quiet} 3600 noreply\r\n"),
            "",
            "=v",
        ),
        (
            append,
            format!("append {append} 0 0 1\r\nx\r\n"),
            "STORED\r\n",
            "=vx",
        ),
        (
            meta_append,
            format!("ms {meta_append} 1 MA\r\ny\r\n"),
            "HD\r\n",
            "=vy",
        ),
    ];
    for (key, request, answer, value) in cases {
        let lease = another_sidecars_lease(&mut new_owner, key);
        client.send(request.as_bytes());
        if !answer.is_empty() {
            assert_eq!(
                show(&client.reply(ReplyKind::Line)),
                show(answer.as_bytes()),
                "{request:?}"
            );
        }
        let want = format!("{key}{value}");
        assert_eq!(
            client.get(key),
            Some(want.clone().into_bytes()),
            "{request:?}"
        );
        // The other sidecar's copy arrives now, by the lease's cas, with
        // the TTL the previous owner had.
        other_fill_fails(
            &mut new_owner,
            key,
            &lease,
            &format!("{request:?}: the fill"),
        );
        new_owner.send(format!("mg {key} v t\r\n").as_bytes());
        let held = show(&new_owner.meta_reply());
        assert!(held.contains(&want), "{request:?}: {held}");
        if request.starts_with("touch") {
            let ttl: u32 = held
                .split(['t', '\\'])
                .nth(1)
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            assert!(ttl > 3000, "{request:?}: the touch's TTL kept, {held}");
        }
    }
}

/// Every command of both dialects, on `{key}`, for the sequence tests.
const SEQUENCE_COMMANDS: &[&str] = &[
    "get {key}\r\n",
    "gets {key}\r\n",
    "touch {key} 30\r\n",
    "add {key} 0 30 1\r\na\r\n",
    "append {key} 0 0 1\r\np\r\n",
    "prepend {key} 0 0 1\r\nq\r\n",
    "incr {key} 2\r\n",
    "decr {key} 1\r\n",
    "cas {key} 0 0 1 987654321\r\nc\r\n",
    "set {key} 0 30 1\r\n5\r\n",
    "ma {key}\r\n",
    "ma {key} N30 J10 v\r\n",
    "ma {key} MD v q\r\nmn\r\n",
    "ms {key} 1 ME\r\n7\r\n",
    "ms {key} 1 MA q\r\n8\r\nmn\r\n",
    "ms {key} 1 MP k\r\n9\r\n",
    "ms {key} 1 MS T30 F3\r\n4\r\n",
    "gat 30 {key}\r\n",
    "gats 0 {key}\r\n",
    "delete {key}\r\n",
    "replace {key} 0 0 1\r\nr\r\n",
    "md {key}\r\n",
    "md {key} q\r\nmn\r\n",
    "md {key} I T30\r\n",
    "md {key} C987654321 k\r\n",
    "ms {key} 1 MR\r\n6\r\n",
    "ms {key} 1 C987654321\r\n3\r\n",
    "ms {key} 1 MA C987654321 I\r\n2\r\n",
];

/// `mg` flags for the sequence tests. Not `t`, `l` or `R`, which read two
/// servers' clocks, nor `h`, which tells whether memcached changed an item
/// in place (it may not while another of its threads holds the item).
const SEQUENCE_MG_FLAGS: &[&str] = &["v", "f", "s", "k", "c", "O9", "q", "N30", "T30"];

/// Sends `keys.len() × steps` random requests (`SEQUENCE_COMMANDS` and
/// `mg`s with random flags) for each key through memring (`client`) and to
/// one memcached that lacks the key (`absent`); every reply must match,
/// cas numbers aside (per server: a compared cas is one no server has
/// handed out). `before(key)` sets the key up first (places its lease).
/// Another sequence: MEMRING_TEST_SEED=<number>.
fn same_answers_as_an_absent_key(
    client: &mut Client,
    absent: &mut Client,
    keys: &[String],
    steps: usize,
    mut before: impl FnMut(&str),
) {
    let mut seed: u64 = std::env::var("MEMRING_TEST_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(0x2545_f491_4f6c_dd1d);
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for key in keys {
        before(key);
        let mut sent = Vec::new();
        for _ in 0..steps {
            let request = if next() % 3 == 0 {
                let mut line = format!("mg {key}");
                for flag in SEQUENCE_MG_FLAGS.iter().filter(|_| next() % 3 == 0) {
                    line.push(' ');
                    line.push_str(flag);
                }
                line.push_str("\r\n");
                if line.contains(" q") {
                    line.push_str("mn\r\n");
                }
                line
            } else {
                let pick = (next() % SEQUENCE_COMMANDS.len() as u64) as usize;
                SEQUENCE_COMMANDS[pick].replace("{key}", key)
            };
            sent.push(request.clone());
            client.send(request.as_bytes());
            absent.send(request.as_bytes());
            let reply = |to: &mut Client| -> Vec<u8> {
                if request.starts_with('m') {
                    replies_to_mn(to, &request)
                } else if request.starts_with("get") || request.starts_with("gat") {
                    to.reply(ReplyKind::Values)
                } else {
                    to.reply(ReplyKind::Line)
                }
            };
            assert_eq!(
                without_cas(&reply(client)),
                without_cas(&reply(absent)),
                "{key}: {sent:?} on a lease"
            );
        }
    }
}

/// The differential test for commands: inside a hand-off window, a key
/// that did not move and holds another sidecar's lease (through memring)
/// and an absent key (on one memcached) get the same random sequence of
/// commands, both dialects, and must answer the same.
#[test]
fn a_leased_key_answers_every_command_as_an_absent_key_does() {
    let joined = Joined::start("sequences", 0, |_| String::new());
    let reference = Memcached::start();
    let (mut client, mut absent) = (joined.proxy.client(), reference.client());
    let keys: Vec<String> = (0..5000)
        .map(|i| format!("sequences:{i}"))
        .filter(|key| joined.owner(key) != 4)
        .take(150)
        .collect();
    same_answers_as_an_absent_key(&mut client, &mut absent, &keys, 8, |key| {
        let mut owner = joined.servers[joined.owner(key)].client();
        place(&mut owner, key, LEASE_MARKER);
    });
}

/// The same for keys that moved: the new owner holds another sidecar's
/// lease and the previous owner no longer has the key (it expired there).
#[test]
fn a_moved_key_leased_on_its_new_owner_answers_every_command_as_an_absent_key_does() {
    let joined = Joined::start("moved-sequences", 60, |_| "0".into());
    let reference = Memcached::start();
    let (mut client, mut absent) = (joined.proxy.client(), reference.client());
    let mut new_owner = joined.servers[4].client();
    same_answers_as_an_absent_key(&mut client, &mut absent, &joined.moved, 6, |key| {
        for server in &joined.servers[..4] {
            let delete = format!("delete {key}\r\n");
            server.client().call(delete.as_bytes(), ReplyKind::Line);
        }
        place(&mut new_owner, key, LEASE_MARKER);
    });
}

/// `reply` with its cas numbers (per server) left out: a meta `c` token,
/// a `gets` line's last number.
fn without_cas(reply: &[u8]) -> String {
    show(reply)
        .split("\\r\\n")
        .map(|line| {
            let tokens: Vec<&str> = line.split(' ').collect();
            let value_line = tokens[0] == "VALUE" && tokens.len() == 5;
            let meta = matches!(tokens[0], "HD" | "VA" | "EN" | "NS" | "NF" | "EX");
            tokens
                .iter()
                .enumerate()
                .map(|(i, token)| {
                    let cas = (value_line && i == 4)
                        || (meta
                            && i > 0
                            && token.starts_with('c')
                            && token[1..].chars().all(|c| c.is_ascii_digit()));
                    if cas {
                        "c#"
                    } else {
                        token
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\\r\\n")
}

/// A `gat` of a moved key reads it through from its previous owner while
/// another sidecar's copy has its lease on the new owner (issue 48, items
/// 3 and 4): the `gat`'s own copy finds the key held there, and used to
/// stand back, leaving the lease (stretched by nothing, filled later by the
/// other copy with the TTL from before the `gat`): the acknowledged `gat`
/// lost its TTL. Now the copy replaces that lease by its cas, with the
/// `gat`'s TTL, and the other copy's fill fails.
#[test]
fn a_gat_read_through_beside_another_sidecars_lease_keeps_its_ttl() {
    let joined = Joined::start("racing-gat", 2, |key| format!("{key}=v"));
    let mut new_owner = joined.servers[4].client();
    let mut client = joined.proxy.client();
    for (key, get) in joined.moved.iter().zip(["gat", "gats"]) {
        let lease = another_sidecars_lease(&mut new_owner, key);
        let reply = client.call(
            format!("{get} 3600 {key}\r\n").as_bytes(),
            ReplyKind::Values,
        );
        assert!(
            show(&reply).contains(&format!("{key}=v")),
            "{get}: {}",
            show(&reply)
        );
        wait_for("the lease replaced", || {
            let mut owner = joined.servers[4].client();
            owner.send(format!("mg {key} f\r\n").as_bytes());
            owner.meta_reply() == b"HD f0\r\n"
        });
        other_fill_fails(
            &mut new_owner,
            key,
            &lease,
            &format!("{get}: the other fill"),
        );
        new_owner.send(format!("mg {key} t\r\n").as_bytes());
        let held = show(&new_owner.meta_reply());
        let ttl: u32 = held
            .trim_start_matches("HD t")
            .trim_end_matches("\\r\\n")
            .parse()
            .unwrap_or(0);
        assert!(ttl > 3000, "{get}: the TTL kept, {held}");
    }
}

/// An `mg … T` of a moved key whose new owner holds another sidecar's lease
/// (issue 48, item 3): the new owner's miss (the lease, to a reader) sends
/// it to the previous owner, and its copy finds the key held. It used to
/// run on the lease again, stretching it to the client's TTL and missing;
/// now it takes the lease over, so the client gets the value with its new
/// TTL, and the other copy's fill fails.
#[test]
fn an_mg_touch_of_a_moved_key_beside_another_sidecars_lease_takes_it_over() {
    let joined = Joined::start("touching-mg", 2, |key| format!("{key}=v"));
    let mut new_owner = joined.servers[4].client();
    let mut client = joined.proxy.client();
    for (key, request) in joined
        .moved
        .iter()
        .zip(["mg {key} T3600 v", "mg {key} T3600 t"])
    {
        let lease = another_sidecars_lease(&mut new_owner, key);
        let request = format!("{}\r\n", request.replace("{key}", key));
        client.send(request.as_bytes());
        let reply = show(&client.meta_reply());
        assert!(
            reply.starts_with("VA") && reply.contains(&format!("{key}=v"))
                || reply.starts_with("HD t3600")
                || reply.starts_with("HD t3599"),
            "{request:?}: {reply}"
        );
        other_fill_fails(
            &mut new_owner,
            key,
            &lease,
            &format!("{request:?}: the fill"),
        );
        new_owner.send(format!("mg {key} t v\r\n").as_bytes());
        let held = show(&new_owner.meta_reply());
        assert!(held.contains(&format!("{key}=v")), "{request:?}: {held}");
        let ttl: u32 = held
            .split(['t', '\\'])
            .nth(1)
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        assert!(ttl > 3000, "{request:?}: the TTL, {held}");
    }
}

/// An `ma … N` or an `add` of a moved key copies the key from its previous
/// owner first; with another sidecar's lease on the new owner that copy is
/// refused, and the command then met the lease (issue 48, item 2: `ma k N0
/// J10` answered `CLIENT_ERROR`, `add` `NOT_STORED`). Now the lease is taken
/// over: the count continues from the previous owner's value, and where
/// the previous owner holds nothing the lease goes and the command meets an
/// absent key, as one memcached would answer.
#[test]
fn an_autovivify_or_add_of_a_moved_key_beside_another_sidecars_lease() {
    let joined = Joined::start("vivify-moved", 4, |_| "5".into());
    let mut new_owner = joined.servers[4].client();
    let mut client = joined.proxy.client();
    let [counted, vivified, refused, added] = &joined.moved[..] else {
        unreachable!()
    };
    // Gone from the previous owner (straight, as an expiry would).
    for key in [vivified, added] {
        for server in &joined.servers[..4] {
            server
                .client()
                .call(format!("delete {key}\r\n").as_bytes(), ReplyKind::Line);
        }
    }
    for key in &joined.moved {
        place(&mut new_owner, key, LEASE_MARKER);
    }
    client.send(format!("ma {counted} N0 J10 v\r\n").as_bytes());
    assert_eq!(show(&client.meta_reply()), "VA 1\\r\\n6\\r\\n", "{counted}");
    client.send(format!("ma {vivified} N0 J10 v\r\n").as_bytes());
    assert_eq!(
        show(&client.meta_reply()),
        "VA 2\\r\\n10\\r\\n",
        "{vivified}"
    );
    let add = |key: &str| format!("add {key} 0 0 1\r\nx\r\n");
    assert_eq!(
        show(&client.call(add(refused).as_bytes(), ReplyKind::Line)),
        "NOT_STORED\\r\\n"
    );
    assert_eq!(client.get(refused), Some(b"5".to_vec()), "{refused}");
    assert_eq!(
        show(&client.call(add(added).as_bytes(), ReplyKind::Line)),
        "STORED\\r\\n"
    );
    assert_eq!(client.get(added), Some(b"x".to_vec()), "{added}");
}

/// Looking for a lease leaves the item as the client's next `mg` expects
/// it: not marked fetched (`h0`), and a stale item's recache token (`W`)
/// still there for the client to win. Before, the look took both: the
/// client's `mg` answered `h1`, and `Z` (the token already given).
#[test]
fn a_look_for_a_lease_leaves_the_item_as_it_was() {
    let joined = Joined::start("looks", 0, |_| String::new());
    let mut client = joined.proxy.client();
    let keys = (0..5000)
        .map(|i| format!("looks:{i}"))
        .filter(|key| joined.owner(key) != 4)
        .take(2);
    for (key, stale) in keys.zip([false, true]) {
        let mut owner = joined.servers[joined.owner(&key)].client();
        let set = format!("set {key} 0 0 1\r\na\r\n");
        assert_eq!(owner.call(set.as_bytes(), ReplyKind::Line), b"STORED\r\n");
        if stale {
            owner.send(format!("md {key} I T30\r\n").as_bytes());
            assert_eq!(owner.meta_reply(), b"HD\r\n");
        }
        // A `cas` looks for a lease first; then the key is as it was.
        let cas = format!("cas {key} 0 0 1 987654321\r\nc\r\n");
        assert_eq!(client.call(cas.as_bytes(), ReplyKind::Line), b"EXISTS\r\n");
        client.send(format!("mg {key} h\r\n").as_bytes());
        let expected = if stale {
            "HD h0 X W\\r\\n"
        } else {
            "HD h0\\r\\n"
        };
        assert_eq!(show(&client.meta_reply()), expected, "{key}");
    }
}
