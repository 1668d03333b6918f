#!/usr/bin/env python3
"""Synchronous vs asynchronous checkpoint saves in one kshard-train run each,
side by side: how long the saves stopped training, how much of the
synchronous save's time the asynchronous one hides, and the step rate of the
steps that ran while a background write was going on vs the others.

  bench_async_save.py --exe build/cuda/examples/train/kshard-train \\
      [--launch "mpiexec -n 2"] --save-dir /tmp/ckpt --save-every 10 -- <kshard-train args>

kshard-train prints one "checkpoint saved ... blocked B write W" line per
committed save and a step line (tokens/s) per step; a save starts after the
step whose number is a multiple of --save-every, and (async) is committed at
a later step's start. Steps between a save's start and its commit ran beside
the background write.
"""
import argparse
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time


def run(a, extra, mode):
    shutil.rmtree(a.save_dir, ignore_errors=True)
    cmd = (shlex.split(a.launch) if a.launch else []) + [a.exe] + extra + [
        "--save-dir", a.save_dir, "--save-every", str(a.save_every), "--keep", "1"]
    if mode == "async":
        cmd.append("--async-save")
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        print(p.stdout[-4000:])
        sys.exit(f"{mode} run failed (rc {p.returncode})")
    steps, saves = {}, []
    for line in p.stdout.splitlines():
        m = re.match(r"^step\s+(\d+)/\d+\s+loss \S+\s+grad_norm \S+\s+lr \S+\s+tokens/s\s+(\S+)", line)
        if m:
            steps[int(m.group(1))] = float(m.group(2))
            continue
        m = re.match(r"^checkpoint saved \S+ step (\d+) bytes (\d+) seconds (\S+) blocked (\S+) "
                     r"write (\S+)", line)
        if m:
            saves.append(dict(step=int(m.group(1)), bytes=int(m.group(2)),
                              seconds=float(m.group(3)), blocked=float(m.group(4)),
                              write=float(m.group(5)), committed_after=max(steps, default=0)))
    return dict(wall=wall, steps=steps, saves=saves, out=p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exe", required=True)
    ap.add_argument("--launch", default="", help="launcher prefix, e.g. 'mpiexec -n 2'")
    ap.add_argument("--save-dir", required=True)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    extra = [x for x in a.args if x != "--"]
    res = {m: run(a, extra, m) for m in ("sync", "async")}
    for m, r in res.items():
        for s in r["saves"]:
            print(f"{m:5s}: save at step {s['step']:5d}: blocked {s['blocked']:.2f} s, write "
                  f"{s['write']:.2f} s, committed after step {s['committed_after']}")
    for m, r in res.items():
        blocked = sum(s["blocked"] for s in r["saves"])
        write = sum(s["write"] for s in r["saves"])
        gb = sum(s["bytes"] for s in r["saves"]) / 1e9
        print(f"{m:5s}: wall {r['wall']:.1f} s, {len(r['saves'])} saves of {gb / max(1, len(r['saves'])):.2f} GB "
              f"(all ranks), blocked {blocked:.2f} s, write {write:.2f} s (rank 0)")
    # The save after the last step has no later step to hide behind: the
    # run waits for it before exiting. The hidden fraction is over the others.
    last = max(res["sync"]["steps"], default=0)
    sync_blocked = sum(s["blocked"] for s in res["sync"]["saves"] if s["step"] != last)
    async_blocked = sum(s["blocked"] for s in res["async"]["saves"] if s["step"] != last)
    n_mid = sum(1 for s in res["async"]["saves"] if s["step"] != last)
    if sync_blocked > 0:
        print(f"hidden: {100 * (1 - async_blocked / sync_blocked):.1f} % of the synchronous saves' "
              f"{sync_blocked:.2f} s over the {n_mid} saves before the last step "
              f"({async_blocked:.2f} s still blocked)")
    for m in ("sync", "async"):
        fin = [s for s in res[m]["saves"] if s["step"] == last]
        if fin:
            print(f"{m:5s}: the final save (step {last}) blocked {fin[0]['blocked']:.2f} s")
    # Steps that ran beside a background write: after a save's start step,
    # up to and including the step whose start committed it.
    r = res["async"]
    beside = set()
    for s in r["saves"]:
        beside.update(range(s["step"] + 1, s["committed_after"] + 1))
    during = [v for k, v in r["steps"].items() if k in beside]
    others = [v for k, v in r["steps"].items() if k not in beside and k > 1]
    if during and others:
        print(f"async step rate: {statistics.median(during):.0f} tokens/s median over {len(during)} "
              f"steps beside a background write vs {statistics.median(others):.0f} over "
              f"{len(others)} others ({statistics.median(during) / statistics.median(others):.3f}x)")
    sync_steps = [v for k, v in res["sync"]["steps"].items() if k > 1]
    if sync_steps and others:
        print(f"sync step rate (saves excluded from step times): {statistics.median(sync_steps):.0f} "
              f"tokens/s median")


if __name__ == "__main__":
    sys.exit(main())
