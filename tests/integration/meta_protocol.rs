//! Differential tests of the meta protocol layer against a real memcached.
//!
//! Each case is a byte stream a client might send. It is cut into requests the
//! way a session would cut it (`parse_meta` for meta lines, `parse_request` for
//! the rest), and every request is sent on its own to memcached, followed by a
//! sentinel, so each reply can be checked against memring's verdict:
//! - a request memring rejects must get exactly memring's reply from
//!   memcached, and memcached must consume exactly the bytes memring drops
//!   (else the sentinel would be eaten or answered twice);
//! - a request memring forwards must get one reply that `frame_meta_reply`
//!   frames to its last byte (or none at all, only when `q` allows it), equal
//!   to `backend_error`'s reply when the parser predicted one.
//!
//! The replies of the whole case are then compared, with cas and TTL numbers
//! normalised, to what memcached 1.6.18 answered when the case was written.

use crate::common::{show, Client, Memcached, Proxy};
use memring::protocol::meta::reply::{frame_meta_reply, suppressed_by_quiet, MetaStatus};
use memring::protocol::meta::{is_meta_request, parse_meta, MetaCommand};
use memring::protocol::{frame_reply, parse_request, Limits};

/// Sent after every request: a miss whose opaque makes its reply unique.
const SENTINEL: &[u8] = b"mg __sentinel__ Osentinel\r\n";
const SENTINEL_REPLY: &[u8] = b"EN Osentinel\r\n";

/// Errors whose cause is the stored data, not the request line, so the parser
/// cannot predict them.
const DATA_ERRORS: &[&[u8]] =
    &[b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"];

/// How memring handles one request of a case.
enum Unit<'a> {
    /// memring answers with `reply` and drops `bytes`.
    Local {
        bytes: &'a [u8],
        reply: &'static [u8],
    },
    /// memring forwards `bytes` unchanged.
    Meta {
        bytes: &'a [u8],
        command: MetaCommand,
        quiet: bool,
        vivify: bool,
        predicted: Option<&'static [u8]>,
    },
    /// A classic command (the leftover of a meta error), forwarded.
    Classic {
        bytes: &'a [u8],
        kind: memring::protocol::ReplyKind,
    },
}

/// Cuts a case into requests as a session would.
fn units(stream: &[u8]) -> Vec<Unit<'_>> {
    let limits = Limits::default();
    let mut out = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        let rest = &stream[at..];
        let (unit, len) = if is_meta_request(rest) {
            match parse_meta(rest, &limits) {
                Ok(Some((request, n))) => (
                    Unit::Meta {
                        bytes: &rest[..n],
                        command: request.command,
                        quiet: request.may_be_silent(),
                        vivify: request.vivify,
                        predicted: request.backend_error.map(|e| e.reply()),
                    },
                    n,
                ),
                Ok(None) => panic!("incomplete meta request in case: {}", show(rest)),
                Err(rejection) => {
                    let n = rejection.consumed + rejection.discard;
                    assert!(n <= rest.len(), "case too short: {}", show(rest));
                    (
                        Unit::Local {
                            bytes: &rest[..n],
                            reply: rejection.reply().unwrap_or_default(),
                        },
                        n,
                    )
                }
            }
        } else {
            match parse_request(rest, &limits) {
                Ok(Some((request, n))) => (
                    Unit::Classic {
                        bytes: &rest[..n],
                        kind: request.command.reply_kind(),
                    },
                    n,
                ),
                Ok(None) => panic!("incomplete classic request in case: {}", show(rest)),
                Err(rejection) => {
                    let n = rejection.consumed + rejection.discard;
                    (
                        Unit::Local {
                            bytes: &rest[..n],
                            reply: rejection.reply().unwrap_or_default(),
                        },
                        n,
                    )
                }
            }
        };
        out.push(unit);
        at += len;
    }
    out
}

