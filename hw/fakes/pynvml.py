"""pynvml's calls hw/guard_h200.py makes, answered from hw/fakes/torch's bookkeeping
(hw/fakes/README.md): one GPU of $FAKE_GPU_MIB; a process that has exited has its file
removed (its memory back), as the driver frees an exited process's memory."""
import os
import types

_DIR = os.environ["FAKE_GPU_DIR"]
_TOTAL = int(os.environ.get("FAKE_GPU_MIB", "143771")) << 20
_pid_of = {}


class NVMLError(Exception):
    pass


def nvmlInit():
    pass


def nvmlDeviceGetHandleByIndex(i):
    return i


def _stat(pid):
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        ns = [l.split()[-1] for l in open(f"/proc/{pid}/status") if l.startswith("NSpid:")]
        return fields[0], fields[19], ns[0] if ns else str(pid), str(os.stat(f"/proc/{pid}/ns/pid").st_ino)
    except (OSError, IndexError):
        return None


def _alive(pid, key):
    s = _stat(pid)
    return s is not None and s[0] != "Z" and tuple(s[1:]) == key


def _find(key):
    for name in os.listdir("/proc"):
        if name.isdigit() and _alive(int(name), key):
            return int(name)
    return None


def _entries():
    out = []
    for name in os.listdir(_DIR):
        if name.startswith("."):
            continue
        key = tuple(name.split("."))  # start time, pid in its namespace, the namespace's inode
        pid = _pid_of.get(name)
        if pid is None or not _alive(pid, key):
            pid = _find(key)
        if pid is None:
            try:
                os.remove(os.path.join(_DIR, name))
            except OSError:
                pass
            continue
        _pid_of[name] = pid
        try:
            out.append((pid, int(open(os.path.join(_DIR, name)).read() or 0)))
        except (OSError, ValueError):
            pass
    return out


def nvmlDeviceGetMemoryInfo(_h):
    used = sum(u for _, u in _entries())
    return types.SimpleNamespace(total=_TOTAL, used=used, free=max(0, _TOTAL - used))


def nvmlDeviceGetComputeRunningProcesses(_h):
    return [types.SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in _entries()]
