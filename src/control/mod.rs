//! The control plane, on its own runtime beside the workers: everything that
//! changes what the workers route by, and the admin listener that reports on
//! it. No request passes through here.
//!
//! - `publisher`: one pool's one writer: config reloads and health ejections
//!   build its next topology here, one at a time, and publish it in one store.
//! - `pool_set`: the pools of a running process, one publisher each, and the
//!   layout (routes) they publish together.
//! - `reload`: watch the config file and SIGHUP, validate, publish;
//!   `settings`: which settings a reload changes, and which of those are read
//!   only at start.
//! - `discovery`: the periodic DNS rounds (the default pool's servers from
//!   SRV or A/AAAA records, and host names whose address changed).
//! - `etcd`: the default pool's members from etcd, watched (with
//!   `[discovery] etcd_endpoints`), cached for a start without etcd, and
//!   this sidecar's registration under `<prefix>proxies/`.
//! - `newcomers`: `flush_all` for a server joining a ring it was not in.
//! - `sweep`: before a hand-off window ends, delete from each server the
//!   keys it no longer owns.
//! - `fd_budget` and `client_slots`: the open file limit shared between
//!   memring, its backend connections and its clients, and the client limit
//!   a reload may lower.
//! - `admin`: the HTTP listener for `/metrics`, `/live`, `/ready` and
//!   `/route`; `locate` answers `/route` (and `memring where`) from the
//!   request path's own placement; `query` reads a URL's query.
//! - `member_record`: a ring member as the membership store (etcd) holds it,
//!   shared by `memring member` and the sidecars that watch it.
//!
//! Arrows point down: this room reads `pools/` (what it publishes),
//! `backend/` and `config/`; nothing on the request path imports it.

pub mod admin;
pub(crate) mod client_slots;
pub mod discovery;
pub mod etcd;
pub mod fd_budget;
mod fleet;
pub mod locate;
pub mod member_record;
mod newcomers;
pub(crate) mod pool_set;
pub(crate) mod publisher;
mod query;
pub mod reload;
pub mod settings;
mod sweep;
