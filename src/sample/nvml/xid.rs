//! XID errors: an NVML event set waited on by a thread of its own (`nvmlEventSetWait`
//! blocks), publishing the last XID per GPU for the polls to read.

use super::*;

/// How long one `nvmlEventSetWait` blocks. An XID is delivered the moment it happens
/// whatever the timeout; the timeout only bounds how late the thread sees the stop flag,
/// and every expiry is a wake-up (two a second at 500 ms, measured 0.07–0.10 ms/s of CPU on
/// an H200). Nothing waits for the thread to stop (see `NvmlSource`'s `Drop`).
pub(super) const XID_WAIT_MS: u32 = 5_000;

pub(super) fn spawn_xid_watcher(
    nvml: &'static Nvml,
    devices: &[DeviceState],
    xids: Arc<Mutex<HashMap<u32, u64>>>,
    stop: Arc<AtomicBool>,
) -> Option<JoinHandle<()>> {
    use nvml_wrapper::bitmasks::event::EventTypes;
    let mut set = match nvml.create_event_set() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot create an NVML event set; DCGM_FI_DEV_XID_ERRORS will be absent");
            return None;
        }
    };
    let mut registered = Vec::new();
    for d in devices {
        let supported = d
            .device
            .supported_event_types()
            .map(|t| t.contains(EventTypes::CRITICAL_XID_ERROR))
            .unwrap_or(false);
        if !supported {
            continue;
        }
        set = match d
            .device
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        {
            Ok(s) => {
                registered.push(d.id.index);
                s
            }
            Err(e) => {
                tracing::warn!(gpu = d.id.index, error = %e.error, "cannot watch XID errors");
                // nvml-wrapper frees the set on failure; start a fresh one for the rest.
                match nvml.create_event_set() {
                    Ok(s) => s,
                    Err(_) => return None,
                }
            }
        };
    }
    if registered.is_empty() {
        return None;
    }
    // A watched GPU reports 0 until its first XID, as dcgm-exporter does.
    {
        let mut map = xids.lock().unwrap_or_else(|e| e.into_inner());
        for index in &registered {
            map.entry(*index).or_insert(0);
        }
    }
    let index_by_uuid: HashMap<String, u32> = devices
        .iter()
        .map(|d| (d.id.uuid.clone(), d.id.index))
        .collect();
    std::thread::Builder::new()
        .name("nvml-xid".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match set.wait(XID_WAIT_MS) {
                    Ok(ev) => {
                        let value = match ev.event_data {
                            Some(XidError::Value(v)) => v,
                            _ => continue,
                        };
                        let Some(index) = ev
                            .device
                            .uuid()
                            .ok()
                            .and_then(|u| index_by_uuid.get(&u).copied())
                        else {
                            continue;
                        };
                        tracing::warn!(gpu = index, xid = value, "XID error");
                        xids.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(index, value);
                    }
                    Err(NvmlError::Timeout) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "XID event wait failed; retrying in 1 s");
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        })
        .ok()
}
