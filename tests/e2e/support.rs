//! Helpers shared by the integration tests: start the real binary, speak plain HTTP/1.1.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    pub fn start_with_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Agent {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_gpu-warden"))
            .args(args)
            .args(["--listen", &listen])
            .current_dir(root())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBECONFIG")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpu-warden");
        let agent = Agent { child, port };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if get(port, "/readyz")
                .map(|r| r.status == 200)
                .unwrap_or(false)
            {
                return agent;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("gpu-warden did not become ready on port {port}");
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
