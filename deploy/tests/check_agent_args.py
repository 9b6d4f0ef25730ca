#!/usr/bin/env python3
"""The binary accepts what each overlay's DaemonSet gives it.

    check_agent_args.py BINARY SCENARIO OUT_DIR OVERLAY...

For each overlay (or Helm render, named helm-<combination>), reads OUT_DIR/<name>.container.json
(written by check_manifests.py: the container's env, args, the files its ConfigMap volumes
mount, the Secrets it mounts, the guard mode it must run) and:
  - every GPU_WARDEN_* / NODE_NAME variable is one the binary reads (clap silently ignores
    an unknown variable, so a misspelt one would quietly leave a default in force);
  - starts the binary with exactly that env and those args (mounted files materialized in
    a temporary directory, their paths rewritten), plus --backend sim --kube off and a
    loopback --listen that override the manifest's NVML and cluster settings;
  - Secrets the env points into (TLS certificate and key, bearer token, Basic auth users)
    are made up in the temporary directory: a self-signed certificate (openssl), a token,
    a `ci:<sha256>` users line; with them the agent must serve HTTPS, and /metrics must
    answer 401 without the credentials and 200 with them;
  - it must become ready (/readyz 200), log JSON, report the guard mode the overlay sets,
    and exit 0 within 10 s of SIGTERM (the pod's grace period is 30 s).
"""
import base64
import hashlib
import ssl
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import checklib
from checklib import free_port

OVERLAY_MODE = {"default": "dry-run", "enforce": "enforce", "no-runtimeclass": "dry-run",
                "prometheus-operator": "dry-run", "beside-dcgm-exporter": "dry-run",
                "pod-resources": "dry-run"}


INSECURE = ssl.create_default_context()
INSECURE.check_hostname = False
INSECURE.verify_mode = ssl.CERT_NONE
TOKEN = "deploy-check-token"
BASIC_USER, BASIC_PASSWORD = "ci", "deploy-check-password"


def get(url, headers=None):
    return checklib.get(url, headers, INSECURE if url.startswith("https") else None)


