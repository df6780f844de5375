//! Replicated keys: with `replicas = N`, a key lives on its owner and the next
//! N-1 distinct servers clockwise (see [`crate::ring::Ring::replicas`]).
//!
//! - Writes go to every replica in parallel; the client is answered once a
//!   quorum (N/2 + 1) answered alike ([`decide`], pure).
//! - `cas` is checked on the owner only (cas ids are per server) and, when it
//!   stores, the value is copied to the other replicas with `set`.
//! - Reads go to the first healthy replica and fall through to the next on an
//!   error, a timeout or (if configured) a miss ([`read`]).

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use smallvec::SmallVec;

use crate::backend::health::HealthState;
use crate::backend::{Awaited, CallResult};
use crate::error::BackendError;
use crate::protocol::encode::{forwardable, write_sub_get};
use crate::protocol::reply::{is_error_reply, ValueBlocks};
use crate::protocol::{ReplyKind, Request};
use crate::topology::Topology;

/// Replies needed to answer a replicated write: a majority.
pub fn quorum(replicas: usize) -> usize {
    replicas / 2 + 1
}

/// What to do with a replicated write, given the replies so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not enough replies yet.
    Wait,
    /// Answer the client with this reply.
    Answer(Bytes),
    /// No quorum can be reached; the names of the servers that failed.
    Fail(Vec<Arc<str>>),
}

/// Decides a replicated write. `results[i]` is replica `i`'s reply so far
/// (`None`: still outstanding), replica 0 being the key's owner.
///
/// A reply shared by `quorum` replicas answers at once. Once every replica has
/// answered without such agreement, the owner's reply answers if at least
/// `quorum` replicas succeeded (their copies differ: see README), and the
/// write fails otherwise. It also fails as soon as too few replicas are left
/// to reach a quorum.
pub fn decide(results: &[Option<&CallResult>], quorum: usize) -> Decision {
    let success = |r: &CallResult| matches!(r, Ok(reply) if !is_error_reply(reply));
    let mut succeeded = 0;
    let mut outstanding = 0;
    for result in results {
        match result {
            None => outstanding += 1,
            Some(r) if success(r) => {
                succeeded += 1;
                let reply = r.as_ref().expect("success is Ok");
                let alike = results
                    .iter()
                    .filter(|other| matches!(other, Some(Ok(o)) if o == reply))
                    .count();
                if alike >= quorum {
                    return Decision::Answer(reply.clone());
                }
            }
            Some(_) => {}
        }
    }
    if succeeded + outstanding < quorum {
        return Decision::Fail(failed_servers(results));
    }
    if outstanding > 0 {
        return Decision::Wait;
    }
    // Everyone answered, a quorum succeeded, but the replies differ.
    let owner_first = results
        .iter()
        .flatten()
        .find(|r| success(r))
        .and_then(|r| r.as_ref().ok());
    match owner_first {
        Some(reply) => Decision::Answer(reply.clone()),
        None => Decision::Fail(failed_servers(results)),
    }
}

fn failed_servers(results: &[Option<&CallResult>]) -> Vec<Arc<str>> {
    results
        .iter()
        .filter_map(|r| match r {
            Some(Err(BackendError { server, .. })) => Some(server.clone()),
            _ => None,
        })
        .collect()
}

/// Backend indexes of `key`'s replicas, owner first.
pub fn replica_set(topology: &Topology, key: &[u8]) -> SmallVec<[usize; 4]> {
    let mut set = SmallVec::new();
    topology.replicas(key, &mut set);
    set
}

/// Orders replicas for reading: healthy ones first, ring order otherwise.
fn read_order(topology: &Topology, key: &[u8]) -> SmallVec<[usize; 4]> {
    let mut set = replica_set(topology, key);
    set.sort_by_key(|&i| topology.backends[i].state() == HealthState::Dead);
    set
}

type Sent = Result<Awaited, BackendError>;

/// A replicated retrieval in progress. Each key is asked of its first healthy
/// replica, one sub-request per server; keys whose server failed (or missed,
/// with `miss_fallthrough`) are asked of their next replica, round after round.
pub struct Read {
    topology: Arc<Topology>,
    request: Request,
    bytes: Bytes,
    lane: usize,
    miss_fallthrough: bool,
    /// Per key, its replicas in the order they are asked.
    order: Vec<SmallVec<[usize; 4]>>,
    first_round: Vec<(Vec<usize>, Sent)>,
}

