//! The hottest keys over every worker: the windows the workers publish, their
//! merge, the `stats hotkeys` reply, and when a key starts or stops taking
//! more than its share of a server. Pure: no I/O, no clock (times are
//! passed in).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::BytesMut;

use super::sketch::Estimate;
use crate::protocol::encode::{printable_key, write_stat};

/// One server's counts in one worker's window.
#[derive(Debug, Clone)]
pub struct ServerWindow {
    pub name: Arc<str>,
    /// Requests for this server's keys in the window.
    pub total: u64,
    /// The server's largest counters, largest first.
    pub keys: Vec<Estimate>,
    /// The most a key not in `keys` was counted: the last published counter
    /// when `keys` holds as many as a window publishes (others may have
    /// been left out), else 0.
    pub floor: u64,
}

/// What one worker counted in one complete window.
#[derive(Debug, Clone)]
pub struct WorkerWindow {
    /// Length of the window.
    pub seconds: f64,
    pub servers: Vec<ServerWindow>,
    /// One request in this many was counted (1: all of them).
    pub sampled_one_in: u64,
}

/// One hot key over every worker.
#[derive(Debug, Clone, PartialEq)]
pub struct HotKey {
    pub key: Box<[u8]>,
    pub hash: u64,
    pub server: Arc<str>,
    /// Estimated requests per second (never below the true rate where the
    /// worker counted every request, see `detect.rs`).
    pub rate: f64,
    /// How far `rate` may be above the true rate.
    pub error: f64,
    /// `rate` over its server's requests per second.
    pub share: f64,
    /// The server's requests per second.
    pub server_rate: f64,
}

/// Adds up the workers' recent windows (each worker's oldest first): per
/// key its counts over the worker's windows divided by their length, added
/// over the workers; per server the same of its totals. Largest rate first.
///
/// A window that did not publish a key (it was below the window's last
/// published counter, see [`ServerWindow::floor`]) adds that floor to the
/// key's count and to its error: the most it may have been, so `rate` stays
/// an upper bound and `rate - error` a lower one.
pub fn merge<H: AsRef<[Arc<WorkerWindow>]>>(workers: &[H]) -> Vec<HotKey> {
    // Every key any window published, by server.
    let mut by_server: HashMap<Arc<str>, HashMap<u64, HotKey>> = HashMap::new();
    for window in workers.iter().flat_map(|history| history.as_ref()) {
        for server in &window.servers {
            let keys = by_server.entry(server.name.clone()).or_default();
            for estimate in &server.keys {
                keys.entry(estimate.hash).or_insert_with(|| HotKey {
                    key: estimate.key.clone(),
                    hash: estimate.hash,
                    server: server.name.clone(),
                    rate: 0.0,
                    error: 0.0,
                    share: 0.0,
                    server_rate: 0.0,
                });
            }
        }
    }
    let mut server_rates: HashMap<Arc<str>, f64> = HashMap::new();
    for history in workers {
        let history = history.as_ref();
        let seconds = history.iter().map(|w| w.seconds).sum::<f64>().max(0.001);
        for window in history.iter() {
            for server in &window.servers {
                *server_rates.entry(server.name.clone()).or_default() +=
                    server.total as f64 / seconds;
                let Some(keys) = by_server.get_mut(&server.name) else {
                    continue;
                };
                let published: HashMap<u64, &Estimate> =
                    server.keys.iter().map(|e| (e.hash, e)).collect();
                for (hash, key) in keys.iter_mut() {
                    let (count, error) = published
                        .get(hash)
                        .map_or((server.floor, server.floor), |e| (e.count, e.error));
                    key.rate += count as f64 / seconds;
                    key.error += error as f64 / seconds;
                }
            }
        }
    }
    let mut merged: Vec<HotKey> = by_server
        .into_values()
        .flat_map(HashMap::into_values)
        .map(|mut key| {
            key.server_rate = server_rates.get(&key.server).copied().unwrap_or(0.0);
            if key.server_rate > 0.0 {
                key.share = (key.rate / key.server_rate).min(1.0);
            }
            key
        })
        .collect();
    merged.sort_by(|a, b| {
        b.rate
            .total_cmp(&a.rate)
            .then_with(|| a.server.cmp(&b.server))
            .then_with(|| a.key.cmp(&b.key))
    });
    merged
}