/// Runs one case on `client`; checks every request's verdict and returns the
/// normalised replies of the whole case.
fn run(client: &mut Client, case: &[u8]) -> Vec<u8> {
    let mut all = Vec::new();
    for unit in units(case) {
        let bytes = match &unit {
            Unit::Local { bytes, .. } | Unit::Meta { bytes, .. } | Unit::Classic { bytes, .. } => {
                *bytes
            }
        };
        client.send(bytes);
        client.send(SENTINEL);
        let got = client.read_until_suffix(SENTINEL_REPLY);
        let context = || format!("request {} answered {}", show(bytes), show(&got));
        match unit {
            Unit::Local { reply, .. } => assert_eq!(got, reply, "{}", context()),
            Unit::Meta {
                command,
                quiet,
                vivify,
                predicted,
                ..
            } => {
                if got.is_empty() {
                    assert!(quiet, "no reply without q: {}", context());
                    continue;
                }
                let framed = frame_meta_reply(&got, command)
                    .unwrap_or_else(|e| panic!("{e}: {}", context()))
                    .unwrap_or_else(|| panic!("incomplete: {}", context()));
                assert_eq!(framed.len, got.len(), "one reply: {}", context());
                match predicted {
                    Some(reply) => assert_eq!(got, reply, "predicted: {}", context()),
                    None if framed.status == MetaStatus::ClientError => {
                        assert!(
                            DATA_ERRORS.contains(&&got[..]),
                            "unpredicted: {}",
                            context()
                        )
                    }
                    None => {}
                }
                // With q, a suppressible status never comes, except memcached's
                // `ma ... N q` that creates the counter.
                if quiet && suppressed_by_quiet(command, framed.status) {
                    assert!(
                        command == MetaCommand::Arithmetic && vivify,
                        "q did not suppress: {}",
                        context()
                    );
                }
                all.extend(normalise(&got[..framed.len], framed.status));
            }
            Unit::Classic { kind, .. } => {
                let len = frame_reply(&got, kind)
                    .expect("classic reply frames")
                    .expect("classic reply complete");
                assert_eq!(len, got.len(), "{}", context());
                all.extend(&got);
            }
        }
        if matches!(unit, Unit::Local { .. }) {
            all.extend(&got);
        }
    }
    all
}

/// Masks the numbers that differ from run to run in a meta reply's line: cas
/// (`c<n>`), remaining TTL (`t<n>`, but not `t-1`), seconds since the last
/// access (`l<n>`), and the same three in `me`'s details.
fn normalise(reply: &[u8], status: MetaStatus) -> Vec<u8> {
    let line_end = reply.iter().position(|&b| b == b'\n').expect("a line") + 1;
    let (line, rest) = reply.split_at(line_end);
    let line = &line[..line.len() - 2];
    let mut out = Vec::new();
    for (i, token) in line.split(|&b| b == b' ').enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        let masked: Option<&[u8]> = match status {
            MetaStatus::Me => {
                let name_end = token.iter().position(|&b| b == b'=');
                match name_end.map(|n| &token[..n]) {
                    Some(b"exp" | b"la" | b"cas") => Some(&token[..=name_end.unwrap_or(0)]),
                    _ => None,
                }
            }
            _ if i == 0 || (status == MetaStatus::Va && i == 1) => None,
            _ if token.len() > 1 && token[1..].iter().all(u8::is_ascii_digit) => match token[0] {
                b'c' => Some(b"c"),
                b't' => Some(b"t"),
                b'l' => Some(b"l"),
                _ => None,
            },
            _ => None,
        };
        match masked {
            Some(prefix) => {
                out.extend(prefix);
                out.extend(b"<n>");
            }
            None => out.extend(token),
        }
    }
    out.extend(b"\r\n");
    out.extend(rest);
    out
}

/// [`normalise`] applied to every meta reply line of a whole reply stream;
/// other lines (classic replies, value data) are left as they are.
fn normalise_stream(stream: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for line in stream.split_inclusive(|&b| b == b'\n') {
        let first = line
            .split(|&b| b == b' ' || b == b'\r')
            .next()
            .unwrap_or(&[]);
        let status = match first {
            b"HD" => Some(MetaStatus::Hd),
            b"VA" => Some(MetaStatus::Va),
            b"EN" => Some(MetaStatus::En),
            b"NS" => Some(MetaStatus::Ns),
            b"EX" => Some(MetaStatus::Ex),
            b"NF" => Some(MetaStatus::Nf),
            b"ME" => Some(MetaStatus::Me),
            _ => None,
        };
        match status {
            Some(status) if line.ends_with(b"\r\n") => out.extend(normalise(line, status)),
            _ => out.extend(line),
        }
    }
    out
}

