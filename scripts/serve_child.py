"""A `gpen-video serve` child for the scripts that drive the service (browser-test.py,
bench-jobs.py): in, the binary, its flags and environment; out, the running process and its base
URL once /healthz answers 200, and a clean stop (SIGTERM, then kill after 30 s)."""
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request


def start(binary, flags, env, what):
    """Starts `binary serve --listen 127.0.0.1:0 FLAGS`; (process, "http://ADDR") once ready."""
    proc = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", *flags],
                            env=env, stderr=subprocess.PIPE, text=True)
    addr = None
    for line in proc.stderr:
        m = re.search(r"listening on http://(\S+)", line)
        if m:
            addr = m.group(1)
            break
    if not addr:
        sys.exit(f"{what}: the service ended before listening")
    # The rest of its log drains on its own (a full pipe would stall it).
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    url = f"http://{addr}"
    end = time.time() + 120
    while True:
        try:
            if urllib.request.urlopen(url + "/healthz").status == 200:
                return proc, url
        except Exception:
            pass
        if time.time() > end or proc.poll() is not None:
            stop(proc)
            sys.exit(f"{what}: the service was not ready within 120 s")
        time.sleep(0.05)


def stop(proc):
    """SIGTERM, then a kill if it has not ended within 30 s."""
    if proc and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
