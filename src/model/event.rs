//! An Event to send, before a shell dresses it as an API object: what the guard's decisions
//! and the job-peak tracker ask to tell the cluster. Plain data, so the rooms that write
//! Events (`guard::notes`, `publish::job_peaks`) and the shell that sends them
//! (`act::event_sender`) share it without importing each other.

/// `type` of an Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Nothing went wrong (dry-run announcements).
    Normal,
    /// Someone should look (an eviction, or pressure the guard could not relieve).
    Warning,
}

impl EventType {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// The object an Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Regarding {
    /// A victim pod.
    Pod {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// `metadata.uid`: `kubectl describe pod` selects Events by it.
        uid: String,
    },
    /// This agent's Node.
    Node {
        /// Node name.
        name: String,
    },
}

/// One Event to send, before it is dressed as an API object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventDraft {
    /// Namespace the Event object is created in.
    pub namespace: String,
    /// What it is about.
    pub regarding: Regarding,
    /// Normal or Warning.
    pub type_: EventType,
    /// `reason`.
    pub reason: &'static str,
    /// `action`.
    pub action: &'static str,
    /// Human-readable text, at most `guard::notes::NOTE_LIMIT` bytes (the API's limit).
    pub note: String,
}