/// Runs each `(case, expected)` in order on one connection to a fresh
/// memcached, so that later cases see what earlier ones stored.
///
/// Then the same cases go, each as one pipelined write, through memring over
/// four fresh memcacheds, and the whole reply stream must be what one
/// memcached answered, and the keys must reach at least two of the four
/// servers (`meta_ring.rs` spreads many keys over all four).
fn check(cases: &[(&[u8], &[u8])]) {
    let server = Memcached::start();
    let mut client = Client::connect(&server.addr());
    for (case, expected) in cases {
        let got = run(&mut client, case);
        assert_eq!(
            show(&got),
            show(expected),
            "case {} (normalised replies)",
            show(case)
        );
    }
    // Named servers: which server each key lands on does not depend on the
    // ports the test got. A table uses a handful of keys; the first naming
    // (of a fixed list) under which they cross servers is the one kept.
    let mut reached = 0;
    for layout in 0..8 {
        reached = check_through_memring(cases, layout);
        if reached >= 2 {
            break;
        }
    }
    assert!(reached >= 2, "the cases' keys never reached 2 of 4 servers");
}

/// Sends every case, pipelined, through memring over four fresh servers
/// named after `layout`; asserts the replies; returns how many servers the
/// keys reached.
fn check_through_memring(cases: &[(&[u8], &[u8])], layout: usize) -> usize {
    let backends: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let mut config = String::from("listen = \"127.0.0.1:0\"\n");
    for (i, backend) in backends.iter().enumerate() {
        config.push_str(&format!(
            "[[servers]]\naddr = \"{}\"\nname = \"meta{layout}-{i}\"\n",
            backend.addr()
        ));
    }
    let proxy = Proxy::start_text(&config);
    let mut client = proxy.client();
    for (case, expected) in cases {
        client.send(case);
        client.send(SENTINEL);
        let got = client.read_until_suffix(SENTINEL_REPLY);
        assert_eq!(
            show(&normalise_stream(&got)),
            show(expected),
            "case {} through memring over 4 servers",
            show(case)
        );
    }
    let reached = backends
        .iter()
        .filter(|backend| {
            let mut client = backend.client();
            client.send(b"stats\r\n");
            let stats = client.read_until_suffix(b"END\r\n");
            let text = String::from_utf8_lossy(&stats);
            let count = |name: &str| -> u64 {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0)
            };
            [
                "cmd_get",
                "cmd_set",
                "delete_misses",
                "delete_hits",
                "incr_misses",
                "incr_hits",
            ]
            .iter()
            .map(|name| count(name))
            .sum::<u64>()
                > 0
        })
        .count();
    eprintln!("layout {layout}: keys reached {reached} of 4 servers");
    reached
}

