//! Helpers shared by the integration tests: the agent's command line ([`AgentArgs`]), start
//! the real binary, speak plain HTTP/1.1; [`guard_world`], the guard's binary on the API
//! double; [`enforcer_world`], what the enforcer tests hand the real enforcer;
//! [`pod_resources`], the agent on a fake kubelet.
#![allow(dead_code)]

pub mod enforcer_world;
pub mod guard_world;
pub mod pod_resources;
pub mod sim_signals;

use gpu_warden_testkit::wait_for;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The agent's command line in a test, built from one list of the flags every test passes:
/// the simulated backend on the A10G demo, a 200 ms poll, node `node-a`. Each test changes
/// what it needs; a flag set twice keeps its first place with the last value, so the
/// command line reads as one list. `--listen` is added by [`Agent::start`].
#[derive(Debug, Clone)]
pub struct AgentArgs {
    flags: Vec<(String, Option<String>)>,
}

impl AgentArgs {
    /// `--backend sim --scenario examples/a10g-timesliced.yaml --poll-interval 200ms
    /// --node-name node-a`.
    pub fn sim() -> AgentArgs {
        AgentArgs { flags: Vec::new() }
            .set("--backend", "sim")
            .scenario("examples/a10g-timesliced.yaml")
            .poll("200ms")
            .node("node-a")
    }

    /// Sets `flag` to `value`, in place when it is already there.
    pub fn set(mut self, flag: &str, value: impl AsRef<OsStr>) -> AgentArgs {
        let value = Some(value.as_ref().to_string_lossy().into_owned());
        match self.flags.iter_mut().find(|(f, _)| f == flag) {
            Some(slot) => slot.1 = value,
            None => self.flags.push((flag.to_string(), value)),
        }
        self
    }

    /// Sets each `(flag, value)` in turn.
    pub fn with(self, flags: &[(&str, &str)]) -> AgentArgs {
        flags.iter().fold(self, |a, (f, v)| a.set(f, v))
    }

    /// Adds a flag that takes no value (`--per-process-metrics`).
    pub fn switch(mut self, flag: &str) -> AgentArgs {
        if !self.flags.iter().any(|(f, _)| f == flag) {
            self.flags.push((flag.to_string(), None));
        }
        self
    }

    /// `--scenario`.
    pub fn scenario(self, path: impl AsRef<Path>) -> AgentArgs {
        self.set("--scenario", path.as_ref())
    }

    /// `--poll-interval`.
    pub fn poll(self, interval: &str) -> AgentArgs {
        self.set("--poll-interval", interval)
    }

    /// `--node-name`.
    pub fn node(self, name: &str) -> AgentArgs {
        self.set("--node-name", name)
    }

    /// `--kube off`: no cluster, even if the environment has one.
    pub fn kube_off(self) -> AgentArgs {
        self.set("--kube", "off")
    }

    /// `--guard-config`.
    pub fn guard_config(self, path: impl AsRef<Path>) -> AgentArgs {
        self.set("--guard-config", path.as_ref())
    }

    /// `--annotation-min-interval` and `--annotation-heartbeat`, short enough for a test.
    pub fn annotation_timing(self, min_interval: &str, heartbeat: &str) -> AgentArgs {
        self.set("--annotation-min-interval", min_interval)
            .set("--annotation-heartbeat", heartbeat)
    }

    /// The arguments, in order.
    pub fn args(&self) -> Vec<&str> {
        let mut out = Vec::with_capacity(self.flags.len() * 2);
        for (flag, value) in &self.flags {
            out.push(flag.as_str());
            if let Some(v) = value {
                out.push(v.as_str());
            }
        }
        out
    }
}

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A response: status code, headers (lower-cased names) and body.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `raw` as the whole request and reads the reply (the server closes or we read
/// Content-Length bytes).
pub fn raw_request(port: u16, raw: &[u8]) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(raw)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len = head.lines().find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
            });
            if let Some(len) = len {
                if buf.len() >= end + 4 + len {
                    break;
                }
            }
        }
    }
    parse_reply(&buf)
}

