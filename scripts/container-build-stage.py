#!/usr/bin/env python3
"""The container image's build stage without a container: CI's cheap check that the image builds.

deploy/Containerfile's stages take their files from the build context with COPY. This gathers what
the `build` stage copies into an empty folder, placed as the stage places it and filtered by
.dockerignore as podman and docker filter the context, then runs the stage's own command there
(`cargo build --release --locked`, offline) on this checkout's build (hard links to target/release:
cargo holds each unit against every file its compile read, so what the checkout's build already
made is not made again and only gpen-video compiles where its files are newer; in CI, after the
test build, nothing compiles and the stage takes seconds). A file the build needs that the
image's context lacks (as `benches/` once was) fails here as it fails in the image. Every COPY
source of the other stages must exist in the context too (not missing, not ignored).

scripts/container-check.sh builds and self-tests the whole image (about 22 minutes from scratch on
two cores, with podman and debootstrap); scripts/test.sh runs this one.

    scripts/container-build-stage.py [--keep]     # --keep: leave the folder and say where
"""

import fnmatch
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTAINERFILE = os.path.join(ROOT, "deploy", "Containerfile")


def fail(msg):
    print(f"container build stage: {msg}", file=sys.stderr)
    sys.exit(1)


def ignore_patterns():
    """.dockerignore's patterns (no negations are used)."""
    path = os.path.join(ROOT, ".dockerignore")
    if not os.path.exists(path):
        return []
    lines = [line.strip() for line in open(path, encoding="utf-8")]
    return [line.rstrip("/") for line in lines if line and not line.startswith("#")]


def ignored(rel, patterns):
    """Whether the context path `rel` (or a folder above it) is left out of the context."""
    parts = rel.split("/")
    for n in range(1, len(parts) + 1):
        prefix = "/".join(parts[:n])
        for p in patterns:
            if p.startswith("**/"):
                if fnmatch.fnmatch(parts[n - 1], p[3:]):
                    return True
            elif fnmatch.fnmatch(prefix, p):
                return True
    return False


def instructions():
    """The Containerfile's instructions, continuation lines joined: (stage, workdir, words)."""
    text = open(CONTAINERFILE, encoding="utf-8").read().replace("\\\n", " ")
    stage, workdir = None, "/"
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line, comments=False)
        op = words[0].upper()
        if op == "FROM":
            stage = words[-1] if len(words) >= 4 and words[-2].upper() == "AS" else None
            workdir = "/"
        elif op == "WORKDIR":
            workdir = os.path.join(workdir, words[1])
        yield stage, workdir, op, words[1:]


def main():
    keep = "--keep" in sys.argv[1:]
    patterns = ignore_patterns()
    build_copies = []
    for stage, workdir, op, args in instructions():
        if op != "COPY" or any(a.startswith("--from") for a in args):
            continue
        args = [a for a in args if not a.startswith("--")]
        sources, dest = args[:-1], args[-1]
        for src in sources:
            rel = os.path.normpath(src)
            if not os.path.exists(os.path.join(ROOT, rel)):
                fail(f"stage {stage}: COPY {src}: no such file in the checkout")
            if ignored(rel, patterns):
                fail(f"stage {stage}: COPY {src}: left out of the build context by .dockerignore")
        if stage == "build":
            build_copies.append((workdir, sources, dest))
    if not build_copies:
        fail(f"no COPY into the build stage found in {CONTAINERFILE}")

    tmp = tempfile.mkdtemp(prefix="gpen-video-image-build.")
    try:
        top = os.path.join(tmp, "root")
        workdir = build_copies[0][0]
        for wd, sources, dest in build_copies:
            target = os.path.join(top, os.path.join(wd, dest).lstrip("/"))
            for src in sources:
                rel = os.path.normpath(src)
                origin = os.path.join(ROOT, rel)
                if os.path.isdir(origin):
                    # A folder's contents go to the destination (`COPY src src`), less what
                    # .dockerignore leaves out.
                    def skip(folder, names):
                        base = os.path.relpath(folder, ROOT)
                        return [n for n in names if ignored(os.path.normpath(os.path.join(base, n)), patterns)]

                    shutil.copytree(origin, target, ignore=skip, dirs_exist_ok=True)
                else:
                    into_folder = dest.endswith("/") or len(sources) > 1
                    into = os.path.join(target, os.path.basename(rel)) if into_folder else target
                    os.makedirs(os.path.dirname(into), exist_ok=True)
                    shutil.copy2(origin, into)
        # The checkout's compiled dependencies, linked (not copied): only gpen-video compiles.
        release = os.path.join(ROOT, "target", "release")
        target_dir = os.path.join(tmp, "target")
        os.makedirs(os.path.join(target_dir, "release"))
        for sub in ("deps", "build", ".fingerprint"):
            if os.path.isdir(os.path.join(release, sub)):
                subprocess.run(["cp", "-al", os.path.join(release, sub), os.path.join(target_dir, "release")], check=True)
        src_dir = os.path.join(top, workdir.lstrip("/"))
        env = dict(os.environ, CARGO_TARGET_DIR=target_dir)
        cmd = ["cargo", "build", "--release", "--locked", "--offline"]
        print(f"container build stage: {' '.join(cmd)} in the build stage's files ({len(build_copies)} COPY lines)", file=sys.stderr)
        r = subprocess.run(cmd, cwd=src_dir, env=env)
        if r.returncode != 0:
            fail("the image's build stage does not build (its output above): a file it needs is not copied into it?")
        binary = os.path.join(target_dir, "release", "gpen-video")
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout.strip()
        print(f"container build stage: built {version}", file=sys.stderr)
    finally:
        if keep:
            print(f"container build stage: kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