#[test]
fn basics_get_set_delete_noop_and_debug() {
    check(&[
        (b"mg basic v\r\n", b"EN\r\n"),
        (b"ms basic 2\r\nhi\r\n", b"HD\r\n"),
        (b"mg basic v\r\n", b"VA 2\r\nhi\r\n"),
        (b"mg basic\r\n", b"HD\r\n"),
        (
            b"mg basic k v Oab12 s f\r\n",
            b"VA 2 kbasic Oab12 s2 f0\r\nhi\r\n",
        ),
        (b"mg absent k Oab12\r\n", b"EN kabsent Oab12\r\n"),
        (
            b"mg absent v q\r\nmg basic q\r\nmg basic v q k\r\n",
            b"HD\r\nVA 2 kbasic\r\nhi\r\n",
        ),
        (
            b"ms basic 4\r\na\r\nb\r\nmg basic v\r\n",
            b"HD\r\nVA 4\r\na\r\nb\r\n",
        ),
        (
            b"ms basic 0\r\n\r\nmg basic v s\r\n",
            b"HD\r\nVA 0 s0\r\n\r\n",
        ),
        (
            b"me basic\r\nme absent\r\n",
            b"ME basic exp=<n> la=<n> cas=<n> fetch=yes cls=1 size=64\r\nEN\r\n",
        ),
        (
            b"md basic\r\nmd basic\r\nmd basic q\r\nmg basic v\r\n",
            b"HD\r\nNF\r\nNF\r\nEN\r\n",
        ),
        (
            b"ms basic 1 q\r\nx\r\nms basic 1 q k Oq\r\ny\r\nmg basic v\r\n",
            b"VA 1\r\ny\r\n",
        ),
        (b"mn\r\nmn ignored tokens\r\nmn\n", b"MN\r\nMN\r\nMN\r\n"),
        (
            b"  mg   basic   v  \r\nmg basic v\n",
            b"VA 1\r\ny\r\nVA 1\r\ny\r\n",
        ),
        (
            b"ms \xc3\xa9t\xc3\xa9 2\r\nok\r\nmg \xc3\xa9t\xc3\xa9 v k\r\n",
            b"HD\r\nVA 2 k\xc3\xa9t\xc3\xa9\r\nok\r\n",
        ),
    ]);
}

#[test]
fn flags_and_ttl() {
    check(&[
        (
            b"ms ttl 1 T0 F42\r\nx\r\nmg ttl v f t\r\n",
            b"HD\r\nVA 1 f42 t-1\r\nx\r\n",
        ),
        (
            b"ms ttl 1 T300 F4294967295\r\nx\r\nmg ttl f t v\r\n",
            b"HD\r\nVA 1 f4294967295 t<n>\r\nx\r\n",
        ),
        (
            b"ms ttl 1 F4294967296\r\nx\r\nmg ttl f\r\n",
            b"HD\r\nHD f0\r\n",
        ),
        (b"mg ttl T0 t\r\nmg ttl t\r\n", b"HD t-1\r\nHD t-1\r\n"),
        (b"mg ttl T-1\r\nmg ttl v\r\n", b"HD\r\nEN\r\n"),
        (b"ms ttl 1 T-1\r\nx\r\nmg ttl v\r\n", b"HD\r\nEN\r\n"),
        (
            b"ms ttl 1\r\nx\r\nmg ttl h l\r\nmg ttl h l u\r\nmg ttl h\r\n",
            b"HD\r\nHD h0 l<n>\r\nHD h1 l<n>\r\nHD h1\r\n",
        ),
        (
            b"ms ttl 1 T99999999999\r\nx\r\nmg ttl v\r\n",
            b"HD\r\nEN\r\n",
        ),
    ]);
}

#[test]
fn every_set_mode() {
    check(&[
        (b"ms mode 2 MS\r\nab\r\n", b"HD\r\n"),
        (b"ms mode 2 MA\r\ncd\r\nmg mode v\r\n", b"HD\r\nVA 4\r\nabcd\r\n"),
        (b"ms mode 2 MP\r\nzz\r\nmg mode v\r\n", b"HD\r\nVA 6\r\nzzabcd\r\n"),
        (b"ms mode 2 MR\r\nxx\r\nms fresh 2 MR\r\nxx\r\n", b"HD\r\nNS\r\n"),
        (b"ms mode 2 ME\r\nyy\r\nms fresh 2 ME\r\nyy\r\nmg fresh v\r\n", b"NS\r\nHD\r\nVA 2\r\nyy\r\n"),
        (b"ms gone 2 MA\r\nxx\r\nms gone 2 MP\r\nxx\r\n", b"NS\r\nNS\r\n"),
        (b"ms mode 2 MA q\r\n12\r\nms gone 2 MA q\r\n12\r\nmg mode v\r\n", b"NS\r\nVA 4\r\nxx12\r\n"),
        (b"ms mode 2 Ms\r\nab\r\nms mode 2 MX\r\nab\r\nms mode 2 MSS\r\nab\r\n", b"CLIENT_ERROR invalid mode for ms M token\r\nCLIENT_ERROR invalid mode for ms M token\r\nCLIENT_ERROR incorrect length for M token\r\n"),
        (b"ms mode 2 M\r\nab\r\n", b"CLIENT_ERROR incorrect length for M token\r\n"),
    ]);
}

