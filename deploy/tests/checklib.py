"""What the deploy checkers share: one PASS/FAIL line per check, and a tiny HTTP client."""
import socket
import urllib.error
import urllib.request

results = []


def report(ok, name, details=()):
    """Prints the details indented, then `PASS name` or `FAIL name`; remembers the verdict."""
    results.append(ok)
    for d in details:
        print(f"    {d}")
    print(f"{'PASS' if ok else 'FAIL'} {name}")


def summary(checker):
    """The checker's last line (deploy/check.sh hides it) and its exit code."""
    print(f"{checker}: {sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, headers=None, context=None):
    """(status, body); (None, b"") when nothing answers."""
    try:
        req = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(req, timeout=2, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""
