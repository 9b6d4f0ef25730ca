//! A compiled HTTP/1.1 load client for gpu-warden's `/metrics` (issue 7): N client threads,
//! each with one keep-alive connection, all started together, each sending M requests and
//! timing every one of them.
//!
//! Why not Python: 64 Python threads share one interpreter lock, so a Python harness with
//! 64 concurrent scrapers measures how long a thread waits for the GIL (and for
//! `http.client` to parse headers), not how long the server takes to answer. On the H200
//! the Python harness reported 9.8 / 42 ms p50 / p99 at 64 clients against a server that
//! answers one client in 0.12 ms. Here each client is an OS thread doing plain blocking
//! socket I/O, so the latency is the server's plus the loopback's.
//!
//! ```text
//! cargo build --release --example scrape_load
//! target/release/examples/scrape_load --addr 127.0.0.1:9400 --path /metrics \
//!     --clients 64 --requests-per-client 50
//! ```
//!
//! Prints one JSON line: `clients`, `requests`, `errors`, `p50_ms`, `p90_ms`, `p99_ms`,
//! `max_ms`, `mean_ms`, `bytes_per_response` (mean body size of the good responses), plus
//! `ok`, `reconnects`, `wall_s`, `requests_per_s` and `first_error`. Latency percentiles are
//! over the good responses (status 200, complete body); a request that meets a closed
//! keep-alive connection reconnects once and its time includes the reconnect.
//!
//! Options: `--timeout-ms T` (per read/write, default 5000), `--warmup K` (requests per
//! client before the start barrier, not counted; default 1, which also opens the connection).

// Measures or waits on real elapsed time.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line settings.
struct Args {
    addr: SocketAddr,
    path: String,
    clients: usize,
    requests: usize,
    timeout: Duration,
    warmup: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut addr = "127.0.0.1:9400".to_string();
    let mut path = "/metrics".to_string();
    let mut clients = 1usize;
    let mut requests = 100usize;
    let mut timeout_ms = 5000u64;
    let mut warmup = 1usize;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Err(
                "usage: scrape_load [--addr HOST:PORT] [--path /metrics] [--clients N] \
                 [--requests-per-client M] [--timeout-ms T] [--warmup K]"
                    .into(),
            );
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |what: &str| format!("{flag}: {what}, got {value:?}");
        match flag.as_str() {
            "--addr" => addr = value.clone(),
            "--path" => {
                if !value.starts_with('/') || value.contains(['\r', '\n', ' ']) {
                    return Err(bad("a path starting with / and without spaces"));
                }
                path = value.clone();
            }
            "--clients" => {
                clients = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=4096).contains(n))
                    .ok_or_else(|| bad("a number 1..4096"))?;
            }
            "--requests-per-client" => {
                requests = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=10_000_000).contains(n))
                    .ok_or_else(|| bad("a number 1..10000000"))?;
            }
            "--timeout-ms" => {
                timeout_ms = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| bad("a number of milliseconds >= 1"))?;
            }
            "--warmup" => {
                warmup = value.parse().map_err(|_| bad("a number >= 0"))?;
            }
            _ => return Err(format!("unknown flag {flag}; try --help")),
        }
    }
    let addr = addr
        .to_socket_addrs()
        .map_err(|e| format!("--addr {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("--addr {addr}: no address"))?;
    Ok(Args {
        addr,
        path,
        clients,
        requests,
        timeout: Duration::from_millis(timeout_ms),
        warmup,
    })
}

/// One client's keep-alive connection, reopened when the server closes it.
struct Conn {
    addr: SocketAddr,
    timeout: Duration,
    request: Vec<u8>,
    stream: Option<BufReader<TcpStream>>,
    reconnects: u64,
}

impl Conn {
    fn open(&mut self) -> Result<&mut BufReader<TcpStream>, BoxError> {
        if self.stream.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, self.timeout)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(self.timeout))?;
            s.set_write_timeout(Some(self.timeout))?;
            self.stream = Some(BufReader::with_capacity(64 * 1024, s));
        }
        self.stream
            .as_mut()
            .ok_or_else(|| "connection missing right after opening it".into())
    }

    /// One request and its full response: the body size. A connection the server closed
    /// between requests (keep-alive timeout, connection lifetime) is reopened once.
    fn get(&mut self) -> Result<usize, BoxError> {
        let reused = self.stream.is_some();
        match self.exchange() {
            Ok(n) => Ok(n),
            Err(e) => {
                self.stream = None;
                if reused && e.stale {
                    self.reconnects += 1;
                    self.exchange().map_err(|e| {
                        self.stream = None;
                        e.error
                    })
                } else {
                    Err(e.error)
                }
            }
        }
    }

    fn exchange(&mut self) -> Result<usize, ExchangeError> {
        let request = self.request.clone();
        let stream = self.open().map_err(ExchangeError::fatal)?;
        stream
            .get_mut()
            .write_all(&request)
            .map_err(|e| ExchangeError::stale(e.into()))?;
        let response = read_response(stream).map_err(|e| {
            // Nothing at all came back on a reused connection: the server had closed it.
            if e.nothing_read {
                ExchangeError::stale(e.error)
            } else {
                ExchangeError::fatal(e.error)
            }
        })?;
        if response.close {
            self.stream = None;
        }
        if response.status != 200 {
            return Err(ExchangeError::fatal(
                format!("HTTP status {}", response.status).into(),
            ));
        }
        Ok(response.body_len)
    }
}