#[test]
fn compare_and_swap() {
    check(&[
        (b"ms cas 2 c\r\nv1\r\n", b"HD c<n>\r\n"),
        (b"ms cas 2 C1\r\nv2\r\nms nocas 2 C1\r\nv2\r\n", b"HD\r\nNF\r\n"),
        (b"mg cas c v\r\n", b"VA 2 c<n>\r\nv2\r\n"),
        (b"ms cas 2 C99999 q\r\nv3\r\nmd cas C99999\r\nma cas C99999\r\n", b"EX\r\nEX\r\nEX\r\n"),
        (b"ms cas 2 C I\r\nv4\r\nms cas 2 Cx\r\nv4\r\n", b"CLIENT_ERROR bad token in command line format\r\nCLIENT_ERROR bad token in command line format\r\n"),
        (b"ms cas 2 E5\r\nv4\r\nmg cas E5\r\n", b"CLIENT_ERROR invalid flag\r\nCLIENT_ERROR invalid flag\r\n"),
        (b"ms cas 2 MA C1\r\nv5\r\nms cas 2 ME C1\r\nv5\r\n", b"EX\r\nNS\r\n"),
    ]);
}

#[test]
fn delete_and_invalidate() {
    check(&[
        (b"ms del 2 T0\r\nab\r\nmd del q\r\nmd del q\r\nmd del k Oz\r\n", b"HD\r\nNF\r\nNF kdel Oz\r\n"),
        (b"ms del 2\r\nab\r\nmd del C1\r\nmd del I T30\r\nmg del v c t\r\n", b"HD\r\nEX\r\nHD\r\nVA 2 c<n> t<n> X W\r\nab\r\n"),
        (b"mg del v\r\nms del 2 I C1\r\nnn\r\n", b"VA 2 Z X\r\nab\r\nHD\r\n"),
        (b"md del x\r\nmd del Z\r\nmd del q q\r\nmd del T\r\n", b"CLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid or duplicate flag\r\n"),
        (b"md del\r\nmg del\r\n", b"HD\r\nEN\r\n"),
    ]);
}

#[test]
fn arithmetic() {
    check(&[
        (b"ma cnt\r\nma cnt q\r\nma cnt N0 J10 v\r\n", b"NF\r\nNF\r\nVA 2\r\n10\r\n"),
        (b"ma cnt v\r\nma cnt MI D5 v\r\nma cnt M+ v t c\r\n", b"VA 2\r\n11\r\nVA 2\r\n16\r\nVA 2 t-1 c<n>\r\n17\r\n"),
        (b"ma cnt MD D100 v\r\nma cnt M- v\r\n", b"VA 1\r\n0\r\nVA 1\r\n0\r\n"),
        (b"ma big N0 J18446744073709551615 v\r\nma big v\r\n", b"VA 20\r\n18446744073709551615\r\nVA 1\r\n0\r\n"),
        (b"ma big D18446744073709551615 v\r\nma big MD D18446744073709551615 v\r\n", b"VA 20\r\n18446744073709551615\r\nVA 1\r\n0\r\n"),
        (b"ma cnt q\r\nma cnt q v\r\nma viv N0 J7 q\r\nmg cnt v\r\n", b"HD\r\nVA 2\r\n2 \r\n"),
        (b"ma cnt k Oo1 v\r\nma none k Oo2\r\n", b"VA 1 kcnt Oo1\r\n3\r\nNF knone Oo2\r\n"),
        (b"ms text 2\r\nab\r\nma text\r\nma text q\r\n", b"HD\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n"),
        (b"ma cnt D18446744073709551616\r\nma cnt J-1\r\nma cnt D-0 v\r\n", b"CLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid or duplicate flag\r\nVA 1\r\n3\r\n"),
        (b"ma cnt Dx\r\nma cnt Jx\r\nma cnt MX\r\nma cnt Mi\r\nma cnt MII\r\n", b"CLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid mode for ma M token\r\nCLIENT_ERROR invalid mode for ma M token\r\nCLIENT_ERROR invalid or duplicate flag\r\n"),
        (b"ma tmp N30 J1 T60 t v\r\n", b"VA 1 t<n>\r\n1\r\n"),
    ]);
}