def make_secrets(env, tmp, p):
    """Writes what each Secret-backed env var points at; returns (env rewritten, auth header)."""
    out = dict(env)
    header = None
    if "GPU_WARDEN_WEB_TLS_CERT" in env:
        cert, key = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                            "-subj", "/CN=localhost", "-keyout", key, "-out", cert],
                           capture_output=True, text=True)
        if r.returncode != 0:
            p.append(f"openssl could not make a test certificate: {r.stderr.strip()[-300:]}")
        out["GPU_WARDEN_WEB_TLS_CERT"], out["GPU_WARDEN_WEB_TLS_KEY"] = cert, key
    if "GPU_WARDEN_WEB_CONFIG_FILE" in env:
        # The Secret as the chart mounts it: the web config file and the certificate it names
        # beside it (relative paths resolve against the file's folder, as exporter-toolkit's
        # do). Users (bcrypt) are the e2e's (tests/e2e/web_config_file.rs): TLS here.
        folder = os.path.join(tmp, "web")
        os.makedirs(folder)
        r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                            "-subj", "/CN=localhost", "-keyout", os.path.join(folder, "tls.key"),
                            "-out", os.path.join(folder, "tls.crt")], capture_output=True, text=True)
        if r.returncode != 0:
            p.append(f"openssl could not make a test certificate: {r.stderr.strip()[-300:]}")
        path = os.path.join(folder, os.path.basename(env["GPU_WARDEN_WEB_CONFIG_FILE"]))
        with open(path, "w") as f:
            f.write("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
        out["GPU_WARDEN_WEB_CONFIG_FILE"] = path
    if "GPU_WARDEN_WEB_AUTH_BEARER_FILE" in env:
        path = os.path.join(tmp, "token")
        with open(path, "w") as f:
            f.write(TOKEN + "\n")
        out["GPU_WARDEN_WEB_AUTH_BEARER_FILE"] = path
        header = f"Bearer {TOKEN}"
    if "GPU_WARDEN_WEB_AUTH_BASIC_FILE" in env:
        path = os.path.join(tmp, "users")
        with open(path, "w") as f:
            f.write(f"{BASIC_USER}:{hashlib.sha256(BASIC_PASSWORD.encode()).hexdigest()}\n")
        out["GPU_WARDEN_WEB_AUTH_BASIC_FILE"] = path
        header = "Basic " + base64.b64encode(f"{BASIC_USER}:{BASIC_PASSWORD}".encode()).decode()
    return out, header


def check(binary, scenario, spec, overlay, help_text):
    p = []
    known_env = set(re.findall(r"\[env: ([A-Z0-9_]+)=", help_text))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPU_WARDEN_", "KUBERNETES_")) and k not in ("KUBECONFIG", "NODE_NAME")}
    for e in spec["env"]:
        name = e["name"]
        if (name.startswith("GPU_WARDEN_") or name == "NODE_NAME") and name not in known_env:
            p.append(f"env {name} is not read by the binary (known: {sorted(known_env)})")
        if "value" in e:
            env[name] = e["value"]
        elif "valueFrom" in e:
            env[name] = "deploy-check-node"
    if spec.get("command"):
        p.append(f"command overrides the image entrypoint: {spec['command']}")
    with tempfile.TemporaryDirectory(prefix="gpu-warden-args-") as tmp:
        env, auth_header = make_secrets(env, tmp, p)
        scheme = "https" if {"GPU_WARDEN_WEB_TLS_CERT", "GPU_WARDEN_WEB_CONFIG_FILE"} & set(env) else "http"
        args = list(spec["args"])
        for i, (path, text) in enumerate(sorted(spec["files"].items())):
            local = os.path.join(tmp, f"{i}-{os.path.basename(path)}")
            with open(local, "w") as f:
                f.write(text)
            args = [a.replace(path, local) for a in args]
        port = free_port()
        cmd = [binary, *args, "--backend", "sim", "--scenario", scenario, "--kube", "off",
               "--listen", f"127.0.0.1:{port}"]
        log_path = os.path.join(tmp, "agent.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            ready = False
            deadline = time.time() + 15
            while time.time() < deadline and proc.poll() is None:
                status, _ = get(f"{scheme}://127.0.0.1:{port}/readyz")
                if status == 200:
                    ready = True
                    break
                time.sleep(0.1)
            if not ready:
                p.append(f"not ready within 15 s (exit code {proc.poll()})")
            else:
                status, _ = get(f"{scheme}://127.0.0.1:{port}/healthz")
                if status != 200:
                    p.append(f"/healthz answered {status}")
                if auth_header:
                    status, _ = get(f"{scheme}://127.0.0.1:{port}/metrics")
                    if status != 401:
                        p.append(f"/metrics without credentials answered {status}, expected 401")
                status, body = get(f"{scheme}://127.0.0.1:{port}/metrics",
                                   {"Authorization": auth_header} if auth_header else None)
                if status != 200 or b"DCGM_FI_DEV_FB_USED" not in body:
                    p.append(f"{scheme} /metrics{' with credentials' if auth_header else ''} answered {status}")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    code = proc.wait(timeout=10)
                    if code != 0:
                        p.append(f"exit code {code} after SIGTERM")
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    p.append("did not exit within 10 s of SIGTERM")
        with open(log_path) as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
    modes = set()
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            if env.get("GPU_WARDEN_LOG_FORMAT") == "json":
                p.append(f"log line is not JSON: {line[:200]}")
            continue
        mode = rec.get("fields", {}).get("mode")
        if mode:
            modes.add(mode)
    want = spec.get("mode") or OVERLAY_MODE.get(overlay)
    if want and modes != {want}:
        p.append(f"agent logged guard mode {sorted(modes) or 'nothing'}, overlay sets {want}")
    if p:
        p += [f"agent: {line[:300]}" for line in lines[-8:]]
    return p, " ".join(spec["args"]) or "no args"


def main(binary, scenario, out_dir, overlays):
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
    ok = True
    for overlay in overlays:
        path = os.path.join(out_dir, f"{overlay}.container.json")
        if not os.path.exists(path):
            print(f"FAIL binary accepts the {overlay} DaemonSet's env and args: no container spec (did it render?)")
            ok = False
            continue
        with open(path) as f:
            spec = json.load(f)
        problems, shown = check(binary, scenario, spec, overlay, help_text)
        for x in problems:
            print(f"    {x}")
        print(f"{'PASS' if not problems else 'FAIL'} binary accepts the {overlay.replace('helm-', 'helm ', 1)} DaemonSet's env and args "
              f"({shown}), becomes ready, stops on SIGTERM")
        ok &= not problems
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
