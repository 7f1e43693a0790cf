#!/usr/bin/env python3
"""Photo latency of `gpen-video serve` with and without a film job running beside it.

Starts the service on a loopback port (its own jobs folder), then in turn: photos alone, photos
while a film job restores (the film posted to /v1/jobs, the photos sent once it runs), photos
alone again. Each phase sends --requests photos at --concurrency to /v1/restore and prints
P50/P99 latency and images/s; the film's own fps comes from its job record.

    scripts/bench-jobs.py [--film samples/twofaces-720p.mp4] [--requests 60] [--concurrency 2]
                          [--model models/standin/identity-512.onnx] [-- extra serve flags]
"""
import argparse
import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import serve_child

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/gpen-video"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/standin/identity-512.onnx"))
    ap.add_argument("--film", default=os.path.join(ROOT, "samples/twofaces-720p.mp4"))
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    env = dict(os.environ)
    env.setdefault("ORT_DYLIB_PATH", os.path.join(ROOT, ".deps/lib/libonnxruntime.so"))
    work = tempfile.mkdtemp(prefix="gpen-bench-jobs-")
    env["XDG_STATE_HOME"] = work
    photo = os.path.join(work, "portrait.jpg")
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", os.path.join(ROOT, "samples/astronaut.png"),
                    "-vf", "scale=512:512", "-q:v", "3", photo], check=True)
    body = open(photo, "rb").read()
    server = None
    try:
        server, url = serve_child.start(
            a.bin, ["--model", a.model, "--jobs-dir", os.path.join(work, "jobs"), *a.extra], env, "bench-jobs")

        def one(_):
            t = time.perf_counter()
            r = urllib.request.urlopen(urllib.request.Request(url + "/v1/restore", data=body, method="POST"))
            r.read()
            return time.perf_counter() - t

        def phase(name):
            one(0)  # warm
            t = time.perf_counter()
            with cf.ThreadPoolExecutor(a.concurrency) as ex:
                lat = list(ex.map(one, range(a.requests)))
            wall = time.perf_counter() - t
            ms = [x * 1e3 for x in lat]
            row = {"phase": name, "p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "images_per_s": len(ms) / wall}
            print(f"{name:<22} P50 {row['p50_ms']:8.1f} ms  P99 {row['p99_ms']:8.1f} ms  {row['images_per_s']:6.2f} images/s")
            return row

        rows = [phase("photos alone")]
        req = urllib.request.Request(url + "/v1/jobs?name=" + os.path.basename(a.film),
                                     data=open(a.film, "rb").read(), method="POST")
        job = json.load(urllib.request.urlopen(req))
        while json.load(urllib.request.urlopen(f"{url}/v1/jobs/{job['id']}"))["state"] == "queued":
            time.sleep(0.1)
        rows.append(phase("photos, film running"))
        rec = json.load(urllib.request.urlopen(f"{url}/v1/jobs/{job['id']}"))
        running = rec["state"] == "running"
        while rec["state"] in ("queued", "running"):
            time.sleep(0.5)
            rec = json.load(urllib.request.urlopen(f"{url}/v1/jobs/{job['id']}"))
        print(f"film {os.path.basename(a.film)}: {rec['state']}, {rec['frames_done']} frames in "
              f"{rec['finished'] - rec['started']:.1f} s; still running when the photos ended: {running}")
        rows.append(phase("photos alone again"))
        print(json.dumps(rows))
    finally:
        serve_child.stop(server)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