#[test]
fn vivify_and_recache_leases() {
    check(&[
        (
            b"mg lease N30 v c t\r\nmg lease N30 v c t\r\nmg lease N30 q\r\n",
            b"VA 0 c<n> t<n> W\r\n\r\nVA 0 c<n> t<n> Z\r\n\r\nHD Z\r\n",
        ),
        // R wins only once the remaining TTL (about 30 s) is below its token.
        (
            b"ms lease 2 T30\r\nhi\r\nmg lease v R10 t\r\nmg lease v R60 t\r\n",
            b"HD\r\nVA 2 t<n>\r\nhi\r\nVA 2 t<n> W\r\nhi\r\n",
        ),
        (b"mg lease v R60 t\r\n", b"VA 2 t<n> Z\r\nhi\r\n"),
        (
            b"md lease I T30\r\nmg lease v c\r\nmg lease v c\r\nmg lease v\r\n",
            b"HD\r\nVA 2 c<n> X W\r\nhi\r\nVA 2 c<n> Z X\r\nhi\r\nVA 2 Z X\r\nhi\r\n",
        ),
        (
            b"ms lease 2 T30\r\nok\r\nmg lease v\r\n",
            b"HD\r\nVA 2\r\nok\r\n",
        ),
        (
            b"mg stale N30 s v\r\nms stale 3 T30\r\nnew\r\nmg stale v\r\n",
            b"VA 0 s0 W\r\n\r\nHD\r\nVA 3\r\nnew\r\n",
        ),
    ]);
}

#[test]
fn debug_and_base64_keys() {
    check(&[
        (b"ms Zm9v 2 b\r\nhi\r\nget foo\r\nme foo\r\nme Zm9v b\r\n", b"HD\r\nVALUE foo 0 2\r\nhi\r\nEND\r\nME Zm9v exp=<n> la=<n> cas=<n> fetch=yes cls=1 size=64\r\nME Zm9v exp=<n> la=<n> cas=<n> fetch=yes cls=1 size=64\r\n"),
        (b"mg Zm9v b v k\r\nmg foo v k\r\nmd Zm9v b q\r\nmg foo v\r\n", b"VA 2 kZm9v b\r\nhi\r\nVA 2 kZm9v b\r\nhi\r\nEN\r\n"),
        (b"ms AP8A 1 b\r\nx\r\nmg AP8A b v k\r\nme AP8A b\r\n", b"HD\r\nVA 1 kAP8A b\r\nx\r\nME AP8A exp=<n> la=<n> cas=<n> fetch=yes cls=1 size=63\r\n"),
        (b"ms Zm9v! 2 b\r\nyo\r\nmg foo v\r\n", b"HD\r\nVA 2\r\nyo\r\n"),
        (b"ma Y291bnQ= b N0 J3 v\r\nma Y291bnQ= b v k\r\nget count\r\n", b"VA 1\r\n3\r\nVA 1 kY291bnQ= b\r\n4\r\nVALUE count 0 1\r\n4\r\nEND\r\n"),
        (b"mg Zm9 b v\r\nmg Zm9 b v Tx\r\nmd Zm9 b\r\nma Zm9 b\r\nme Zm9 b\r\n", b"CLIENT_ERROR error decoding key\r\nCLIENT_ERROR bad token in command line format\r\nCLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR bad command line format\r\n"),
        (b"ms Zm9 2 b\r\nab\r\nms Zm9 2 Tx b\r\nab\r\nms Zm9 2 b Z\r\nab\r\n", b"CLIENT_ERROR error decoding key\r\nCLIENT_ERROR error decoding key\r\nCLIENT_ERROR invalid flag\r\n"),
        (b"mg foo a b c\r\nme\r\nme \r\n", b"CLIENT_ERROR invalid flag\r\nCLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\n"),
    ]);
}

