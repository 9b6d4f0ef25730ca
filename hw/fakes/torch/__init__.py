"""The calls hw/gpu_load.py makes of PyTorch, without a GPU (hw/fakes/README.md).

Each process keeps its "VRAM" in $FAKE_GPU_DIR/<start time>.<pid>.<PID namespace inode>: the
start time (clock ticks since boot) and the namespace's inode are the same seen from every PID
namespace, and the pid is the process's own (os.getpid(), its pid inside its namespace), so
hw/fakes/pynvml.py can find its host pid.
"""
import os
import types

uint8, bfloat16, float32 = 1, 2, 4
_DIR = os.environ["FAKE_GPU_DIR"]
_TOTAL = int(os.environ.get("FAKE_GPU_MIB", "143771")) << 20
_CONTEXT = 512 << 20
_used = 0
_file = None


class OutOfMemoryError(RuntimeError):
    pass


def _others():
    total = 0
    for name in os.listdir(_DIR):
        if name != os.path.basename(_file or "") and not name.startswith("."):
            try:
                total += int(open(os.path.join(_DIR, name)).read() or 0)
            except (OSError, ValueError):
                pass
    return total


def _pidns():
    """The PID namespace's inode: two jobs started in the same clock tick, each in a namespace
    of its own, have the same start time and the same pid there (hw/test_guard_report.py's
    `two` shape: both greedy jobs are launched at once)."""
    return os.stat("/proc/self/ns/pid").st_ino


def _book(delta):
    global _used, _file
    if _file is None:
        start = open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]
        _file = os.path.join(_DIR, f"{start}.{os.getpid()}.{_pidns()}")
        delta += _CONTEXT
    if delta > 0 and _others() + _used + delta > _TOTAL:
        raise OutOfMemoryError(f"CUDA out of memory (fake): tried to allocate {delta >> 20} MiB")
    _used += delta
    tmp = os.path.join(_DIR, f".{os.path.basename(_file)}.tmp")
    with open(tmp, "w") as f:
        f.write(str(_used))
    os.replace(tmp, _file)


class _Tensor:
    def __init__(self, nbytes):
        _book(nbytes)
        self.nbytes = nbytes

    def fill_(self, _v):
        return self

    def __matmul__(self, _other):
        return _Small()

    def __del__(self):
        try:
            _book(-self.nbytes)
        except Exception:
            pass


class _Small:
    pass


def device(kind, index=0):
    return (kind, index)


def empty(n, dtype=uint8, device=None):
    return _Tensor(int(n) * dtype)


def zeros(n, device=None, dtype=float32):
    return _Tensor(int(n) * dtype)


def randn(a, b, dtype=float32, device=None):
    return _Tensor(a * b * dtype)


cuda = types.SimpleNamespace(
    OutOfMemoryError=OutOfMemoryError,
    set_device=lambda _d: _book(0),
    synchronize=lambda: None,
    empty_cache=lambda: None,
)
