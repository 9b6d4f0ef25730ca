//! `--web.config.file` (exporter-toolkit's format) against the real binary over real TLS: a
//! test CA made with rcgen signs the server's and the client's certificates, the client is
//! rustls, and the users are bcrypt hashes. What the file may say and how it is reloaded
//! follow exporter-toolkit's web/tls_config.go (`ConfigToTLSConfig`, `GetConfigForClient`
//! re-reading the file per handshake) and web/handler.go (basic auth per request).

use crate::support::{run_to_exit, run_to_exit_with_env, tls_get, Agent, AgentArgs};
use base64::Engine;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_rustls::rustls::{
    self,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
    ClientConfig, RootCertStore,
};

/// A test CA: its certificate (DER) and what signs with it.
struct Ca {
    der: CertificateDer<'static>,
    pem: String,
    cert: Certificate,
    key: KeyPair,
}

fn ca(name: &str) -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    Ca {
        der: cert.der().clone(),
        pem: cert.pem(),
        cert,
        key,
    }
}

/// A leaf signed by `ca`: (certificate PEM, key PEM, certificate DER, key DER).
fn leaf(
    ca: &Ca,
    name: &str,
    usage: ExtendedKeyUsagePurpose,
) -> (
    String,
    String,
    CertificateDer<'static>,
    PrivateKeyDer<'static>,
) {
    let mut p = CertificateParams::new(vec![name.to_string()]).unwrap();
    p.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &ca.cert, &ca.key).unwrap();
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    (cert.pem(), key.serialize_pem(), cert.der().clone(), key_der)
}

fn client(
    root: &Ca,
    cert: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(root.der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match cert {
        Some((c, k)) => b.with_client_auth_cert(vec![c], k).unwrap(),
        None => b.with_no_client_auth(),
    })
}

fn basic(user_pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(user_pass)
    )
}

/// Writes `text` to `dir/name` through a rename, as a Secret volume's update swaps files.
fn swap_in(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.new"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

const WEB_YML: &str = "\
tls_server_config:
  cert_file: tls.crt   # relative to this file, as exporter-toolkit resolves them
  key_file: tls.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  min_version: TLS12
basic_auth_users:
  prometheus: HASH
";

#[test]
fn client_certificates_bcrypt_users_and_a_rotated_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let server_ca = ca("server CA");
    let client_ca = ca("client CA");
    let (crt, key, _, _) = leaf(&server_ca, "localhost", ExtendedKeyUsagePurpose::ServerAuth);
    swap_in(d, "tls.crt", &crt);
    swap_in(d, "tls.key", &key);
    swap_in(d, "ca.crt", &client_ca.pem);
    // Cost 4 keeps the debug build's bcrypt quick; the check is the one cost 10 gets.
    let hash = bcrypt::hash("correct horse", 4).unwrap();
    swap_in(d, "web.yml", &WEB_YML.replace("HASH", &hash));

    let (_, _, ccert, ckey) = leaf(
        &client_ca,
        "prometheus",
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let with_cert = client(&server_ca, Some((ccert.clone(), ckey.clone_key())));
    let web = d.join("web.yml");
    let agent = Agent::spawn(
        &AgentArgs::sim()
            .kube_off()
            .set("--web.config.file", &web)
            .args(),
        &[],
    );
    let port = agent.port;
    let agent = agent.wait_ready("the agent ready over TLS with a client certificate", || {
        tls_get(&with_cert, port, "/readyz", None).is_ok_and(|r| r.status == 200)
    });

    let ok = tls_get(
        &with_cert,
        port,
        "/metrics",
        Some(&basic("prometheus:correct horse")),
    )
    .unwrap();
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert!(ok.body.contains("DCGM_FI_DEV_FB_USED"));
    let wrong = tls_get(
        &with_cert,
        port,
        "/metrics",
        Some(&basic("prometheus:wrong")),
    )
    .unwrap();
    assert_eq!(wrong.status, 401);
    assert_eq!(
        wrong.header("www-authenticate"),
        Some("Basic"),
        "exporter-toolkit's challenge"
    );
    let unknown = tls_get(
        &with_cert,
        port,
        "/metrics",
        Some(&basic("nobody:correct horse")),
    )
    .unwrap();
    assert_eq!(unknown.status, 401);
    assert_eq!(
        tls_get(&with_cert, port, "/metrics", None).unwrap().status,
        401
    );
    assert_eq!(
        tls_get(&with_cert, port, "/healthz", None).unwrap().status,
        200,
        "the kubelet's probes stay open"
    );
    // RequireAndVerifyClientCert: no certificate, or one from another CA, is refused at the
    // handshake.
    assert!(tls_get(&client(&server_ca, None), port, "/healthz", None).is_err());
    let (_, _, other, other_key) = leaf(
        &ca("stranger"),
        "prometheus",
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    assert!(tls_get(
        &client(&server_ca, Some((other, other_key))),
        port,
        "/healthz",
        None
    )
    .is_err());

    // The user list is re-read when the file changes: a new password works at once.
    swap_in(
        d,
        "web.yml",
        &WEB_YML.replace("HASH", &bcrypt::hash("battery staple", 4).unwrap()),
    );
    let r = tls_get(
        &with_cert,
        port,
        "/metrics",
        Some(&basic("prometheus:battery staple")),
    )
    .unwrap();
    assert_eq!(
        r.status, 200,
        "the changed user list applies to the next request"
    );
    let r = tls_get(
        &with_cert,
        port,
        "/metrics",
        Some(&basic("prometheus:correct horse")),
    )
    .unwrap();
    assert_eq!(r.status, 401, "the old password is revoked");

    // cert-manager renews the certificate from another CA: the next handshake presents it.
    let renewed_ca = ca("renewed server CA");
    let (crt2, key2, _, _) = leaf(
        &renewed_ca,
        "localhost",
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let trusts_renewed = client(&renewed_ca, Some((ccert, ckey)));
    assert!(
        tls_get(&trusts_renewed, port, "/healthz", None).is_err(),
        "before the renewal"
    );
    swap_in(d, "tls.key", &key2);
    swap_in(d, "tls.crt", &crt2);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match tls_get(&trusts_renewed, port, "/healthz", None) {
            Ok(r) if r.status == 200 => break,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => panic!(
                "the renewed certificate is not served: {:?}",
                other.map(|r| r.status)
            ),
        }
    }
    assert!(
        tls_get(&with_cert, port, "/healthz", None).is_err(),
        "the old certificate is gone"
    );

    // A broken change fails closed and is logged; fixing it recovers without a restart.
    swap_in(d, "web.yml", "tls_server_config: {cert_file: tls.crt}\n");
    assert!(tls_get(&trusts_renewed, port, "/healthz", None).is_err());
    swap_in(d, "web.yml", &WEB_YML.replace("HASH", &hash));
    assert_eq!(
        tls_get(&trusts_renewed, port, "/healthz", None)
            .unwrap()
            .status,
        200
    );

    let (_s, _t, stderr) = agent.terminate();
    assert!(
        stderr.contains("web config changed but cannot be used"),
        "{stderr}"
    );
    assert!(!stderr.contains("correct horse") && !stderr.contains("battery staple"));
}

#[test]
fn users_without_tls_and_a_file_without_users_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "basic_auth_users:\n  p: {}\n",
            bcrypt::hash("pw", 4).unwrap()
        ),
    )
    .unwrap();
    let agent = Agent::start(
        &AgentArgs::sim()
            .kube_off()
            .set("--web.config.file", &web)
            .args(),
    );
    assert_eq!(
        crate::support::get(agent.port, "/metrics").unwrap().status,
        401
    );
    let r = crate::support::raw_request(
        agent.port,
        format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nConnection: close\r\n\r\n",
            basic("p:pw")
        )
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    // An empty file is valid in exporter-toolkit: no TLS, no users.
    std::fs::write(&web, "").unwrap();
    assert_eq!(
        crate::support::get(agent.port, "/metrics").unwrap().status,
        200
    );
}

