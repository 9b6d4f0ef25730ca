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
use crate::model::replicas::{AllocatableError, PodResourcesError};
use hyper_util::rt::TokioIo;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

/// Where the kubelet serves the API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The largest answer accepted, in bytes (docs/attribution.md, "Message size"): a `List` of
/// 5,000 pods is far below it, and decoding one this large fits the agent's memory limit.
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// Classifies an error of connecting to the socket path; None: a socket that does not
/// answer (yet), which later polls retry.
fn connect_error(path: &Path, e: &io::Error) -> Option<PodResourcesError> {
    match e.kind() {
        io::ErrorKind::NotFound => Some(PodResourcesError::Absent { path: path.into() }),
        io::ErrorKind::PermissionDenied => Some(PodResourcesError::Denied { path: path.into() }),
        // connect(2) on a path that is not a socket is refused like a dead socket.
        _ => not_a_socket(path),
    }
}

/// What is at `path` when it is not a socket.
fn not_a_socket(path: &Path) -> Option<PodResourcesError> {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::metadata(path).ok()?.file_type();
    let what = if t.is_socket() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else {
        "a special file"
    };
    Some(PodResourcesError::NotASocket {
        path: path.into(),
        what,
    })
}

/// The answers of one poll: `List` answered; `GetAllocatableResources` is judged apart.
#[derive(Debug, Clone, PartialEq)]
pub struct PodResourcesReply {
    /// `List`: the devices each pod's containers hold.
    pub list: ListPodResourcesResponse,
    /// `GetAllocatableResources`: every device the kubelet can hand out.
    pub allocatable: Result<AllocatableResourcesResponse, AllocatableError>,
}

/// A client of `v1.PodResourcesLister` over the kubelet's unix socket.
#[derive(Debug, Clone)]
pub struct PodResourcesClient {
    client: PodResourcesListerClient<Channel>,
    dials: Arc<AtomicU64>,
    /// `GetAllocatableResources` found unavailable, and the dial count then: it is not asked
    /// again on the same connection (the kubelet counts every refused call as an error).
    allocatable_unavailable: Option<(String, u64)>,
}