/// Sends `raw` as the whole request over TLS to 127.0.0.1:`port` (server name
/// `localhost`) with client configuration `cfg`, and reads the reply until the server closes.
pub fn tls_exchange(
    cfg: &std::sync::Arc<tokio_rustls::rustls::ClientConfig>,
    port: u16,
    raw: &str,
) -> std::io::Result<Reply> {
    use tokio_rustls::rustls;
    let name = "localhost".try_into().map_err(std::io::Error::other)?;
    let conn = rustls::ClientConnection::new(cfg.clone(), name).map_err(std::io::Error::other)?;
    let sock = TcpStream::connect(("127.0.0.1", port))?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut tls = rustls::StreamOwned::new(conn, sock);
    tls.write_all(raw.as_bytes())?;
    let mut buf = Vec::new();
    // The server closes after the reply (Connection: close); a missing close_notify is fine.
    match tls.read_to_end(&mut buf) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !buf.is_empty() => {}
        Err(e) => return Err(e),
    }
    parse_reply(&buf)
}

/// `GET path` over TLS ([`tls_exchange`]) with an optional Authorization header.
pub fn tls_get(
    cfg: &std::sync::Arc<tokio_rustls::rustls::ClientConfig>,
    port: u16,
    path: &str,
    authorization: Option<&str>,
) -> std::io::Result<Reply> {
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    tls_exchange(
        cfg,
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n"),
    )
}

/// Parses a whole HTTP/1.1 response: status line, headers, and everything after them as
/// the body.
pub fn parse_reply(buf: &[u8]) -> std::io::Result<Reply> {
    let end = find(buf, b"\r\n\r\n").ok_or_else(|| std::io::Error::other("no header end"))?;
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad status line"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&buf[end + 4..]).to_string(),
    })
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// `GET path` with `Connection: close`.
pub fn get(port: u16, path: &str) -> std::io::Result<Reply> {
    raw_request(
        port,
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
}

/// The agent binary running in the background; killed on drop.
pub struct Agent {
    pub child: Child,
    pub port: u16,
}

impl Agent {
    /// Starts `gpu-warden` with `args` plus `--listen 127.0.0.1:<free port>` and waits for
    /// `/readyz`.
    pub fn start(args: &[&str]) -> Agent {
        Agent::start_with_env(args, &[])
    }

    /// As [`Agent::start`], with extra environment variables for the child only.
    pub fn start_with_env(args: &[&str], env: &[(&str, &OsStr)]) -> Agent {
        let agent = Agent::spawn(args, env);
        let port = agent.port;
        agent.wait_ready(&format!("gpu-warden ready on port {port}"), || {
            get(port, "/readyz").is_ok_and(|r| r.status == 200)
        })
    }

    /// Starts `gpu-warden` with `args` plus `--listen 127.0.0.1:<free port>`, without
    /// waiting for it.
    pub fn spawn(args: &[&str], env: &[(&str, &OsStr)]) -> Agent {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_gpu-warden"))
            .args(args)
            .args(["--listen", &listen])
            .current_dir(root())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBECONFIG")
            // No Lease unless a test gives the namespace: the runner's own must not decide.
            .env_remove("POD_NAMESPACE")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpu-warden");
        Agent { child, port }
    }

    /// Waits up to 15 s for `ready` (a probe of the agent's readiness endpoint).
    pub fn wait_ready(self, what: &str, mut ready: impl FnMut() -> bool) -> Agent {
        wait_for(what, Duration::from_secs(15), || ready().then_some(()));
        self
    }

    /// Sends SIGTERM and waits for the exit, returning the status and how long it took.
    pub fn terminate(mut self) -> (std::process::ExitStatus, Duration, String) {
        let t0 = Instant::now();
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                panic!("agent ignored SIGTERM for 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (status, t0.elapsed(), err)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary to completion with `args`; returns (exit code, stderr).
pub fn run_to_exit(args: &[&str]) -> (Option<i32>, String) {
    run_to_exit_with_env(args, &[])
}

/// As [`run_to_exit`], with extra environment variables for the child only.
pub fn run_to_exit_with_env(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-warden"))
        .args(args)
        .current_dir(root())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .envs(env.iter().copied())
        .output()
        .expect("run gpu-warden");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}