#[test]
fn a_file_that_cannot_be_used_is_one_line_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let server_ca = ca("server CA");
    let (crt, key, _, _) = leaf(&server_ca, "localhost", ExtendedKeyUsagePurpose::ServerAuth);
    swap_in(d, "tls.crt", &crt);
    swap_in(d, "tls.key", &key);
    let web = d.join("web.yml");
    for (text, want) in [
        ("tls_server_config: {cert_file: tls.crt, key_file: tls.key, cipher_suites: [TLS_AES_128_GCM_SHA256]}\n", "tls_server_config.cipher_suites is not supported"),
        ("tls_server_config: {cert_file: tls.crt, key_file: tls.key, client_auth_type: RequireAnyClientCert}\n", "without verifying them is not supported"),
        ("tls_server_config: {cert_file: tls.crt, key_file: tls.key, client_ca_file: tls.crt}\n", "client_auth_type is not"),
        ("tls_server_config: {cert_file: tls.crt, key_file: tls.key, client_auth_type: RequireAndVerifyClientCert}\n", "client_ca_file is required"),
        ("tls_server_config: {cert_file: tls.crt, key_file: missing.key}\n", "tls_server_config.key_file"),
        ("tls_server_config: {cert_file: tls.crt, key_file: tls.key, min_version: TLS10}\n", "TLS12 or TLS13"),
        ("basic_auth_users:\n  prometheus: hunter2\n", "basic_auth_users.prometheus: not a bcrypt hash"),
        ("basic_auth_user:\n  prometheus: x\n", "unknown field `basic_auth_user`"),
    ] {
        std::fs::write(&web, text).unwrap();
        let (code, err) = run_to_exit(&AgentArgs::sim().kube_off().set("--log", "warn").set("--web.config.file", &web).args());
        assert_eq!(code, Some(1), "{text}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{text}: {err}");
        assert!(err.contains("--web.config.file") && err.contains(want), "{text}: {err}");
        assert!(!err.contains("hunter2"), "a plain-text password is never echoed: {err}");
    }
    // The old flags and the file exclude each other.
    std::fs::write(&web, "").unwrap();
    let (code, err) = run_to_exit(
        &AgentArgs::sim()
            .kube_off()
            .set("--web.config.file", &web)
            .set("--web-tls-cert", d.join("tls.crt"))
            .set("--web-tls-key", d.join("tls.key"))
            .args(),
    );
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--web.config.file excludes --web-tls-cert"),
        "{err}"
    );
}

#[test]
fn the_extender_refuses_users_its_callers_cannot_present() {
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "basic_auth_users:\n  p: {}\n",
            bcrypt::hash("pw", 4).unwrap()
        ),
    )
    .unwrap();
    let (code, err) = run_to_exit_with_env(
        &["extender"],
        &[("GPU_WARDEN_EXTENDER_WEB_CONFIG_FILE", web.to_str().unwrap())],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("basic_auth_users cannot be used by the extender"),
        "{err}"
    );
}