/// Writes the `stats hotkeys` reply: the window and sketch size, how sparse
/// the busiest worker's sample was (`1`: every request counted), then five
/// lines per key, hottest first, then `END`. With `names`, keys are printed
/// by [`printable_key`]; without, as their [`hashed_label`], as `/metrics`
/// names them (the data port is open to every client, and other clients'
/// key names can be personal data).
pub fn render(
    out: &mut BytesMut,
    keys: &[HotKey],
    window_ms: u128,
    counters: usize,
    sampled_one_in: u64,
    names: bool,
) {
    write_stat(out, "hotkeys_window_ms", &window_ms);
    write_stat(out, "hotkeys_counters_per_server", &counters);
    write_stat(out, "hotkeys_sampled_one_in", &sampled_one_in);
    for (i, key) in keys.iter().enumerate() {
        let rank = i + 1;
        // A meta `b` key may hold any byte, `\r\n` included: printed raw it
        // could end the reply early and inject lines.
        let name = if names {
            printable_key(&key.key)
        } else {
            Cow::Owned(hashed_label(key.hash))
        };
        write_stat(out, &format!("hotkey:{rank}:key"), &name);
        write_stat(out, &format!("hotkey:{rank}:server"), &key.server);
        write_stat(
            out,
            &format!("hotkey:{rank}:rate"),
            &format_args!("{:.1}", key.rate),
        );
        write_stat(
            out,
            &format!("hotkey:{rank}:share"),
            &format_args!("{:.4}", key.share),
        );
        write_stat(
            out,
            &format!("hotkey:{rank}:error"),
            &format_args!("{:.1}", key.error),
        );
    }
    out.extend_from_slice(b"END\r\n");
}

/// How a key is named where names are not asked for: `xxh3:` and its hash
/// in 16 hex digits (the hash hides names from a casual reader, not from one
/// who can guess candidate keys).
pub fn hashed_label(hash: u64) -> String {
    format!("xxh3:{hash:016x}")
}

/// A key started or stopped taking more than its share of a server.
#[derive(Debug, Clone, PartialEq)]
pub enum Episode {
    Started(HotKey),
    Ended { server: Arc<str>, key: Box<[u8]> },
}

/// Keys now over their share: each is told once when it crosses the share
/// and once when it falls below half of it (or out of the top), so a key
/// hovering at the threshold does not log every window.
#[derive(Debug, Default)]
pub struct Episodes {
    active: HashMap<(Arc<str>, u64), Box<[u8]>>,
}