#[test]
fn line_errors() {
    let long_key = "k".repeat(251);
    let key_250 = "k".repeat(250);
    let long_get = format!("mg {long_key} v\r\nms {long_key} 2\r\nab\r\nmg {key_250} v\r\n");
    let flags_19 = b"mg x a b c d e f g h i j k l m n o p q r\r\n";
    check(&[
        (b"mg\r\nmg \r\nms\r\nmd\r\nma \r\nmx foo\r\n", b"ERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\n"),
        (b"ms foo\r\nms foo abc\r\nab\r\nms foo -1\r\nab\r\n", b"CLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\nERROR\r\nCLIENT_ERROR bad command line format\r\nERROR\r\n"),
        (b"ms foo 2147483646\r\nab\r\nms foo 4294967298\r\nab\r\n", b"CLIENT_ERROR bad command line format\r\nERROR\r\nHD\r\n"),
        (long_get.as_bytes(), b"CLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\nERROR\r\nEN\r\n"),
        (flags_19, b"CLIENT_ERROR options flags are too long\r\n"),
        (b"mg x v v v v v v v v v v v v v v v v v v v v v v v v v v\r\n", b"CLIENT_ERROR options flags are too long\r\n"),
        (b"ms foo 2 a b c d e f g h i j k l m n o p q\r\nab\r\n", b"CLIENT_ERROR options flags too long\r\nERROR\r\n"),
        (b"md foo a b c d e f g h i j k l m n o p q r\r\n", b"CLIENT_ERROR options flags too long\r\n"),
        (b"mg foo c d e f g h i j k l m n o p q r s\r\n", b"CLIENT_ERROR invalid flag\r\n"),
        (b"ms foo 2 T\r\nab\r\nms foo 2 Z\r\nab\r\nms foo 2 q q\r\nab\r\n", b"CLIENT_ERROR bad token in command line format\r\nCLIENT_ERROR invalid flag\r\nCLIENT_ERROR duplicate flag\r\n"),
        (b"ms foo 2 Oaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\nab\r\n", b"CLIENT_ERROR opaque token too long\r\n"),
        (b"mg foo Oaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n", b"CLIENT_ERROR opaque token too long\r\n"),
        (b"ms foo 2 Oaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa MX\r\nab\r\n", b"CLIENT_ERROR invalid mode for ms M token\r\n"),
        (b"ms foo 2 F-1\r\nab\r\nms foo 2 Fx Tx\r\nab\r\n", b"CLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad token in command line format\r\n"),
        (b"ms foo 2\r\nabc\r\nms foo 2 q\r\nabcd", b"CLIENT_ERROR bad data chunk\r\nERROR\r\nCLIENT_ERROR bad data chunk\r\n"),
        (b"mg foo E5\r\nmg foo x\r\nmg foo \xff\r\nmg foo 5\r\n", b"CLIENT_ERROR invalid flag\r\nCLIENT_ERROR invalid flag\r\nCLIENT_ERROR duplicate flag\r\nCLIENT_ERROR invalid flag\r\n"),
        (b"mg foo Nx\r\nmg foo Rx\r\nmg foo Cx\r\nmg foo T1x\r\n", b"CLIENT_ERROR bad token in command line format\r\nCLIENT_ERROR bad token in command line format\r\nCLIENT_ERROR bad token in command line format\r\nCLIENT_ERROR bad token in command line format\r\n"),
        (b"mg foo q Nx\r\nmd foo q Z\r\n", b"CLIENT_ERROR bad token in command line format\r\nCLIENT_ERROR invalid or duplicate flag\r\n"),
        (b"mg foo v\0 junk\r\n", b"VA 2\r\nab\r\n"),
    ]);
}

#[test]
fn value_too_large_is_swallowed_like_memcached() {
    let mut case = b"ms big 2000000 T0\r\n".to_vec();
    case.extend(vec![b'x'; 2_000_000]);
    case.extend(b"\r\nms big 2000000 Z\r\n");
    case.extend(vec![b'y'; 2_000_000]);
    case.extend(b"\r\nmg big v\r\n");
    check(&[(
        &case,
        b"SERVER_ERROR object too large for cache\r\nCLIENT_ERROR invalid flag\r\nEN\r\n",
    )]);
}
