//! HTTP under load and abuse: the real binary on loopback, bounded
//! request counts and time limits. 200 concurrent keep-alive connections scraping; 50
//! slow clients stalled half-way through the request line (closed by the 5 s header
//! timeout while `/metrics` keeps answering); an oversized request line, too many headers,
//! garbage and unknown paths; thousands of connections opened and dropped. Afterwards the
//! agent's resident memory has not grown by more than 20 MiB and its descriptors are back
//! to where they started.
//!
//! Each test prints its figures (`cargo test --test http_abuse -- --nocapture`); they are
//! quoted in docs/reliability.md.

use crate::support::*;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn sim() -> AgentArgs {
    AgentArgs::sim().poll("500ms").kube_off().node("node-h")
}

/// VmRSS of `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Open descriptors of `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Reads one response (head + Content-Length body) from a keep-alive connection.
fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<(u16, usize)> {
    buf.clear();
    let mut chunk = [0u8; 65536];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let status = head
                .split(' ')
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .and_then(|v| v.trim().parse::<usize>().ok())
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = s.read(&mut chunk)?;
                if n == 0 {
                    return Err(ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok((status, len));
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Times one `GET /metrics` on a fresh connection.
fn timed_scrape(port: u16) -> Duration {
    let t0 = Instant::now();
    let r = get(port, "/metrics").unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.contains("DCGM_FI_DEV_FB_USED"));
    t0.elapsed()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Waits until the agent's descriptors are back to `start` (+2 for a scrape in flight),
/// returning the count seen.
fn settle_fds(pid: u32, start: usize, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let n = fds(pid);
        if n <= start + 2 || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn load_and_abuse_leave_the_agent_serving_with_bounded_memory_and_descriptors() {
    let test_start = Instant::now();
    let agent = Agent::start(&sim().args());
    let (port, pid) = (agent.port, agent.child.id());
    // Warm up: the first scrapes allocate what every later one reuses.
    for _ in 0..20 {
        timed_scrape(port);
    }
    let (rss0, fds0) = (rss_kib(pid), fds(pid));
    println!("start: RSS {} KiB, {fds0} fds", rss0);

    // 1. 200 concurrent keep-alive connections, 10 scrapes each (2000 requests).
    const CONNS: usize = 200;
    const PER_CONN: usize = 10;
    let barrier = Arc::new(Barrier::new(CONNS + 1));
    let threads: Vec<_> = (0..CONNS)
        .map(|i| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                barrier.wait();
                let mut lat = Vec::with_capacity(PER_CONN);
                let mut buf = Vec::new();
                for k in 0..PER_CONN {
                    let path = match (i + k) % 4 {
                        0 | 1 => "/metrics",
                        2 => "/state",
                        _ => "/healthz",
                    };
                    let t0 = Instant::now();
                    s.write_all(
                        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
                    )
                    .unwrap();
                    let (status, len) = read_response(&mut s, &mut buf).unwrap();
                    assert_eq!(status, 200, "{path}");
                    assert!(len > 0);
                    lat.push(t0.elapsed());
                }
                barrier.wait(); // all done: the main thread counts descriptors
                barrier.wait(); // released: the connection closes
                lat
            })
        })
        .collect();
    barrier.wait();
    let t0 = Instant::now();
    barrier.wait();
    let wall = t0.elapsed();
    let peak_fds = fds(pid);
    barrier.wait();
    let mut lat: Vec<Duration> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    lat.sort();
    println!(
        "concurrent: {} requests on {CONNS} connections in {:.2}s ({:.0}/s); latency p50 {:?} p99 {:?} max {:?}; agent fds with them open {peak_fds}",
        lat.len(),
        wall.as_secs_f64(),
        lat.len() as f64 / wall.as_secs_f64(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().unwrap()
    );
    assert_eq!(lat.len(), CONNS * PER_CONN);
    assert!(wall < Duration::from_secs(30), "{wall:?}");

    // 2. 50 slow clients send half a request line and stall; 5 silent ones send nothing.
    let slow: Vec<TcpStream> = (0..55)
        .map(|i| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            if i < 50 {
                s.write_all(b"GET /metr").unwrap();
            }
            s
        })
        .collect();
    let stalled_at = Instant::now();
    // Scrapes while they stall: answered at once.
    let mut during = Vec::new();
    while stalled_at.elapsed() < Duration::from_millis(4000) {
        during.push(timed_scrape(port));
        std::thread::sleep(Duration::from_millis(200));
    }
    during.sort();
    let worst = *during.last().unwrap();
    println!(
        "slow clients: {} scrapes while 50 stalled, p50 {:?} max {worst:?}",
        during.len(),
        percentile(&during, 0.5)
    );
    assert!(worst < Duration::from_secs(1), "scrape took {worst:?}");
    // The header timeout (5 s) closes every stalled connection.
    let closed: Vec<Duration> = slow
        .into_iter()
        .map(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
            let mut b = [0u8; 1024];
            loop {
                match s.read(&mut b) {
                    Ok(0) => break,
                    Ok(_) => continue, // a 408 before the close is fine too
                    Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
                    Err(e) => panic!("stalled connection not closed: {e}"),
                }
            }
            stalled_at.elapsed()
        })
        .collect();
    let last_closed = closed.iter().max().unwrap();
    println!("slow clients: all 55 closed by the server after {last_closed:?}");
    assert!(
        *last_closed < Duration::from_secs(8),
        "closed after {last_closed:?}"
    );

    // 2b. Beyond the connection limit (256): 260 stalled clients hold every slot, so a
    //     scrape waits in the accept queue until the header timeout frees one. Bounded by
    //     that timeout, not lost; the figure is recorded in docs/reliability.md.
    let flood: Vec<TcpStream> = (0..260)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(b"GET /metr").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let starved = timed_scrape(port);
    println!("260 stalled clients (limit 256): a scrape waited {starved:?}");
    assert!(starved < Duration::from_secs(7), "{starved:?}");
    drop(flood);

    // 3. Oversized request line, too many headers, garbage, unknown paths and methods.
    let long_line = format!(
        "GET /{} HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    if let Ok(r) = raw_request(port, long_line.as_bytes()) {
        assert!(
            [400, 414, 431].contains(&r.status),
            "oversized request line: {}",
            r.status
        );
    }
    let many_headers = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\n{}\r\n",
        (0..200)
            .map(|i| format!("X-H{i}: v\r\n"))
            .collect::<String>()
    );
    if let Ok(r) = raw_request(port, many_headers.as_bytes()) {
        assert!([400, 431].contains(&r.status), "200 headers: {}", r.status);
    }
    if let Ok(r) = raw_request(port, b"\x00\xff\x16\x03\x01\x02\x00garbage\r\n\r\n") {
        assert_eq!(r.status, 400);
    }
    for path in [
        "/nope",
        "/metrics/",
        "//metrics",
        "/../etc/passwd",
        "/%2e%2e/state",
        "/metrics%00",
        "/\u{00e9}t\u{00e9}",
        "/state.json",
    ] {
        let r = get(port, path).unwrap();
        assert_eq!(r.status, 404, "{path}");
    }
    assert_eq!(get(port, "/metrics?x=1&y=2").unwrap().status, 200);
    for method in ["DELETE", "PUT", "PATCH", "OPTIONS", "TRACE", "CONNECT"] {
        let r = raw_request(
            port,
            format!("{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        if let Ok(r) = r {
            assert!([405, 400].contains(&r.status), "{method}: {}", r.status);
        }
    }

    // 4. Many connections opened and closed: 1500 dropped at once, 500 dropped mid-request
    //    (the request sent, the answer never read).
    for _ in 0..1500 {
        drop(TcpStream::connect(("127.0.0.1", port)).unwrap());
    }
    for _ in 0..500 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    println!("churn: 2000 connections opened and dropped");

    // Afterwards: still serving, memory and descriptors bounded.
    let after = timed_scrape(port);
    assert!(after < Duration::from_secs(1), "{after:?}");
    assert_eq!(get(port, "/healthz").unwrap().status, 200);
    let fds1 = settle_fds(pid, fds0, Duration::from_secs(10));
    let rss1 = rss_kib(pid);
    println!(
        "end: RSS {rss1} KiB ({:+} KiB), {fds1} fds (start {fds0}); test took {:.1}s",
        rss1 as i64 - rss0 as i64,
        test_start.elapsed().as_secs_f64()
    );
    assert!(fds1 <= fds0 + 2, "descriptors leaked: {fds0} → {fds1}");
    assert!(
        rss1 < rss0 + 20 * 1024,
        "RSS grew from {rss0} KiB to {rss1} KiB"
    );
    let (status, _, stderr) = agent.terminate();
    assert!(status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
