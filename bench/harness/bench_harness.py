#!/usr/bin/env python3
"""One launch per suite vs one launch per test case.

For each suite: list its test cases (Boost.Test --list_content), run the whole
suite in ONE launch through kshard-run-suite, then run every case in a launch
of its own (the way a harness without a suite-wide fixture must), and print
both wall times and their ratio. Both runs use the same binary, rank count and
launcher, side by side in one run of this script. A benchmark, not a test.

  bench_harness.py --launcher tests/harness/kshard-run-suite \
      --suite build/host/tests/mesh/mesh_device_mesh:4 --suite ...:2
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time


def list_cases(exe):
    p = subprocess.run([exe, "--list_content"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env={**os.environ, "KSHARD_TEST_LOG_DIR": tempfile.mkdtemp()})
    stack, leaves = [], []
    lines = [l for l in p.stdout.splitlines() if l.strip() and not l.startswith("[")]
    for idx, line in enumerate(lines):
        depth = (len(line) - len(line.lstrip(" "))) // 4
        name = line.strip().rstrip("*").split(":")[0].strip()
        stack = stack[:depth] + [name]
        nxt = lines[idx + 1] if idx + 1 < len(lines) else ""
        nxt_depth = (len(nxt) - len(nxt.lstrip(" "))) // 4 if nxt else -1
        if nxt_depth <= depth:
            leaves.append("/".join(stack))
    return leaves


def launch(launcher, exe, np, logs, extra=()):
    t0 = time.monotonic()
    p = subprocess.run([launcher, "--np", str(np), "--logs", logs, "--", exe, *extra],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return time.monotonic() - t0, p.returncode, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--suite", action="append", required=True, help="path/to/suite:NPROCS")
    a = ap.parse_args()
    logs = tempfile.mkdtemp(prefix="kshard-bench-harness-")
    rows = []
    for spec in a.suite:
        exe, np = spec.rsplit(":", 1)
        cases = list_cases(exe)
        whole, rc, out = launch(a.launcher, exe, int(np), logs)
        if rc != 0:
            print(out)
            sys.exit(f"{exe} failed in one launch (rc {rc})")
        per = 0.0
        for c in cases:
            t, rc, out = launch(a.launcher, exe, int(np), logs, [f"--run_test={c}"])
            if rc != 0:
                print(out)
                sys.exit(f"{exe} --run_test={c} failed (rc {rc})")
            per += t
        rows.append((os.path.basename(exe), int(np), len(cases), whole, per))
        print(f"{os.path.basename(exe)} np={np}: {len(cases)} cases: one launch {whole:.2f} s, "
              f"one launch per case {per:.2f} s, ratio {per / whole:.1f}x", flush=True)
    tw = sum(r[3] for r in rows)
    tp = sum(r[4] for r in rows)
    print(f"TOTAL: one launch per suite {tw:.2f} s, one launch per case {tp:.2f} s, "
          f"speed-up {tp / tw:.1f}x")


if __name__ == "__main__":
    main()