impl Read {
    /// Sends the first round at once, from the session, so that a client's
    /// commands reach each server in the order the client sent them.
    pub async fn start(
        topology: Arc<Topology>,
        request: Request,
        bytes: Bytes,
        lane: usize,
        miss_fallthrough: bool,
    ) -> Read {
        let order = (0..request.keys.len())
            .map(|i| read_order(&topology, request.key(&bytes, i)))
            .collect();
        let mut read = Read {
            topology,
            request,
            bytes,
            lane,
            miss_fallthrough,
            order,
            first_round: Vec::new(),
        };
        let all: Vec<usize> = (0..read.request.keys.len()).collect();
        read.first_round = read.send_round(0, &all).await;
        read
    }

    async fn send_round(&self, round: usize, open: &[usize]) -> Vec<(Vec<usize>, Sent)> {
        let mut groups: SmallVec<[(usize, Vec<usize>); 4]> = SmallVec::new();
        for &key in open {
            let Some(&server) = self.order[key].get(round) else {
                continue;
            };
            match groups.iter_mut().find(|(s, _)| *s == server) {
                Some((_, members)) => members.push(key),
                None => groups.push((server, vec![key])),
            }
        }
        let exptime = self.request.arg.map(|span| span.of(&self.bytes));
        let mut sent = Vec::with_capacity(groups.len());
        for (server, members) in groups {
            let mut sub = BytesMut::new();
            write_sub_get(
                &mut sub,
                self.request.command,
                exptime,
                members.iter().map(|&k| self.request.key(&self.bytes, k)),
            );
            let outcome = self.topology.backends[server]
                .start_call(
                    self.lane,
                    smallvec::smallvec![sub.freeze()],
                    ReplyKind::Values,
                )
                .await;
            sent.push((members, outcome));
        }
        sent
    }

    /// Awaits the rounds and returns the whole reply in the client's key order,
    /// or the first error if no server answered at all.
    pub async fn finish(mut self) -> CallResult {
        let keys = self.request.keys.len();
        let mut found: Vec<Option<(Bytes, std::ops::Range<usize>)>> = vec![None; keys];
        let mut first_error = None;
        let mut any_answer = false;
        let rounds = self.order.iter().map(SmallVec::len).max().unwrap_or(0);
        let mut sent = std::mem::take(&mut self.first_round);
        for round in 0..rounds {
            let mut open = Vec::new();
            for (members, outcome) in sent {
                let result = match outcome {
                    Ok(call) => call.reply().await,
                    Err(error) => Err(error),
                };
                match result {
                    Ok(reply) if !is_error_reply(&reply) => {
                        any_answer = true;
                        let mut blocks = ValueBlocks::new(&reply).peekable();
                        for key in members {
                            let name = self.request.key(&self.bytes, key);
                            match blocks.next_if(|b| &reply[b.key.clone()] == name) {
                                Some(block) => found[key] = Some((reply.clone(), block.block)),
                                None if self.miss_fallthrough => open.push(key),
                                None => {}
                            }
                        }
                    }
                    Ok(_) => open.extend(members),
                    Err(error) => {
                        first_error.get_or_insert(error);
                        open.extend(members);
                    }
                }
            }
            if open.is_empty() || round + 1 == rounds {
                break;
            }
            open.sort_unstable();
            sent = self.send_round(round + 1, &open).await;
        }
        if !any_answer {
            if let Some(error) = first_error {
                return Err(error);
            }
        }
        let mut out = BytesMut::new();
        for (reply, block) in found.iter().flatten() {
            out.put_slice(&reply[block.clone()]);
        }
        out.put_slice(b"END\r\n");
        Ok(out.freeze())
    }
}

/// A replicated `cas` in progress: checked on the owner, whose cas ids the
/// client holds; when it stores, the new value is copied to the other
/// replicas with `set`.
pub struct Cas {
    topology: Arc<Topology>,
    request: Request,
    bytes: Bytes,
    lane: usize,
    /// `None` when there is no server at all.
    owner_reply: Option<Sent>,
}

impl Cas {
    /// Sends the `cas` to the owner at once, from the session.
    pub async fn start(
        topology: Arc<Topology>,
        request: Request,
        bytes: Bytes,
        lane: usize,
    ) -> Cas {
        let owner_reply = match replica_set(&topology, request.key(&bytes, 0)).first() {
            Some(&owner) => Some(
                topology.backends[owner]
                    .start_call(lane, forwardable(&bytes, &request), ReplyKind::Line)
                    .await,
            ),
            None => None,
        };
        Cas {
            topology,
            request,
            bytes,
            lane,
            owner_reply,
        }
    }