struct ExchangeError {
    error: BoxError,
    /// Retrying on a fresh connection makes sense.
    stale: bool,
}

impl ExchangeError {
    fn fatal(error: BoxError) -> Self {
        Self {
            error,
            stale: false,
        }
    }
    fn stale(error: BoxError) -> Self {
        Self { error, stale: true }
    }
}

struct Response {
    status: u16,
    body_len: usize,
    close: bool,
}

struct ReadError {
    error: BoxError,
    nothing_read: bool,
}

impl<E: Into<BoxError>> From<E> for ReadError {
    fn from(e: E) -> Self {
        Self {
            error: e.into(),
            nothing_read: false,
        }
    }
}

/// Reads one line (CRLF or LF), failing on EOF.
fn read_line(r: &mut impl BufRead, line: &mut String) -> Result<usize, BoxError> {
    line.clear();
    let n = r.read_line(line)?;
    if n == 0 {
        return Err("connection closed mid-response".into());
    }
    if line.len() > 16 * 1024 {
        return Err("header line longer than 16 KiB".into());
    }
    Ok(n)
}

fn read_response(r: &mut BufReader<TcpStream>) -> Result<Response, ReadError> {
    let mut line = String::new();
    let first = r.read_line(&mut line);
    match first {
        Ok(0) => {
            return Err(ReadError {
                error: "connection closed before the status line".into(),
                nothing_read: true,
            })
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ) =>
        {
            return Err(ReadError {
                error: e.into(),
                nothing_read: true,
            })
        }
        Err(e) => return Err(e.into()),
        Ok(_) => {}
    }
    let mut parts = line.split_whitespace();
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1 status line: {:?}", line.trim_end()).into());
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line: {:?}", line.trim_end()))?;
    let mut close = version == "HTTP/1.0";
    let mut length: Option<usize> = None;
    let mut chunked = false;
    loop {
        read_line(r, &mut line)?;
        let h = line.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        let Some((name, value)) = h.split_once(':') else {
            return Err(format!("bad header line: {h:?}").into());
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse()
                    .map_err(|_| format!("bad Content-Length: {value:?}"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("connection") {
            let v = value.to_ascii_lowercase();
            if v.contains("close") {
                close = true;
            } else if v.contains("keep-alive") {
                close = false;
            }
        }
    }
    let body_len = if chunked {
        read_chunked(r, &mut line)?
    } else if let Some(n) = length {
        let copied = std::io::copy(&mut r.by_ref().take(n as u64), &mut std::io::sink())?;
        if copied != n as u64 {
            return Err(format!("body ended after {copied} of {n} bytes").into());
        }
        n
    } else if status == 204 || status == 304 || (100..200).contains(&status) {
        0
    } else {
        // No length: the body runs to the end of the connection.
        close = true;
        std::io::copy(r, &mut std::io::sink())? as usize
    };
    Ok(Response {
        status,
        body_len,
        close,
    })
}

fn read_chunked(r: &mut BufReader<TcpStream>, line: &mut String) -> Result<usize, BoxError> {
    let mut total = 0usize;
    loop {
        read_line(r, line)?;
        let size_text = line.trim_end().split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size line: {:?}", line.trim_end()))?;
        if size == 0 {
            // Trailers, then the empty line.
            loop {
                read_line(r, line)?;
                if line.trim_end().is_empty() {
                    return Ok(total);
                }
            }
        }
        let copied = std::io::copy(&mut r.by_ref().take(size as u64), &mut std::io::sink())?;
        if copied != size as u64 {
            return Err("chunk ended early".into());
        }
        total += size;
        read_line(r, line)?; // the CRLF after the chunk
    }
}

/// What one client thread measured.
#[derive(Default)]
struct ClientResult {
    latencies: Vec<Duration>,
    body_bytes: u64,
    errors: u64,
    reconnects: u64,
    first_error: Option<String>,
}

fn client(args: &Args, request: Vec<u8>, start: &Barrier) -> ClientResult {
    let mut conn = Conn {
        addr: args.addr,
        timeout: args.timeout,
        request,
        stream: None,
        reconnects: 0,
    };
    // Warm-up (and the connection) before everyone starts; its failures show up below.
    for _ in 0..args.warmup {
        let _ = conn.get();
    }
    conn.reconnects = 0;
    let mut out = ClientResult {
        latencies: Vec::with_capacity(args.requests),
        ..ClientResult::default()
    };
    start.wait();
    for _ in 0..args.requests {
        let t = Instant::now();
        match conn.get() {
            Ok(n) => {
                out.latencies.push(t.elapsed());
                out.body_bytes += n as u64;
            }
            Err(e) => {
                out.errors += 1;
                if out.first_error.is_none() {
                    out.first_error = Some(e.to_string());
                }
            }
        }
    }
    out.reconnects = conn.reconnects;
    out
}

/// Nearest-rank percentile of sorted values, in milliseconds.
fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let i = rank.clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

/// A JSON number, or null for NaN (no good response).
fn num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.4}")
    } else {
        "null".to_string()
    }
}

