#!/usr/bin/env python3
"""The GPU check's serve step (scripts/gpu-bundle-run.sh runs it; the bundle carries it): starts
`gpen-video serve` on a free loopback port with the given run flags, posts a portrait at
concurrency 1, 4 and 16 (REQUESTS each, after one warm-up request) from threads with the standard
library's HTTP client, and prints images/s, P50 and P99 latency and the service's mean batch fill
per concurrency; then the portrait as a job (POST /v1/jobs, polled until done: the job thread's
time); then SIGTERM, which must end it with exit 0. Writes the rows as JSON to --json. The
service's jobs folder is a temporary one, removed at the end.

    serve-check.py --image P.jpg --json OUT.json [--requests N] -- GPEN-VIDEO-COMMAND... [serve flags]

The command is the binary with its environment (e.g. `env LD_LIBRARY_PATH=... gpen-video`);
`serve --listen 127.0.0.1:0` is added after it. Exit 0 when every request was answered 200 and
the service stopped cleanly, 1 otherwise.
"""
import argparse
import json
import re
import signal
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    binary, flags = [], []
    for i, c in enumerate(cmd):
        if c.startswith("--"):
            binary, flags = cmd[:i], cmd[i:]
            break
    else:
        binary = cmd
    body = open(a.image, "rb").read()
    jobs_dir = tempfile.mkdtemp(prefix="gpen-serve-check-")
    try:
        return check(a, binary, flags, body, jobs_dir)
    finally:
        shutil.rmtree(jobs_dir, ignore_errors=True)


def check(a, binary, flags, body, jobs_dir):
    proc = subprocess.Popen(binary + ["serve", "--listen", "127.0.0.1:0", "--jobs-dir", jobs_dir] + flags,
                            stderr=subprocess.PIPE, text=True)
    url = None
    log = []
    start = time.time()
    while url is None:
        line = proc.stderr.readline()
        if not line:
            print("serve ended before listening:", "".join(log[-5:]), file=sys.stderr)
            return 1
        log.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            url = m.group(1)
    threading.Thread(target=lambda: [log.append(l) for l in proc.stderr], daemon=True).start()
    while True:
        try:
            if urllib.request.urlopen(url + "/healthz", timeout=5).status == 200:
                break
        except Exception:
            pass
        if time.time() - start > 300 or proc.poll() is not None:
            print("not ready:", "".join(log[-5:]), file=sys.stderr)
            proc.kill()
            return 1
        time.sleep(0.2)
    load_s = time.time() - start

    def post():
        t = time.time()
        req = urllib.request.Request(url + "/v1/restore", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            return r.status, time.time() - t

    def metric(name):
        page = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        return sum(float(l.rsplit(" ", 1)[1]) for l in page.splitlines() if l.startswith(name))

    post()
    rows, ok = [], True
    for c in (1, 4, 16):
        b0, f0 = metric("gpen_worker_batches_total"), metric("gpen_worker_faces_total")
        lat, statuses, lock = [], [], threading.Lock()
        per = max(1, a.requests // c)

        def client():
            for _ in range(per):
                try:
                    s, t = post()
                except Exception as e:
                    s, t = str(e), 0.0
                with lock:
                    statuses.append(s)
                    lat.append(t)

        t0 = time.time()
        threads = [threading.Thread(target=client) for _ in range(c)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        b1, f1 = metric("gpen_worker_batches_total"), metric("gpen_worker_faces_total")
        lat.sort()
        bad = [s for s in statuses if s != 200]
        ok = ok and not bad
        batch = 4
        row = {
            "concurrency": c,
            "requests": len(statuses),
            "images_per_s": len(statuses) / wall,
            "p50_ms": 1000 * lat[len(lat) // 2],
            "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "batch_fill": (f1 - f0) / (batch * (b1 - b0)) if b1 > b0 else None,
            "not_200": len(bad),
        }
        rows.append(row)
        print(f"concurrency {c:>2}: {row['images_per_s']:.1f} images/s, P50 {row['p50_ms']:.0f} ms, "
              f"P99 {row['p99_ms']:.0f} ms, batch fill {row['batch_fill'] or 0:.2f}"
              + (f", {len(bad)} not 200: {bad[:3]}" if bad else ""))
    # The same portrait as a job: accepted, run on the job thread, fetched.
    job = {"state": "not posted"}
    try:
        t = time.time()
        req = urllib.request.Request(url + "/v1/jobs?name=portrait.jpg", data=body, method="POST")
        job = json.load(urllib.request.urlopen(req, timeout=60))
        while job["state"] in ("queued", "running") and time.time() - t < 120:
            time.sleep(0.1)
            job = json.load(urllib.request.urlopen(f"{url}/v1/jobs/{job['id']}", timeout=10))
        if job["state"] == "done":
            urllib.request.urlopen(f"{url}/v1/jobs/{job['id']}/result", timeout=60).read()
        job["wall_s"] = time.time() - t
        print(f"photo job: {job['state']} in {job['wall_s']:.2f} s" + (f": {job.get('error')}" if job.get("error") else ""))
    except Exception as e:
        job = {"state": f"error: {e}"}
        print(f"photo job: {job['state']}")
    ok = ok and job.get("state") == "done"
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    ok = ok and code == 0
    print(f"model loaded and ready in {load_s:.1f} s; SIGTERM: exit {code}")
    json.dump({"serve": rows, "job": job, "ready_s": load_s, "exit": code}, open(a.json, "w"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
