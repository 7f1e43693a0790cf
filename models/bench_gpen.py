"""CPU throughput of exported GPEN models with onnxruntime (python).

    python models/bench_gpen.py models/gpen-bfr-256-random.onnx [--batch 1 4] [--runs 5]
        [--threads 2]

Prints, per batch size, the median wall time of `runs` timed runs (after one warm-up run) and
the faces per second it gives.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpen_export  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads")
    args = ap.parse_args(argv)
    for path in args.models:
        sess = gpen_export.session(path, threads=args.threads)
        size = sess.get_inputs()[0].shape[2]
        for b in args.batch:
            x = gpen_export.sample_input(size, batch=b)
            sess.run(["output"], {"input": x})
            times = []
            for _ in range(args.runs):
                t = time.perf_counter()
                sess.run(["output"], {"input": x})
                times.append(time.perf_counter() - t)
            med = float(np.median(times))
            print(f"{os.path.basename(path)} batch {b}: median {med * 1e3:.0f} ms per batch, "
                  f"{b / med:.2f} faces/s (runs: {', '.join(f'{t * 1e3:.0f}' for t in times)} ms)",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
