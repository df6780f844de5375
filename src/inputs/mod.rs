//! What memring reads from outside itself, with limits and no policy: its
//! own files (`regular_file`: the config, certificates, keys and state
//! file; regular files only, within a size cap, never blocking on a FIFO)
//! and DNS (`resolve`: host names and SRV records through
//! hickory-resolver, asked afresh every time; what one backend knows about
//! its address between lookups).
//!
//! A leaf: `config/`, `backend/`, `tls.rs`, `error.rs` and `control/` read
//! through it, so it imports nothing of memring. What a failed lookup or a
//! refused file means is decided by its caller.

pub mod regular_file;
pub mod resolve;
