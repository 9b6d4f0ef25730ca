//! The shell that talks to the kubelet's pod-resources socket.
//!
//! One gRPC channel for the agent's lifetime: the channel's connector dials the socket
//! *path* (never an open file descriptor) and is called again only when the connection is
//! gone, so polls share one connection, and a kubelet restart, which deletes and recreates
//! the socket, costs one failed poll and one new dial. That is why the DaemonSet mounts the
//! socket's directory, not the socket: a file bind mount would keep pointing at the deleted
//! socket.

use super::generated::pod_resources_lister_client::PodResourcesListerClient;
use super::generated::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse,
};
use hyper_util::rt::TokioIo;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

/// Where the kubelet serves the API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The kubelet answers with every pod on the node; leave room above tonic's 4 MiB default.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// Why the kubelet's pod-resources data could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodResourcesError {
    /// No socket: not a kubelet node, or the directory is not mounted. The feature is off.
    #[error("{}: no kubelet pod-resources socket (mount the host's /var/lib/kubelet/pod-resources read-only)", path.display())]
    Absent {
        /// The socket path tried.
        path: PathBuf,
    },
    /// The socket exists but this process may not connect (the kubelet's socket is root's).
    /// The feature is off.
    #[error("{}: permission denied on the kubelet pod-resources socket (the agent must run as a user that may connect to it)", path.display())]
    Denied {
        /// The socket path tried.
        path: PathBuf,
    },
    /// A call failed: the kubelet is restarting, refused it, or did not answer in time.
    #[error("pod-resources {call}: {message}")]
    Call {
        /// `List` or `GetAllocatableResources`.
        call: &'static str,
        /// The gRPC status or transport error.
        message: String,
    },
}

impl PodResourcesError {
    /// Whether the feature should be switched off (as opposed to a poll that may succeed later).
    pub fn disables(&self) -> bool {
        matches!(self, Self::Absent { .. } | Self::Denied { .. })
    }
}

/// Classifies an error of connecting to the socket path.
fn connect_error(path: &Path, e: &io::Error) -> Option<PodResourcesError> {
    match e.kind() {
        io::ErrorKind::NotFound => Some(PodResourcesError::Absent { path: path.into() }),
        io::ErrorKind::PermissionDenied => Some(PodResourcesError::Denied { path: path.into() }),
        _ => None,
    }
}

/// Both answers of one poll.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodResourcesReply {
    /// `List`: the devices each pod's containers hold.
    pub list: ListPodResourcesResponse,
    /// `GetAllocatableResources`: every device the kubelet can hand out.
    pub allocatable: AllocatableResourcesResponse,
}

/// A client of `v1.PodResourcesLister` over the kubelet's unix socket.
#[derive(Debug, Clone)]
pub struct PodResourcesClient {
    client: PodResourcesListerClient<Channel>,
    dials: Arc<AtomicU64>,
}

impl PodResourcesClient {
    /// Checks once that the socket can be connected to (absent or permission denied → the
    /// error that switches the feature off, for the caller's one log line), then opens the one
    /// channel all polls use. `timeout` bounds each dial and each call. A socket that exists
    /// but refuses (a kubelet that is down) is not an error here: the channel dials again at
    /// the next poll.
    pub async fn connect(
        path: impl Into<PathBuf>,
        timeout: Duration,
    ) -> Result<Self, PodResourcesError> {
        let path: PathBuf = path.into();
        if let Err(e) = tokio::net::UnixStream::connect(&path).await {
            if let Some(err) = connect_error(&path, &e) {
                return Err(err);
            }
            tracing::warn!(socket = %path.display(), error = %e, "kubelet pod-resources socket does not answer yet; will retry at each poll");
        }
        let dials = Arc::new(AtomicU64::new(0));
        let connector = {
            let path = path.clone();
            let dials = dials.clone();
            tower::service_fn(move |_: Uri| {
                let path = path.clone();
                dials.fetch_add(1, Ordering::Relaxed);
                async move {
                    let stream = tokio::net::UnixStream::connect(&path).await?;
                    Ok::<_, io::Error>(TokioIo::new(stream))
                }
            })
        };
        // The URI is required by the API but unused: the connector ignores it.
        let channel = Endpoint::from_static("http://kubelet.sock")
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect_with_connector_lazy(connector);
        let client = PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
        Ok(PodResourcesClient { client, dials })
    }

    /// How many times the socket has been dialled (the first poll's dial, then one per lost
    /// connection): polls never dial on their own.
    pub fn dials(&self) -> u64 {
        self.dials.load(Ordering::Relaxed)
    }

    /// `List` then `GetAllocatableResources`.
    pub async fn poll(&mut self) -> Result<PodResourcesReply, PodResourcesError> {
        let list = self
            .client
            .list(ListPodResourcesRequest {})
            .await
            .map_err(|s| call_error("List", &s))?
            .into_inner();
        let allocatable = self
            .client
            .get_allocatable_resources(AllocatableResourcesRequest {})
            .await
            .map_err(|s| call_error("GetAllocatableResources", &s))?
            .into_inner();
        Ok(PodResourcesReply { list, allocatable })
    }
}

fn call_error(call: &'static str, status: &tonic::Status) -> PodResourcesError {
    PodResourcesError::Call {
        call,
        message: format!("{:?}: {}", status.code(), status.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn absent_socket_disables_the_feature() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.sock");
        let err = PodResourcesClient::connect(&path, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err, PodResourcesError::Absent { path: path.clone() });
        assert!(err.disables());
        assert!(err
            .to_string()
            .contains("mount the host's /var/lib/kubelet/pod-resources"));
    }

    #[test]
    fn permission_denied_disables_the_feature() {
        let path = Path::new("/x/kubelet.sock");
        let e = io::Error::from(io::ErrorKind::PermissionDenied);
        let err = connect_error(path, &e).unwrap();
        assert!(err.disables(), "{err}");
        assert!(connect_error(path, &io::Error::from(io::ErrorKind::ConnectionRefused)).is_none());
        let call = PodResourcesError::Call {
            call: "List",
            message: "Unavailable".into(),
        };
        assert!(!call.disables());
    }
}
