#!/usr/bin/env python3
"""`scripts/link_order.py check`'s verdicts, on made-up symbol tables (no dist build needed):

    check_link_order.py

A list the binary was laid out by passes; a list the linker ignored, a missing list and an
empty one fail; a stale list (functions renamed or moved since it was recorded) passes with
a WARN line that gives the share found and the resident-code estimate, so a renamed function
never breaks CI. One PASS/FAIL line per case.
"""
import contextlib
import io
import os
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import link_order  # noqa: E402
from checklib import report, summary  # noqa: E402


def legacy(i, salt=0):
    """A legacy-mangled function name; another salt is the same function after a rebuild."""
    return f"_ZN10gpu_warden5agent1f{i}17h{i * 31 + salt:016x}E"


def verdict(listed, syms):
    """(exit code, output) of `check` on `syms` with `listed` as the list (None: no list)."""
    work = tempfile.mkdtemp(prefix="link-order-check-")
    path = os.path.join(work, "hot-symbols.txt")
    if listed is not None:
        with open(path, "w") as f:
            f.write("".join(n + "\n" for n in listed))
    link_order.symbols = lambda _binary: syms
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            link_order.check(types.SimpleNamespace(binary="gpu-warden", list=path))
        except SystemExit as e:
            code = 1 if e.code else 0
            out.write(str(e.code))
    return code, out.getvalue()


HOT = [legacy(i) for i in range(200)]
PACKED = {n: (0x200000 + i * 96, 96) for i, n in enumerate(HOT)}
SPREAD = {n: (0x200000 + i * 70_000, 96) for i, n in enumerate(HOT)}
# Half the functions renamed since the list was recorded: the binary has them under new
# hashes, scattered, outside the order.
STALE = {n: PACKED[n] for n in HOT[:100]}
STALE.update({legacy(i, salt=1): (0x900000 + i * 70_000, 96) for i in range(100, 200)})

CASES = [
    ("a list the binary was laid out by passes quietly", HOT, PACKED, 0, ["100%"], ["WARN"]),
    ("a list the linker ignored fails", HOT, SPREAD, 1, ["did not use"], []),
    ("a missing list fails", None, PACKED, 1, ["is missing"], []),
    ("an empty list fails", [], PACKED, 1, ["is empty"], []),
    ("a stale list passes with a warning and the measured figures", HOT, STALE, 0,
     ["WARN link order:", "100 of 200", "50%", "100 of the 100 missing were found",
      "MiB of 64 KiB fault-around windows", "MiB more of the binary resident", "record"], []),
    ("a list none of whose names is left passes with a warning", HOT,
     {legacy(i, salt=1): (i * 70_000, 96) for i in range(200)}, 0,
     ["WARN link order:", "0 of 200", "too few are left"], []),
]


def generic(salt):
    """One instance of a generic function: every instance has the same legacy stem."""
    return f"_ZN4core3ptr13drop_in_place17h{salt:016x}E"


def main():
    for name, listed, syms, want_code, want, unwanted in CASES:
        code, out = verdict(listed, syms)
        problems = [f"exit {code}, wanted {want_code}"] if code != want_code else []
        problems += [f"lacks {w!r}" for w in want if w not in out]
        problems += [f"has {u!r}" for u in unwanted if u in out]
        report(not problems, name, problems + ([out.strip()] if problems else []))
    # `record` and `check` find renamed functions by one rule: of two listed instances of a
    # generic function, one kept its name and one was renamed; the renamed one is found (the
    # one that kept its name is no candidate), and a third new instance makes the stem
    # ambiguous, so none is.
    kept, renamed, new, other = generic(1), generic(2), generic(3), generic(4)
    found = link_order.under_new_names({renamed}, {kept: (0, 8), new: (8, 8)}, taken={kept})
    report(found == {new}, "a renamed instance beside one that kept its name is found",
           [] if found == {new} else [f"found {found}"])
    found = link_order.under_new_names({renamed}, {kept: (0, 8), new: (8, 8), other: (16, 8)}, taken={kept})
    report(found == set(), "an instance that two new ones could be is left out",
           [] if found == set() else [f"found {found}"])
    return summary("check_link_order")


if __name__ == "__main__":
    sys.exit(main())
