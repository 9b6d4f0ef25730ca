#!/usr/bin/env python3
"""The chart half of scripts/release.sh, with Helm's own SDK (helm-python-sdk).

    release_chart.py CHART_DIR IMAGE_REPOSITORY IMAGE_DIGEST CHART_REPOSITORY OUT_DIR VERSION COMMIT

Copies the chart with its files/ links resolved, sets image.repository and image.digest in
the copy's values.yaml (the comments kept: only those two lines change), packages it, pushes
it to CHART_REPOSITORY (oci://…), reads the digest back from the registry, and writes
OUT_DIR/release.json. RELEASE_PLAIN_HTTP=1: the registry speaks HTTP.
"""
import json
import os
import re
import shutil
import sys
import tempfile

import helm_python as helm


class ReleaseError(Exception):
    pass


def pin_image(values_path, repository, digest):
    """Sets the top-level image block's repository and digest, line by line: values.yaml's
    comments are its documentation (`helm show values` prints them)."""
    with open(values_path) as f:
        lines = f.read().split("\n")
    block = False
    done = set()
    for i, line in enumerate(lines):
        if re.match(r"^\S", line):
            block = line.rstrip() == "image:"
            continue
        m = re.match(r"^  (repository|digest): .*$", line)
        if block and m and m.group(1) not in done:
            lines[i] = f"  {m.group(1)}: {json.dumps(repository if m.group(1) == 'repository' else digest)}"
            done.add(m.group(1))
    if done != {"repository", "digest"}:
        raise ReleaseError(f"{values_path}: no image.repository/image.digest lines to set (found {sorted(done)})")
    with open(values_path, "w") as f:
        f.write("\n".join(lines))


def main(chart_dir, image_repo, image_digest, chart_repo, out, version, commit):
    helm.disable_logging()
    plain = bool(os.environ.get("RELEASE_PLAIN_HTTP"))
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "gpu-warden")
        shutil.copytree(chart_dir, copy, symlinks=False, ignore=shutil.ignore_patterns("ci"))
        pin_image(os.path.join(copy, "values.yaml"), image_repo, image_digest)
        with helm.Chart.load(copy) as chart:
            meta = chart.metadata
            objects = chart.render({}, name="gpu-warden", namespace="gpu-warden", is_install=True)
        want = f"{image_repo}@{image_digest}"
        if want not in "".join(objects.values()):
            raise ReleaseError(f"the pinned chart does not render image {want}")
        for old in os.listdir(out):
            if re.fullmatch(r"gpu-warden-.*\.tgz", old):
                os.remove(os.path.join(out, old))
        archive = helm.package(copy, destination=out)
    pushed = helm.push(archive, chart_repo, plain_http=plain)
    ref = f"{chart_repo.rstrip('/')}/{meta['name']}:{meta['version']}"
    with helm.RegistryClient(plain_http=plain) as client:
        descriptor = client.resolve(ref)
    manifest = {
        "version": version,
        "commit": commit,
        "image": {"repository": image_repo, "tag": version, "digest": image_digest,
                  "reference": f"{image_repo}@{image_digest}"},
        "chart": {"repository": chart_repo, "name": meta["name"], "version": meta["version"],
                  "appVersion": meta.get("appVersion"), "digest": descriptor["digest"],
                  "archive": os.path.basename(archive), "archiveDigest": helm.digest(archive),
                  "reference": f"{chart_repo.rstrip('/')}/{meta['name']}@{descriptor['digest']}"},
    }
    with open(os.path.join(out, "release.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    print(f"chart {ref}@{descriptor['digest']} ({pushed.get('ref', ref) if isinstance(pushed, dict) else ref})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 8:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(main(*sys.argv[1:]))
    except (ReleaseError, helm.HelmError, OSError, KeyError) as e:
        print(f"release_chart.py: {e}", file=sys.stderr)
        sys.exit(1)
