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
