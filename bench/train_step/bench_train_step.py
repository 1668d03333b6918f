#!/usr/bin/env python3
"""Training step at 1, 2 and 4 ranks: tokens/s and per-rank memory vs ZeRO-3.

One launch of kshard-train --bench per rank count, the same model and the
same per-rank batch each time (weak scaling: the global batch grows with the
ranks), on a 1-D mesh (every rank shards every unit). From each launch's
"BENCH {json}" line it prints:

  tokens/s       global training tokens per second (median over steps 2..;
                 the mean is in the BENCH line),
                 and the ratio to the 1-rank run
  state/rank     params + grads (the sharded master and gradient shards, plus
                 the low-precision shard of bf16/fp16) + Adam's moments, the
                 worst rank
  bound          the ZeRO-3 bound 16 B/param / N + one unsharded unit
  state/bound    ratio (<= 1: the sharded state fits the bound)
  state/16P/N    the same against 16 B/param / N alone (padding shows as > 1)
  peak/rank      peak Kokkos memory of the worst rank during a step (adds
                 activations, workspaces and the gathered units)
  peak-state     what a step adds on top of the sharded state (activations,
                 workspaces, gathered units): per-rank batch fixed, so it
                 should not grow with N
  peak/bound     ratio

  bench_train_step.py --exe build/h5/examples/train/kshard-train [--ranks 1,2,4]
      [--mpiexec mpiexec] [-- extra kshard-train options]

A benchmark, not a test: it fails only when a launch fails.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys

DEFAULT_MODEL = ["--layers", "4", "--width", "128", "--heads", "4", "--vocab", "256",
                 "--seq", "64", "--batch", "4", "--steps", "12"]


def launch(a, np, extra):
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    cmd = [a.mpiexec, "-n", str(np), "--bind-to", "none", a.exe, "--bench", *extra]
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=env, timeout=a.timeout)
    if p.returncode != 0:
        print(p.stdout)
        sys.exit(f"kshard-train failed at {np} ranks (rc {p.returncode})")
    for line in p.stdout.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[len("BENCH "):])
    print(p.stdout)
    sys.exit(f"no BENCH line at {np} ranks")


def mib(b):
    return f"{b / 2**20:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exe", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("extra", nargs="*", help="kshard-train options (replace the default model)")
    a = ap.parse_args()
    extra = a.extra or DEFAULT_MODEL
    rows = [launch(a, int(n), extra) for n in a.ranks.split(",")]
    base = rows[0]["tokens_per_s_median"]
    r0 = rows[0]
    print()
    print(f"model: {' '.join(extra)}  ({r0['params']} params, recipe {r0['recipe']}, "
          f"largest unit {mib(r0['max_unit_bytes'])} MiB unsharded)")
    print(f"host: {os.cpu_count()} cores; ranks beyond the cores are oversubscribed")
    hdr = ["ranks", "tokens/s", "x 1 rank", "state/rank MiB", "bound MiB", "state/bound",
           "state/16P/N", "peak/rank MiB", "peak-state MiB", "peak/bound", "last loss"]
    table = []
    for r in rows:
        n = r["shard_size"]
        ideal = 16.0 * r["params"] / n
        table.append([str(r["ranks"]), f"{r['tokens_per_s_median']:.0f}",
                      f"{r['tokens_per_s_median'] / base:.2f}", mib(r["state_bytes"]),
                      mib(r["bound_bytes"]), f"{r['state_bytes'] / r['bound_bytes']:.3f}",
                      f"{r['state_bytes'] / ideal:.3f}", mib(r["peak_bytes"]),
                      mib(r["peak_bytes"] - r["state_bytes"]),
                      f"{r['peak_bytes'] / r['bound_bytes']:.2f}", f"{r['last_loss']:.3f}"])
    w = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(hdr)]
    print("| " + " | ".join(h.rjust(w[i]) for i, h in enumerate(hdr)) + " |")
    print("|" + "|".join("-" * (x + 2) for x in w) + "|")
    for t in table:
        print("| " + " | ".join(c.rjust(w[i]) for i, c in enumerate(t)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
