#!/usr/bin/env python3
"""The service's memory under hostile uploads: peak resident memory before and after 100 of them.

Starts `gpen-video serve` on a loopback port (with --max-pixels 4000000), sends five good photos,
reads the process's peak resident memory (VmHWM), then sends 100 hostile uploads in turn, ten of
each kind: PNGs whose zTXt, iTXt or iCCP chunk inflates to 256 MiB, a PNG header announcing
50000x50000, a JPEG with a 16x16 frame header before its 3000x3000 one, a 3000x3000 lossless WebP
inside a 64x64 VP8X canvas, garbage bytes, a PNG cut in half, a body over --max-body-mb and a
BMP claiming 60000x60000. It prints each kind's answers, the peak before and after, and one JSON
line with the figures. Five good photos after them must still be restored.

    scripts/serve-hostile.py [--bin target/release/gpen-video] [--model models/standin/identity-256.onnx]

Run it against two builds to compare them (the same uploads, in turn).
"""

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ffmpeg(*args):
    subprocess.run(["ffmpeg", "-v", "error", "-y", *args], check=True)


def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def zeros_z(n):
    """n zero bytes, zlib-compressed, made in pieces."""
    c = zlib.compressobj(9)
    piece = bytes(1 << 20)
    out = [c.compress(piece) for _ in range(n >> 20)]
    out.append(c.flush())
    return b"".join(out)


def uploads(tmp):
    """(kind, bytes) of each hostile upload, and a good photo."""
    good_path = os.path.join(tmp, "good.png")
    ffmpeg("-i", os.path.join(ROOT, "samples", "astronaut.png"), "-vf", "scale=256:256", good_path)
    good = open(good_path, "rb").read()
    z = zeros_z(256 << 20)
    with_chunk = lambda kind, data: good[:33] + chunk(kind, data) + good[33:]
    big_jpg, big_webp = os.path.join(tmp, "big.jpg"), os.path.join(tmp, "big.webp")
    ffmpeg("-f", "lavfi", "-i", "testsrc2=s=3000x3000", "-frames:v", "1", big_jpg)
    ffmpeg("-f", "lavfi", "-i", "testsrc2=s=3000x3000", "-frames:v", "1", "-c:v", "libwebp", "-lossless", "1", big_webp)
    jpg, webp = open(big_jpg, "rb").read(), open(big_webp, "rb").read()
    sof16 = bytes([0xFF, 0xC0, 0, 17, 8, 0, 16, 0, 16, 3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1])
    vp8x = b"VP8X" + struct.pack("<I", 10) + bytes([0, 0, 0, 0, 63, 0, 0, 63, 0, 0])
    canvas_body = b"WEBP" + vp8x + webp[12:]
    bmp = b"BM" + struct.pack("<IIII", 54, 0, 54, 40) + struct.pack("<iiHH", 60000, 60000, 1, 24) + bytes(24)
    hostile = [
        ("zTXt 256 MiB", with_chunk(b"zTXt", b"Comment\0\0" + z)),
        ("iTXt 256 MiB", with_chunk(b"iTXt", b"XML\0\x01\0\0\0" + z)),
        ("iCCP 256 MiB", with_chunk(b"iCCP", b"icc\0\0" + z)),
        ("IHDR 50000x50000", good[:16] + struct.pack(">II", 50000, 50000) + good[24:64]),
        ("JPEG 16x16 SOF before 3000x3000", jpg[:2] + sof16 + jpg[2:]),
        ("WebP 64x64 canvas around 3000x3000", b"RIFF" + struct.pack("<I", len(canvas_body)) + canvas_body),
        ("garbage", os.urandom(200_000)),
        ("PNG cut in half", good[: len(good) // 2]),
        ("body over --max-body-mb", bytes(3 << 20)),
        ("BMP 60000x60000", bmp),
    ]
    return good, hostile


def post(addr, body):
    req = urllib.request.Request(f"http://{addr}/v1/restore", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code
    except (urllib.error.URLError, ConnectionError) as e:
        return f"connection: {e}"


def peak_mib(pid):
    status = open(f"/proc/{pid}/status").read()
    grab = lambda k: int(re.search(rf"{k}:\s+(\d+) kB", status).group(1)) / 1024
    return grab("VmHWM"), grab("VmRSS")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "gpen-video"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "standin", "identity-256.onnx"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        good, hostile = uploads(tmp)
        cmd = [a.bin, "serve", "--listen", "127.0.0.1:0", "--model", a.model, "--max-pixels", "4000000", "--max-body-mb", "2"]
        log = open(os.path.join(tmp, "serve.log"), "w+")
        child = subprocess.Popen(cmd, stderr=log, env=dict(os.environ, RUST_LOG="gpen_video=info"))
        try:
            addr = None
            for _ in range(600):
                log.seek(0)
                m = re.search(r"listening on http://(\S+)", log.read())
                if m:
                    addr = m.group(1)
                    break
                if child.poll() is not None:
                    sys.exit(f"serve ended: {open(log.name).read()}")
                time.sleep(0.1)
            while post(addr, good) != 200:
                time.sleep(0.2)
            for _ in range(4):
                assert post(addr, good) == 200
            before = peak_mib(child.pid)
            answers = {}
            for _ in range(10):
                for kind, body in hostile:
                    answers.setdefault(kind, []).append(post(addr, body))
            after = peak_mib(child.pid)
            still = [post(addr, good) for _ in range(5)]
            for kind, got in answers.items():
                print(f"{kind:38s} {sorted(set(map(str, got)))}")
            print(f"peak resident memory: {before[0]:.0f} MiB before, {after[0]:.0f} MiB after 100 hostile uploads "
                  f"(resident now {after[1]:.0f} MiB); good photos after them: {still}")
            print(json.dumps({"peak_before_mib": round(before[0]), "peak_after_mib": round(after[0]),
                              "rss_after_mib": round(after[1]), "answers": answers, "good_after": still}))
            if any(s != 200 for s in still):
                sys.exit("the service stopped restoring good photos")
        finally:
            child.terminate()
            child.wait()


if __name__ == "__main__":
    main()
