"""The time-boxed driver every fuzzer here shares: workers in subprocesses, each running
seeds start, start + step, ... and printing a line per case, so that a crash (a segfault,
an abort, a sanitizer's report) is caught, the case it was running reported by seed, and a
fresh worker goes on.  A fuzzer provides ``run_case(seed)``, which returns "ok",
"rejected", "unchecked" or a message describing a failure, and ``make_case(seed)``.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

OUTCOMES = ("ok", "rejected", "unchecked")


def worker(run_case, start, step, deadline):
    """Run seeds start, start + step, ... until the deadline, a line per case."""
    seed = start
    while time.time() < deadline:
        print(f"start {seed}", flush=True)
        print(f"done {seed} {run_case(seed)}", flush=True)
        seed += step


def main(script, doc, run_case, make_case, argv=None):
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="the first seed")
    p.add_argument("--case", type=int, help="replay one case and print it")
    p.add_argument("--worker", nargs=3, type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(run_case, int(args.worker[0]), int(args.worker[1]), args.worker[2])
        return 0
    if args.case is not None:
        case = make_case(args.case)
        print({k: (v.shape if hasattr(v, "shape") else v) for k, v in case.items()})
        print(run_case(args.case))
        return 0
    deadline = time.time() + args.seconds
    counts, failures = {}, []
    lock = threading.Lock()

    def record(key, failure=None):
        with lock:
            counts[key] = counts.get(key, 0) + 1
            if failure:
                failures.append(failure)

    def supervise(start):
        """One worker at a time from seed `start` on, a fresh one after each crash."""
        while time.time() < deadline:
            proc = subprocess.Popen(
                [sys.executable, script, "--worker", str(start), str(args.workers),
                 str(deadline)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            started = None
            for line in proc.stdout:
                kind, seed, *rest = line.split(maxsplit=2)
                if kind == "start":
                    started = int(seed)
                    continue
                started = None
                outcome = rest[0].strip()
                key = outcome if outcome in OUTCOMES else "failed"
                record(key, None if key != "failed" else f"seed {seed}: {outcome}")
            err = proc.stderr.read()
            if proc.wait() == 0 or started is None:
                return
            record("crashed", f"seed {started}: the worker died (status {proc.returncode}): "
                              f"{err.strip()[-1500:]}")
            start = started + args.workers

    threads = [threading.Thread(target=supervise, args=(args.seed + w,))
               for w in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(counts.values())
    print(f"fuzz: {total} cases in {args.seconds:.0f} s: "
          + ", ".join(f"{counts.get(k, 0)} {k}" for k in (*OUTCOMES, "failed", "crashed")))
    for f in failures:
        print("FAIL", f)
    passed = total - counts.get("failed", 0) - counts.get("crashed", 0)
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0
