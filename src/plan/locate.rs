//! Where one key lives now, for `/route` and `memring where`: the pool the
//! routes choose, the servers a write of the key goes to, the previous owner
//! in a hand-off window and the gutter standing in for a DEAD owner. It asks
//! the same [`place`] and [`Layout::serving_key`] the request path asks, so
//! it cannot disagree with where a request goes. Pure: no I/O; health is
//! what the backends' states say when it is called.

use std::sync::Arc;

use crate::plan::placement::{place, HealthView, KeyOp, Placement, Servers};
use crate::pools::layout::Layout;
use crate::pools::topology::Topology;

/// Where `key` lives in one pool.
#[derive(Debug)]
pub(crate) struct InPool {
    /// Index in [`Layout::pools`].
    pub(crate) pool: usize,
    pub(crate) topology: Arc<Topology>,
    /// Backend index of the owner; `None` when the pool has no server.
    pub(crate) owner: Option<usize>,
    /// Backend indexes of the replicas a write goes to now, owner first
    /// (the owner alone without `replicas`).
    pub(crate) replicas: Servers,
    /// In a hand-off window, the backend index of the previous ring's owner
    /// when it is another server.
    pub(crate) previous_owner: Option<usize>,
}

/// Where `key` lives: in the pool the routes choose and, while its owner
/// there is DEAD and the pool fails over, in the gutter pool too.
#[derive(Debug)]
pub(crate) struct Location {
    pub(crate) routed: InPool,
    pub(crate) gutter: Option<InPool>,
}

/// Where a write of `key` (its routing key) goes now for a client of the
/// main listener.
pub(crate) fn locate(layout: &Layout, key: &[u8]) -> Location {
    let routed = layout.pool_of(key);
    let serving = layout.serving_key(None, key);
    Location {
        routed: in_pool(layout, routed, key),
        gutter: (serving.pool != routed).then(|| in_pool(layout, serving.pool, key)),
    }
}

fn in_pool(layout: &Layout, pool: usize, key: &[u8]) -> InPool {
    let topology = layout.pools()[pool].topology.load_full();
    // A plain write (not a cas, not a delete): the owner and the replicas
    // now, and in a window the previous owner of a moved key.
    let placement = place(
        key,
        KeyOp::classic(false, false),
        Some(()),
        &topology,
        &HealthView::NONE,
    );
    let (replicas, moved_from) = match placement {
        Placement::NoServers => (Servers::new(), None),
        Placement::Owner { server, .. } => (smallvec::smallvec![server], None),
        Placement::Moved {
            owner, previous, ..
        } => (smallvec::smallvec![owner], Some(previous)),
        Placement::Quorum(write) => (Servers::from_slice(write.replicas()), None),
        Placement::CasThenCopy { owner, copies, .. } => {
            let mut servers: Servers = smallvec::smallvec![owner];
            servers.extend(copies);
            (servers, None)
        }
        Placement::ReadThrough {
            mut servers,
            current,
            ..
        } => {
            servers.truncate(current);
            (servers, None)
        }
    };
    let owner = replicas.first().copied();
    let previous_owner = moved_from.or_else(|| {
        // With replicas the planner writes to every replica rather than
        // moving the key: the previous ring's owner, when it differs.
        let owner = owner?;
        let mut before = Servers::new();
        topology.previous_replicas(key, &mut before);
        before.first().copied().filter(|&p| p != owner)
    });
    InPool {
        pool,
        topology,
        owner,
        replicas,
        previous_owner,
    }
}