impl Episodes {
    /// The starts and ends in `merged` (one window's merge), given the
    /// share that makes a key hot and the fewest requests per second a
    /// server must see before any of its keys counts as hot.
    pub fn update(&mut self, merged: &[HotKey], share: f64, min_server_rate: f64) -> Vec<Episode> {
        let mut events = Vec::new();
        let mut still: HashMap<(Arc<str>, u64), ()> = HashMap::new();
        for key in merged {
            let id = (key.server.clone(), key.hash);
            let busy = key.server_rate >= min_server_rate;
            if self.active.contains_key(&id) {
                if busy && key.share >= share / 2.0 {
                    still.insert(id, ());
                }
            } else if busy && key.share >= share {
                self.active.insert(id.clone(), key.key.clone());
                still.insert(id, ());
                events.push(Episode::Started(key.clone()));
            }
        }
        self.active.retain(|(server, hash), key| {
            let keep = still.contains_key(&(server.clone(), *hash));
            if !keep {
                events.push(Episode::Ended {
                    server: server.clone(),
                    key: key.clone(),
                });
            }
            keep
        });
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(key: &str, count: u64, error: u64) -> Estimate {
        Estimate {
            hash: twox_hash::XxHash3_64::oneshot(key.as_bytes()),
            key: key.as_bytes().into(),
            count,
            error,
        }
    }

    /// Merges each window as the one window of its own worker.
    fn merge_each(windows: Vec<WorkerWindow>) -> Vec<HotKey> {
        let workers: Vec<[Arc<WorkerWindow>; 1]> =
            windows.into_iter().map(|w| [Arc::new(w)]).collect();
        merge(&workers)
    }

    fn window(seconds: f64, servers: &[(&str, u64, Vec<Estimate>)]) -> WorkerWindow {
        WorkerWindow {
            seconds,
            sampled_one_in: 1,
            servers: servers
                .iter()
                .map(|(name, total, keys)| ServerWindow {
                    name: (*name).into(),
                    total: *total,
                    keys: keys.clone(),
                    floor: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn workers_add_up_per_key_and_per_server() {
        let a = window(
            1.0,
            &[
                ("s1", 100, vec![estimate("k", 40, 2), estimate("j", 10, 0)]),
                ("s2", 50, vec![estimate("m", 30, 0)]),
            ],
        );
        let b = window(2.0, &[("s1", 100, vec![estimate("k", 60, 0)])]);
        let merged = merge_each(vec![a, b]);
        let names: Vec<&[u8]> = merged.iter().map(|k| &k.key[..]).collect();
        assert_eq!(names, vec![&b"k"[..], b"m", b"j"]);
        // k: 40/s + 30/s over s1's 100/s + 50/s.
        assert_eq!(merged[0].rate, 70.0);
        assert_eq!(merged[0].error, 2.0);
        assert_eq!(merged[0].server_rate, 150.0);
        assert!((merged[0].share - 70.0 / 150.0).abs() < 1e-9);
        assert_eq!(merged[1].share, 0.6);
    }

    #[test]
    fn a_workers_windows_add_up_over_their_length_with_floors_for_left_out_keys() {
        // One worker, two windows of 1 s; `j` was not published in the
        // second, whose last published counter was 5.
        let first = window(
            1.0,
            &[("s", 100, vec![estimate("k", 40, 0), estimate("j", 10, 0)])],
        );
        let mut second = window(1.0, &[("s", 60, vec![estimate("k", 20, 2)])]);
        second.servers[0].floor = 5;
        let history = [Arc::new(first), Arc::new(second)];
        // A second worker with one window of 2 s.
        let other = [Arc::new(window(
            2.0,
            &[("s", 40, vec![estimate("k", 10, 0)])],
        ))];
        let merged = merge(&[&history[..], &other[..]]);
        let names: Vec<&[u8]> = merged.iter().map(|k| &k.key[..]).collect();
        assert_eq!(names, vec![&b"k"[..], b"j"]);
        // k: (40 + 20) / 2 s, plus 10 / 2 s from the other worker.
        assert_eq!(merged[0].rate, 35.0);
        assert_eq!(merged[0].error, 1.0);
        // s: (100 + 60) / 2 s + 40 / 2 s.
        assert_eq!(merged[0].server_rate, 100.0);
        // j: (10 + at most 5) / 2 s from the first worker, and the floor
        // 0 of the other worker's uncut list.
        assert_eq!(merged[1].rate, 7.5);
        assert_eq!(merged[1].error, 2.5);
    }

    #[test]
    fn render_lists_keys_hottest_first_and_ends() {
        let merged = merge_each(vec![window(
            1.0,
            &[(
                "cache-01",
                10,
                vec![estimate("a", 6, 0), estimate("b", 3, 1)],
            )],
        )]);
        let mut out = BytesMut::new();
        render(&mut out, &merged, 1000, 128, 1, true);
        let text = String::from_utf8(out.to_vec()).unwrap();
        assert_eq!(
            text,
            "STAT hotkeys_window_ms 1000\r\nSTAT hotkeys_counters_per_server 128\r\n\
             STAT hotkeys_sampled_one_in 1\r\n\
             STAT hotkey:1:key a\r\nSTAT hotkey:1:server cache-01\r\nSTAT hotkey:1:rate 6.0\r\n\
             STAT hotkey:1:share 0.6000\r\nSTAT hotkey:1:error 0.0\r\n\
             STAT hotkey:2:key b\r\nSTAT hotkey:2:server cache-01\r\nSTAT hotkey:2:rate 3.0\r\n\
             STAT hotkey:2:share 0.3000\r\nSTAT hotkey:2:error 1.0\r\nEND\r\n"
        );
    }

    #[test]
    fn render_without_names_prints_the_hash_metrics_use() {
        let merged = merge_each(vec![window(
            1.0,
            &[("s", 10, vec![estimate("user:alice", 6, 0)])],
        )]);
        let mut out = BytesMut::new();
        render(&mut out, &merged, 1000, 128, 1, false);
        let text = String::from_utf8(out.to_vec()).unwrap();
        let hash = merged[0].hash;
        assert!(
            text.contains(&format!("STAT hotkey:1:key xxh3:{hash:016x}\r\n")),
            "{text}"
        );
        assert!(!text.contains("alice"), "{text}");
    }

    #[test]
    fn render_prints_binary_keys_as_base64_on_one_line() {
        let injecting = b"\r\nEND\r\nSTAT injected 1\r\n";
        let estimate = Estimate {
            hash: 1,
            key: injecting[..].into(),
            count: 5,
            error: 0,
        };
        let merged = merge_each(vec![window(1.0, &[("s", 10, vec![estimate])])]);
        let mut out = BytesMut::new();
        render(&mut out, &merged, 1000, 128, 1, true);
        let text = String::from_utf8(out.to_vec()).unwrap();
        assert!(
            text.contains("STAT hotkey:1:key DQpFTkQNClNUQVQgaW5qZWN0ZWQgMQ0K b\r\n"),
            "{text}"
        );
        assert_eq!(text.matches("END").count(), 1, "{text}");
        assert!(!text.contains("injected"), "{text}");
    }

    #[test]
    fn an_episode_is_told_once_when_it_starts_and_once_when_it_ends() {
        let mut episodes = Episodes::default();
        let at = |share: f64| {
            merge_each(vec![window(
                1.0,
                &[("s", 1000, vec![estimate("hot", (share * 1000.0) as u64, 0)])],
            )])
        };
        let started = episodes.update(&at(0.5), 0.2, 100.0);
        assert!(matches!(&started[..], [Episode::Started(k)] if &k.key[..] == b"hot"));
        assert!(episodes.update(&at(0.3), 0.2, 100.0).is_empty());
        // Between half the share and the share: still the same episode.
        assert!(episodes.update(&at(0.15), 0.2, 100.0).is_empty());
        let ended = episodes.update(&at(0.05), 0.2, 100.0);
        assert!(matches!(&ended[..], [Episode::Ended { key, .. }] if &key[..] == b"hot"));
        assert!(episodes.update(&at(0.05), 0.2, 100.0).is_empty());
        // A quiet server's keys are not hot, whatever their share.
        assert!(episodes.update(&at(0.5), 0.2, 5000.0).is_empty());
    }
}
