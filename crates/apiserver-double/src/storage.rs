//! The double's storage, as far as kube-apiserver's watch cache sees it: the cluster's
//! resourceVersion moving while storage is healthy, and a storage stall.
//!
//! In a real cluster etcd's revision is global and moves with every write anywhere (the
//! kubelets renew their node Leases every 10 s, controllers write status), and the watch
//! cache (`staging/src/k8s.io/apiserver/pkg/storage/cacher`: `Cacher`, `watchCache`) follows
//! it; the bookmarks it sends (`Cacher.dispatchEvents` → `cacheWatcher.nextBookmarkTime`)
//! carry the cache's latest resourceVersion, so on a healthy server a watch sees the
//! resourceVersion move even when no object it selects changes. The double models that with
//! a heartbeat: while storage is healthy and the server not frozen, the resourceVersion moves
//! on every [`HEARTBEAT`] (no object changes; watches wake, send nothing, and their next
//! bookmark carries it).
//!
//! When etcd stalls, the watch cache still answers from memory what needs no storage: a
//! watch from a resourceVersion it holds starts, its bookmarks keep coming — with a
//! resourceVersion that no longer moves — and it ends cleanly at its `timeoutSeconds` (the
//! cacher's `cacheWatcher` stops at the request's deadline whatever etcd does). Everything
//! that needs storage hangs: a consistent LIST (resourceVersion unset: a quorum read, or
//! since 1.31 the cache waiting for etcd's current revision), a GET, every write. That is
//! [`crate::ApiServer::set_storage_stalled`]; unlike a freeze, the clean ends and bookmarks
//! still flow, which is what a client must not mistake for proof of a current view.

use crate::state::Shared;
use std::sync::Arc;
use std::time::Duration;

/// How often the cluster's resourceVersion moves on its own while storage is healthy:
/// more often than any watch in the tests ends (a real etcd revision moves many times a
/// second in a cluster of any size).
pub const HEARTBEAT: Duration = Duration::from_millis(250);

/// Moves the resourceVersion every `every` while storage is healthy and the server not
/// frozen, until the server shuts down.
pub(crate) async fn heartbeat(shared: Arc<Shared>, every: Duration) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        let healthy = !*shared.storage_stalled.borrow() && !*shared.frozen.borrow();
        if healthy {
            shared.mutate(|s| {
                s.bump();
            });
        }
    }
}

/// Waits while storage is stalled (requests that need storage: everything but a watch).
pub(crate) async fn storage_answers(shared: &Shared) {
    let mut stalled = shared.storage_stalled.subscribe();
    let _ = stalled.wait_for(|s| !*s).await;
}
