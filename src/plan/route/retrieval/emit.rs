//! The client's reply from a retrieval: its values in the client's key
//! order as they become writable, then the `END` (or the error when no
//! server answered), or an `mg`'s reply as it came. Pure: it writes into
//! the caller's [`ReplyWriter`].

use super::*;

impl Retrieval {
    /// Writes every value that can go to the client now, in key order; once
    /// every key is settled, the closing `END` (or, when no server answered
    /// at all, the error). Returns true when the reply is complete.
    pub(crate) fn emit(&mut self, out: &mut impl ReplyWriter) -> bool {
        if !self.emit_values(out) {
            return false;
        }
        if self.meta.is_some() {
            self.emit_meta(out);
            return true;
        }
        self.said = if self.values_written > 0 {
            Outcome::Value
        } else {
            Outcome::End
        };
        match self.split {
            Split::Part => return true,
            Split::Last => {
                out.text().extend_from_slice(b"END\r\n");
                return true;
            }
            Split::Whole => {}
        }
        if self.values_written == 0 && !self.answered {
            // A multi-get answers with what the healthy servers hold; only
            // when no server answered is the whole reply an error.
            if let Some(error) = &self.first_error {
                crate::protocol::encode::write_server_error(out.text(), error);
                self.said = Outcome::ServerError;
                return true;
            }
            if let [only] = &self.subs[..] {
                if let Some(line) = &only.error_line {
                    // One server's own error, as memcached gave it.
                    out.piece(line.bytes.clone());
                    self.said = line.outcome;
                    return true;
                }
            }
        }
        out.text().extend_from_slice(b"END\r\n");
        true
    }

    /// An `mg`'s answer: the server's reply as it came (nothing for a quiet
    /// one that said nothing), or the error memring says for the server.
    fn emit_meta(&mut self, out: &mut impl ReplyWriter) {
        let Some(meta) = &self.meta else {
            return;
        };
        self.held = 0;
        self.said = match (&meta.reply, &self.first_error) {
            (Some(reply), _) => {
                if !reply.is_empty() {
                    out.piece(reply.bytes.clone());
                }
                reply.outcome
            }
            (None, Some(error)) => {
                crate::protocol::encode::write_server_error(out.text(), error);
                Outcome::ServerError
            }
            // No server to ask (the planner places an `mg` on one).
            (None, None) => {
                out.text().extend_from_slice(NO_SERVERS);
                Outcome::ServerError
            }
        };
    }

    /// Writes every value that can go to the client now, in key order, and
    /// never the end of the reply; true once every key is settled.
    pub(crate) fn emit_values(&mut self, out: &mut impl ReplyWriter) -> bool {
        while self.next_emit < self.keys.len() {
            match std::mem::replace(&mut self.state[self.next_emit], KeyState::Missed) {
                KeyState::Found(block) => {
                    self.held -= block.len();
                    self.values_written += 1;
                    if let Some(answers) = &mut self.answers {
                        answers.push((self.next_emit as u32, Some(block.clone())));
                    }
                    out.piece(block);
                }
                KeyState::Missed => {
                    if let Some(answers) = &mut self.answers {
                        answers.push((self.next_emit as u32, None));
                    }
                }
                waiting => {
                    self.state[self.next_emit] = waiting;
                    return false;
                }
            }
            self.next_emit += 1;
        }
        true
    }

    /// What the reply [`Retrieval::emit`] finished says: a hit if it held a
    /// value, else `END`, or the error it answered with.
    pub(crate) fn said(&self) -> Outcome {
        self.said
    }

    /// Keys to count as hits or misses, and values written: none for a
    /// reply that was an error (no server answered), whose client was told
    /// of the error, not of a miss (`get_misses` tells how well the cache
    /// serves; a server busy or down is in `errors` and `rejected_busy`).
    pub(crate) fn counts(&self) -> (usize, usize) {
        if self.said.is_error() {
            return (0, 0);
        }
        (self.keys.len(), self.values_written)
    }
}