/// A JSON string with the characters JSON requires escaped.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Arc::new(parse_args()?);
    let request = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", args.path).into_bytes();
    // The clients and this thread: the clock starts when all of them are ready.
    let start = Arc::new(Barrier::new(args.clients + 1));
    let mut handles = Vec::with_capacity(args.clients);
    for i in 0..args.clients {
        let (args, start, request) = (args.clone(), start.clone(), request.clone());
        let h = std::thread::Builder::new()
            .name(format!("client-{i}"))
            .stack_size(256 * 1024)
            .spawn(move || client(&args, request, &start))?;
        handles.push(h);
    }
    start.wait();
    let t0 = Instant::now();
    let mut all = ClientResult::default();
    for h in handles {
        let r = h.join().map_err(|_| "a client thread panicked")?;
        all.latencies.extend(r.latencies);
        all.body_bytes += r.body_bytes;
        all.errors += r.errors;
        all.reconnects += r.reconnects;
        if all.first_error.is_none() {
            all.first_error = r.first_error;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let mut lat = all.latencies;
    lat.sort_unstable();
    let ok = lat.len();
    let mean_ms = if ok == 0 {
        f64::NAN
    } else {
        lat.iter().map(Duration::as_secs_f64).sum::<f64>() / ok as f64 * 1e3
    };
    let bytes = if ok == 0 {
        f64::NAN
    } else {
        all.body_bytes as f64 / ok as f64
    };
    let requests = args.clients * args.requests;
    println!(
        "{{\"clients\": {}, \"requests\": {}, \"ok\": {}, \"errors\": {}, \"reconnects\": {}, \
         \"p50_ms\": {}, \"p90_ms\": {}, \"p99_ms\": {}, \"max_ms\": {}, \"mean_ms\": {}, \
         \"bytes_per_response\": {}, \"wall_s\": {}, \"requests_per_s\": {}, \"first_error\": {}}}",
        args.clients,
        requests,
        ok,
        all.errors,
        all.reconnects,
        num(percentile_ms(&lat, 50.0)),
        num(percentile_ms(&lat, 90.0)),
        num(percentile_ms(&lat, 99.0)),
        num(lat.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)),
        num(mean_ms),
        if bytes.is_finite() {
            format!("{bytes:.0}")
        } else {
            "null".to_string()
        },
        num(wall),
        num(if wall > 0.0 {
            ok as f64 / wall
        } else {
            f64::NAN
        }),
        all.first_error
            .as_deref()
            .map_or_else(|| "null".to_string(), json_string),
    );
    Ok(())
}
