#!/usr/bin/env python3
"""Static checks of the Dockerfile and .dockerignore (no Docker engine is needed or used).

    check_dockerfile.py CONTEXT_COPY_DIR

- a thin wrapper over CI's image recipe: a rootfs stage runs scripts/image-rootfs.sh (the
  runtime layer from Debian packages, as scripts/image-build.sh does) on the binary the
  builder built (--profile dist --locked: Cargo.toml's shipped profile), and the final stage is FROM scratch with that root
  filesystem only, UID 65532, ENTRYPOINT ["/gpu-warden"], EXPOSE 9400, no RUN (no shell);
  scripts/image-build.sh takes USER, EXPOSE and ENTRYPOINT from it, and
  deploy/tests/check_image.py compares the built image with it;
- the build context after .dockerignore holds what the build needs: copies it into
  CONTEXT_COPY_DIR and runs `cargo metadata --locked --offline --no-deps` there (every
  workspace member and declared target must load), and checks every include_str!/
  include_bytes! path of the sources is in the context.
"""
import fnmatch
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def dockerfile_problems(text):
    p = []
    lines = [re.sub(r"\s+", " ", x.strip()) for x in re.sub(r"\\\n", " ", text).splitlines()]
    lines = [x for x in lines if x and not x.startswith("#")]
    froms = [x for x in lines if x.upper().startswith("FROM ")]
    if len(froms) < 3:
        p.append("expected a multi-stage build (builder, rootfs, runtime)")
    else:
        if not re.match(r"FROM rust:1-bookworm( AS \w+)?$", froms[0], re.I):
            p.append(f"builder stage should be rust:1-bookworm: {froms[0]}")
        # The rootfs stage's Debian release must match the builder's (the binary's glibc).
        if not re.match(r"FROM debian:bookworm(-slim)? AS rootfs$", froms[-2], re.I):
            p.append(f"rootfs stage should be debian:bookworm(-slim) AS rootfs: {froms[-2]}")
        if froms[-1] != "FROM scratch":
            p.append(f"runtime stage should be FROM scratch (the recipe's root filesystem only): {froms[-1]}")
    runtime = lines[lines.index(froms[-1]):] if froms else []
    build = " ".join(lines[:lines.index(froms[-2])] if len(froms) >= 2 else [])
    rootfs = " ".join(lines[lines.index(froms[-2]):lines.index(froms[-1])] if len(froms) >= 2 else [])
    if not re.search(r"cargo build --profile dist --locked -p gpu-warden", build):
        p.append("builder must run cargo build --profile dist --locked -p gpu-warden (the shipped profile, as scripts/image-build.sh)")
    if "COPY scripts/image-rootfs.sh" not in rootfs or not re.search(r"RUN .*image-rootfs\.sh /rootfs /out/gpu-warden", rootfs):
        p.append("the rootfs stage must run scripts/image-rootfs.sh /rootfs /out/gpu-warden (CI's recipe)")
    copies = [x for x in runtime if x.upper().startswith(("COPY", "ADD"))]
    if copies != ["COPY --from=rootfs /rootfs/ /"]:
        p.append(f"the runtime stage must hold the recipe's root filesystem and nothing else: {copies}")
    users = [x for x in runtime if x.upper().startswith("USER ")]
    if not users or users[-1].split()[1].split(":")[0] not in ("65532", "nonroot"):
        p.append("runtime stage must end as USER 65532 (nonroot)")
    if 'ENTRYPOINT ["/gpu-warden"]' not in runtime:
        p.append('runtime stage needs ENTRYPOINT ["/gpu-warden"] (exec form: there is no shell)')
    if "EXPOSE 9400" not in runtime:
        p.append("runtime stage should EXPOSE 9400")
    if any(x.upper().startswith("RUN ") for x in runtime):
        p.append("the runtime stage has no shell: no RUN there")
    if re.search(r"libnvidia-ml", " ".join(x for x in lines if x.upper().startswith(("COPY", "ADD")))):
        p.append("libnvidia-ml must come from the NVIDIA runtime, not the image")
    return p


def ignore_patterns():
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        return [x.strip() for x in f if x.strip() and not x.startswith("#")]


def ignored(rel, patterns):
    """Enough of Docker's .dockerignore matching for this repository's patterns."""
    out = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        pat = pat[2:] if pat.startswith("./") else pat
        parts = rel.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if pat.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(x, pat[3:]) for x in parts) or any(fnmatch.fnmatchcase(x, pat) for x in prefixes)
        else:
            hit = any(fnmatch.fnmatchcase(x, pat) for x in prefixes)
        if hit:
            out = not neg
    return out


def git_files():
    r = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True)
    return [x for x in r.stdout.splitlines() if x and os.path.isfile(os.path.join(ROOT, x))]


def main(copy_dir):
    ok = True
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        p = dockerfile_problems(f.read())
    for x in p:
        print(f"    {x}")
    print(f"{'PASS' if not p else 'FAIL'} Dockerfile: rust:1-bookworm builder, scripts/image-rootfs.sh runtime layer "
          "FROM scratch (CI's recipe), UID 65532, exec ENTRYPOINT, EXPOSE 9400")
    ok &= not p

    patterns = ignore_patterns()
    p = []
    files = git_files()
    kept = [f for f in files if not ignored(f, patterns)]
    for must_go in ("target/debug/gpu-warden", ".git/HEAD"):
        if not ignored(must_go, patterns):
            p.append(f".dockerignore lets {must_go} into the context")
    if ignored("scripts/image-rootfs.sh", patterns):
        p.append(".dockerignore keeps scripts/image-rootfs.sh (the Dockerfile's recipe) out of the context")
    if os.path.exists(copy_dir):
        shutil.rmtree(copy_dir)
    for f in kept:
        dst = os.path.join(copy_dir, f)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), dst)
    if shutil.which("cargo"):
        r = subprocess.run(["cargo", "metadata", "--locked", "--offline", "--no-deps", "--format-version", "1"],
                           cwd=copy_dir, capture_output=True, text=True)
        if r.returncode != 0:
            p.append(f"cargo cannot load the workspace from the build context: {r.stderr.strip()[-400:]}")
    else:
        p.append("cargo not found: cannot check the build context")
    for f in kept:
        if f.endswith(".rs"):
            with open(os.path.join(ROOT, f)) as fh:
                for inc in re.findall(r'include_(?:str|bytes)!\(\s*"([^"]+)"', fh.read()):
                    target = os.path.normpath(os.path.join(os.path.dirname(f), inc))
                    if not os.path.exists(os.path.join(copy_dir, target)):
                        p.append(f"{f} includes {target}, which .dockerignore keeps out")
    for x in p:
        print(f"    {x}")
    print(f"{'PASS' if not p else 'FAIL'} .dockerignore: build context has {len(kept)} files, loads as a Cargo workspace, "
          f"has every include_str! file, excludes target/ and .git")
    ok &= not p
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
