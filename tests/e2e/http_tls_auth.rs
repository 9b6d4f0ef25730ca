//! `/metrics` over TLS with bearer or basic auth, against the real binary: a self-signed
//! certificate made at test time, a rustls client trusting it, and the flag checks.

use crate::support::{get, run_to_exit, tls_get, Agent, AgentArgs};
use base64::Engine;
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::rustls::{self, pki_types::CertificateDer, ClientConfig, RootCertStore};

/// The simulated agent without a cluster, logging at debug (the TLS handshake failures).
fn sim() -> AgentArgs {
    AgentArgs::sim().kube_off().set("--log", "debug")
}

const TOKEN: &str = "tok-7f3a9c1e5b2d4f60";

/// A self-signed certificate for localhost, written into `dir`: (cert path, key path, DER).
fn make_cert(dir: &Path) -> (String, String, CertificateDer<'static>) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    (
        cert.to_str().unwrap().to_string(),
        key.to_str().unwrap().to_string(),
        ck.cert.der().clone(),
    )
}

fn client_config(root_der: &CertificateDer<'static>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(root_der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// Starts the agent with `flags` on a free port and waits for `/readyz` over TLS.
fn start_tls(flags: &[(&str, &str)], cfg: &Arc<ClientConfig>) -> Agent {
    let agent = Agent::spawn(&sim().with(flags).args(), &[]);
    let port = agent.port;
    agent.wait_ready(&format!("gpu-warden ready over TLS on port {port}"), || {
        tls_get(cfg, port, "/readyz", None).is_ok_and(|r| r.status == 200)
    })
}

fn sha256_hex(s: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, s.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn tls_with_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, der) = make_cert(dir.path());
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let cfg = client_config(&der);
    let agent = start_tls(
        &[
            ("--web-tls-cert", &cert),
            ("--web-tls-key", &key),
            ("--web-auth-bearer-file", token_file.to_str().unwrap()),
        ],
        &cfg,
    );
    let port = agent.port;

    let ok = tls_get(&cfg, port, "/metrics", Some(&format!("Bearer {TOKEN}"))).unwrap();
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert!(ok.body.contains("DCGM_FI_DEV_FB_USED"), "{}", ok.body);

    let none = tls_get(&cfg, port, "/metrics", None).unwrap();
    assert_eq!(none.status, 401);
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    let wrong = tls_get(&cfg, port, "/metrics", Some("Bearer nope")).unwrap();
    assert_eq!(wrong.status, 401);
    let state = tls_get(&cfg, port, "/state", None).unwrap();
    assert_eq!(state.status, 401, "/state shows pod names and needs auth");
    let state = tls_get(&cfg, port, "/state", Some(&format!("Bearer {TOKEN}"))).unwrap();
    assert_eq!(state.status, 200);

    // Probes stay open for the kubelet.
    assert_eq!(tls_get(&cfg, port, "/healthz", None).unwrap().status, 200);
    assert_eq!(tls_get(&cfg, port, "/readyz", None).unwrap().status, 200);

    // Plain HTTP to the TLS port gets no HTTP reply, and the server keeps serving.
    assert!(get(port, "/metrics").is_err());
    assert_eq!(tls_get(&cfg, port, "/healthz", None).unwrap().status, 200);

    let (_status, _took, stderr) = agent.terminate();
    assert!(
        stderr.contains("TLS handshake failed"),
        "the failed handshake is logged at debug: {stderr}"
    );
    assert!(!stderr.contains(TOKEN), "the token leaked into the log");
}

#[test]
fn tls_with_basic_auth() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, der) = make_cert(dir.path());
    let users = dir.path().join("users");
    std::fs::write(
        &users,
        format!(
            "# user:sha256(password)\nprom:{}\n",
            sha256_hex("correct horse")
        ),
    )
    .unwrap();
    let cfg = client_config(&der);
    let agent = start_tls(
        &[
            ("--web-tls-cert", &cert),
            ("--web-tls-key", &key),
            ("--web-auth-basic-file", users.to_str().unwrap()),
        ],
        &cfg,
    );
    let basic = |up: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(up)
        )
    };
    let ok = tls_get(
        &cfg,
        agent.port,
        "/metrics",
        Some(&basic("prom:correct horse")),
    )
    .unwrap();
    assert_eq!(ok.status, 200);
    let bad = tls_get(&cfg, agent.port, "/metrics", Some(&basic("prom:wrong"))).unwrap();
    assert_eq!(bad.status, 401);
    assert_eq!(
        bad.header("www-authenticate"),
        Some("Basic realm=\"gpu-warden\"")
    );
    let none = tls_get(&cfg, agent.port, "/metrics", None).unwrap();
    assert_eq!(none.status, 401);
    let (_s, _t, stderr) = agent.terminate();
    assert!(!stderr.contains("correct horse"));
}

#[test]
fn bearer_auth_without_tls() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let args = sim().with(&[("--web-auth-bearer-file", token_file.to_str().unwrap())]);
    let agent = Agent::start(&args.args());
    assert_eq!(get(agent.port, "/metrics").unwrap().status, 401);
    assert_eq!(get(agent.port, "/healthz").unwrap().status, 200);
    let r = crate::support::raw_request(
        agent.port,
        format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 200);
}

#[test]
fn bad_flag_combinations_exit_2_naming_the_flags() {
    let args = sim().with(&[("--web-tls-cert", "cert.pem")]);
    let (code, err) = run_to_exit(&args.args());
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--web-tls-cert") && err.contains("--web-tls-key"),
        "{err}"
    );

    let args = sim().with(&[
        ("--web-auth-bearer-file", "a"),
        ("--web-auth-basic-file", "b"),
    ]);
    let (code, err) = run_to_exit(&args.args());
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--web-auth-bearer-file") && err.contains("--web-auth-basic-file"),
        "{err}"
    );
}

#[test]
fn bad_files_exit_1_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = make_cert(dir.path());
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a pem file\n").unwrap();
    let garbage = garbage.to_str().unwrap();

    let args = sim().with(&[("--web-tls-cert", garbage), ("--web-tls-key", &key)]);
    let (code, err) = run_to_exit(&args.args());
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--web-tls-cert"), "{err}");

    let args = sim().with(&[("--web-tls-cert", &cert), ("--web-tls-key", garbage)]);
    let (code, err) = run_to_exit(&args.args());
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--web-tls-key"), "{err}");

    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let args = sim().with(&[("--web-auth-bearer-file", empty.to_str().unwrap())]);
    let (code, err) = run_to_exit(&args.args());
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--web-auth-bearer-file") && err.contains("empty"),
        "{err}"
    );

    let plain = dir.path().join("users");
    std::fs::write(&plain, "prom:hunter2\n").unwrap();
    let args = sim().with(&[("--web-auth-basic-file", plain.to_str().unwrap())]);
    let (code, err) = run_to_exit(&args.args());
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--web-auth-basic-file"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}