    /// Awaits the owner and, if it stored, copies the value to the others.
    pub async fn finish(self) -> CallResult {
        let reply = match self.owner_reply {
            Some(Ok(call)) => call.reply().await?,
            Some(Err(error)) => return Err(error),
            None => {
                return Ok(Bytes::from_static(
                    b"SERVER_ERROR no servers configured\r\n",
                ))
            }
        };
        if reply.as_ref() == b"STORED\r\n" {
            let copy = cas_as_set(&self.request, &self.bytes);
            let replicas = replica_set(&self.topology, self.request.key(&self.bytes, 0));
            for &replica in replicas.iter().skip(1) {
                // The client has its answer from the owner; a replica that fails
                // here is counted by its backend and catches up on a later write.
                let _ = self.topology.backends[replica]
                    .send(self.lane, copy.clone(), ReplyKind::Line, false)
                    .await;
            }
        }
        Ok(reply)
    }
}

/// `cas <key> <flags> <exptime> <bytes> <unique> [noreply]` + data, rewritten as
/// `set <key> <flags> <exptime> <bytes>` + the same data.
fn cas_as_set(request: &Request, bytes: &Bytes) -> crate::protocol::encode::Outbound {
    let line = &bytes[..request.args_end as usize];
    let fields: SmallVec<[&[u8]; 8]> = line
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .collect();
    let mut head = BytesMut::with_capacity(line.len());
    head.put_slice(b"set");
    for field in fields.iter().skip(1).take(4) {
        head.put_u8(b' ');
        head.put_slice(field);
    }
    head.put_slice(b"\r\n");
    smallvec::smallvec![head.freeze(), bytes.slice(request.line_len as usize..)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BackendErrorKind;
    use crate::protocol::{parse_request, Limits};

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(Bytes::from_static(reply))
    }

    fn failed(server: &str) -> CallResult {
        Err(BackendError {
            server: server.into(),
            kind: BackendErrorKind::Timeout,
        })
    }

    #[test]
    fn quorum_is_a_majority() {
        assert_eq!((quorum(1), quorum(2), quorum(3), quorum(5)), (1, 2, 2, 3));
    }

    #[test]
    fn two_alike_of_three_answer_without_waiting_for_the_third() {
        let stored = ok(b"STORED\r\n");
        assert_eq!(
            decide(&[Some(&stored), None, Some(&stored)], 2),
            Decision::Answer(Bytes::from_static(b"STORED\r\n"))
        );
        assert_eq!(decide(&[Some(&stored), None, None], 2), Decision::Wait);
    }

    #[test]
    fn two_failures_of_three_fail_at_once_naming_them() {
        let (a, b) = (failed("a"), failed("b"));
        assert_eq!(
            decide(&[Some(&a), None, Some(&b)], 2),
            Decision::Fail(vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn disagreeing_replies_answer_the_owners_once_all_are_in() {
        let (stored, not_stored) = (ok(b"STORED\r\n"), ok(b"NOT_STORED\r\n"));
        assert_eq!(
            decide(&[Some(&not_stored), Some(&stored), None], 2),
            Decision::Wait
        );
        let error = failed("c");
        assert_eq!(
            decide(&[Some(&not_stored), Some(&stored), Some(&error)], 2),
            Decision::Answer(Bytes::from_static(b"NOT_STORED\r\n"))
        );
    }

    #[test]
    fn server_error_replies_do_not_count_toward_a_quorum() {
        let (stored, error) = (ok(b"STORED\r\n"), ok(b"SERVER_ERROR out of memory\r\n"));
        assert_eq!(
            decide(&[Some(&error), Some(&error), Some(&stored)], 2),
            Decision::Fail(vec![])
        );
    }

    #[test]
    fn cas_is_copied_to_replicas_as_a_plain_set() {
        let bytes = Bytes::from_static(b"cas k 5 10 3 99 noreply\r\nabc\r\n");
        let (request, _) = parse_request(&bytes, &Limits::default()).unwrap().unwrap();
        let copy: Vec<u8> = cas_as_set(&request, &bytes).concat();
        assert_eq!(copy, b"set k 5 10 3\r\nabc\r\n");
    }
}