impl PodResourcesClient {
    /// Checks once that the socket can be connected to (absent, permission denied or not a
    /// socket → the error that switches the feature off, for the caller's one log line),
    /// then opens the one channel all polls use. `timeout` bounds each dial and each call;
    /// an answer larger than `max_message` bytes is refused. A socket that exists but
    /// refuses (a kubelet that is down) is not an error here: the channel dials again at the
    /// next poll.
    pub async fn connect(
        path: impl Into<PathBuf>,
        timeout: Duration,
        max_message: usize,
    ) -> Result<Self, PodResourcesError> {
        let path: PathBuf = path.into();
        if let Err(e) = tokio::net::UnixStream::connect(&path).await {
            if let Some(err) = connect_error(&path, &e) {
                return Err(err);
            }
            tracing::warn!(socket = %path.display(), error = %e, "kubelet pod-resources: the socket refuses connections (no kubelet listening on it yet); trying again every interval");
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
        let client = PodResourcesListerClient::new(channel).max_decoding_message_size(max_message);
        Ok(PodResourcesClient {
            client,
            dials,
            allocatable_unavailable: None,
        })
    }

    /// How many times the socket has been dialled (the first poll's dial, then one per lost
    /// connection): polls never dial on their own.
    pub fn dials(&self) -> u64 {
        self.dials.load(Ordering::Relaxed)
    }

    /// `List`, then `GetAllocatableResources` unless this connection already said it does
    /// not serve it. Err only when `List` failed.
    pub async fn poll(&mut self) -> Result<PodResourcesReply, PodResourcesError> {
        let list = self
            .client
            .list(ListPodResourcesRequest {})
            .await
            .map_err(|s| call_error("List", &s))?
            .into_inner();
        let dials = self.dials();
        if let Some((why, at)) = &self.allocatable_unavailable {
            if *at == dials {
                return Ok(PodResourcesReply {
                    list,
                    allocatable: Err(AllocatableError::Unavailable(why.clone())),
                });
            }
        }
        let allocatable = match self
            .client
            .get_allocatable_resources(AllocatableResourcesRequest {})
            .await
        {
            Ok(a) => {
                self.allocatable_unavailable = None;
                Ok(a.into_inner())
            }
            Err(s) => match unserved(&s) {
                Some(why) => {
                    self.allocatable_unavailable = Some((why.clone(), self.dials()));
                    Err(AllocatableError::Unavailable(why))
                }
                None => Err(AllocatableError::Failed(call_error(
                    "GetAllocatableResources",
                    &s,
                ))),
            },
        };
        Ok(PodResourcesReply { list, allocatable })
    }
}

/// Whether a failed `GetAllocatableResources` means the kubelet does not serve it: grpc-go
/// answers `Unimplemented` for a method its server does not have (1.20), and the 1.21–1.22
/// kubelet's handler returns a plain Go error, which grpc-go sends as `Unknown`, when the
/// `KubeletPodResourcesGetAllocatable` gate is off (pkg/kubelet/apis/podresources/server_v1.go).
fn unserved(status: &tonic::Status) -> Option<String> {
    match status.code() {
        tonic::Code::Unimplemented => Some(format!(
            "Unimplemented: {}; a kubelet before 1.21",
            status.message()
        )),
        tonic::Code::Unknown if status.message().contains("GetAllocatableResources disabled") => {
            Some(format!(
                "Unknown: {}; a 1.21–1.22 kubelet with the KubeletPodResourcesGetAllocatable feature gate off",
                status.message()
            ))
        }
        _ => None,
    }
}

fn call_error(call: &'static str, status: &tonic::Status) -> PodResourcesError {
    let hint = match status.code() {
        tonic::Code::Unimplemented if call == "List" => {
            "; this kubelet serves no pod-resources v1 API (Kubernetes before 1.20)"
        }
        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
            if status.message().contains("too large") =>
        {
            "; the answer is larger than the agent accepts (docs/attribution.md, \"Message size\")"
        }
        _ => "",
    };
    PodResourcesError::Call {
        call,
        message: format!("{:?}: {}{hint}", status.code(), status.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn absent_socket_disables_the_feature() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.sock");
        let err = PodResourcesClient::connect(&path, Duration::from_secs(1), MAX_MESSAGE)
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

    /// A `hostPath` mount of the socket file made while the socket was missing leaves a
    /// directory at the path; connecting to it is refused like a dead socket.
    #[tokio::test]
    async fn a_directory_at_the_socket_path_is_said_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.sock");
        std::fs::create_dir(&path).unwrap();
        let err = PodResourcesClient::connect(&path, Duration::from_secs(1), MAX_MESSAGE)
            .await
            .unwrap_err();
        assert!(err.disables());
        let msg = err.to_string();
        assert!(
            msg.contains("a directory, not a socket") && msg.contains("mount the directory"),
            "{msg}"
        );
        let file = dir.path().join("file.sock");
        std::fs::write(&file, "").unwrap();
        let err = PodResourcesClient::connect(&file, Duration::from_secs(1), MAX_MESSAGE)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{}: a regular file, not a socket", file.display())
        );
    }

    #[test]
    fn unserved_get_allocatable_resources() {
        use tonic::{Code, Status};
        // grpc-go's answer for a method its server lacks (a 1.20 kubelet).
        let old = Status::new(
            Code::Unimplemented,
            "unknown method GetAllocatableResources for service v1.PodResourcesLister",
        );
        assert!(unserved(&old).unwrap().contains("before 1.21"));
        // The 1.21-1.22 kubelet with the gate off: a plain Go error, sent as Unknown.
        let gated = Status::new(
            Code::Unknown,
            "Pod Resources API GetAllocatableResources disabled",
        );
        assert!(unserved(&gated).unwrap().contains("feature gate off"));
        assert_eq!(unserved(&Status::new(Code::Unknown, "boom")), None);
        assert_eq!(unserved(&Status::new(Code::Unavailable, "x")), None);
        let too_big = Status::new(
            Code::OutOfRange,
            "Error, decoded message length too large: found 5000000 bytes, the limit is: 4194304 bytes",
        );
        assert!(call_error("List", &too_big)
            .to_string()
            .contains("larger than the agent accepts"));
        let v1_missing = Status::new(Code::Unimplemented, "unknown service v1.PodResourcesLister");
        assert!(call_error("List", &v1_missing)
            .to_string()
            .contains("before 1.20"));
    }
}
