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
        assert_eq!(direct.call(change, ReplyKind::Line), b"STORED\r\n");
        assert_eq!(client.get_raw("leased"), b"END\r\n");
        meta_alike(&mut client, &mut direct, read, "leased", "absent");
    }
    // The lease is still there: memring only read it.
    assert!(show(&direct.get_raw("leased")).contains("memring hand-off lease"));
}

/// Five memcached servers and a memring moved from the first four to all
/// five, in its hand-off window, with `count` keys (stored before the
/// change, as `<key>=v` unless `value` says) that the fifth server took over.
struct Joined {
    servers: Vec<Memcached>,
    proxy: Proxy,
    moved: Vec<String>,
    _dir: TempDir,
}

impl Joined {
    fn start(name: &str, count: usize, value: impl Fn(&str) -> String) -> Joined {
        let dir = TempDir::new("leases", name);
        let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
        let all: Vec<&Memcached> = servers.iter().collect();
        let text = |servers: &[&Memcached]| crate::common::named_config_text(servers, "");
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
