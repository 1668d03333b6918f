#!/usr/bin/env python3
"""kshard's fp8 recipes against its bf16 recipe: speed, memory and loss on real text.

  speed    one kshard-train --bench launch per (size, recipe), alternating the
           recipes, --repeats rounds; per size: tokens/s (median over steps of
           each launch, then the median over the repeats), the ratio to bf16,
           peak memory per rank and its ratio to bf16.
  quality  the same data and schedule for every recipe on real text (the
           token files of prepare_text.sh): final eval_loss of each recipe and
           its relative difference to bf16's.

  compare_recipes.py speed --exe build/cuda/examples/train/kshard-train \\
      [--sizes large,xl] [--recipes bf16,fp8,fp8-current,fp8-delayed] [--repeats 2] [--steps 20]
  compare_recipes.py quality --exe ... --data DIR [--recipes ...] [--steps 1500]

Sizes (width/heads/layers/seq/batch/vocab): medium 1024/16/8/512/8/8192, large
2048/16/8/1024/4/32000 (536 M params), xl 4096/32/8/1024/4/32000 (1.9 B);
quality: d768 h12 L12 T512 B16 V256 (85 M), lr 6e-4 warmup 100, cosine to
6e-5, weight decay 0.1. A benchmark, not a test: it fails only when a launch
fails; the targets (issue 19) are in docs/BENCHMARKS.md.
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys

SIZES = {
    "medium": ["--width", "1024", "--heads", "16", "--layers", "8", "--seq", "512",
               "--batch", "8", "--vocab", "8192"],
    "large": ["--width", "2048", "--heads", "16", "--layers", "8", "--seq", "1024",
              "--batch", "4", "--vocab", "32000"],
    "xl": ["--width", "4096", "--heads", "32", "--layers", "8", "--seq", "1024",
           "--batch", "4", "--vocab", "32000"],
}
QUALITY = ["--width", "768", "--heads", "12", "--layers", "12", "--seq", "512", "--batch", "16",
           "--vocab", "256", "--lr", "6e-4", "--warmup", "100", "--lr-schedule", "cosine",
           "--min-lr", "6e-5", "--weight-decay", "0.1", "--eval-batches", "20"]


def launch(a, args):
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    cmd = [a.mpiexec, "-n", "1", "--bind-to", "none", a.exe, *args]
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                       timeout=a.timeout)
    if p.returncode != 0:
        print(p.stdout[-4000:])
        sys.exit(f"kshard-train failed (rc {p.returncode})")
    return p.stdout


def bench_line(out):
    for line in out.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[len("BENCH "):])
    print(out[-4000:])
    sys.exit("no BENCH line")


def speed(a):
    rows = {}
    for rep in range(a.repeats):
        for size in a.sizes.split(","):
            for recipe in a.recipes.split(","):
                b = bench_line(launch(a, [*SIZES[size], "--steps", str(a.steps), "--recipe", recipe,
                                          "--bench"]))
                print(f"  {size} {recipe} round {rep + 1}: {b['tokens_per_s_median']:.0f} tok/s, "
                      f"peak {b['peak_bytes'] / 2**30:.3f} GiB", flush=True)
                rows.setdefault((size, recipe), []).append(b)
    print()
    print("| size | recipe | tok/s (each round) | median | x bf16 | peak GiB | peak / bf16 |")
    print("|---|---|---|---|---|---|---|")
    for size in a.sizes.split(","):
        base = rows.get((size, "bf16"))
        base_tps = statistics.median(r["tokens_per_s_median"] for r in base) if base else None
        base_peak = max(r["peak_bytes"] for r in base) if base else None
        for recipe in a.recipes.split(","):
            rs = rows[(size, recipe)]
            tps = statistics.median(r["tokens_per_s_median"] for r in rs)
            peak = max(r["peak_bytes"] for r in rs)
            each = " / ".join(f"{r['tokens_per_s_median']:,.0f}" for r in rs)
            ratio = f"{tps / base_tps:.3f}" if base_tps else "-"
            pratio = f"{peak / base_peak:.3f}" if base_peak else "-"
            print(f"| {size} | {recipe} | {each} | {tps:,.0f} | {ratio} | {peak / 2**30:.3f} | "
                  f"{pratio} |")


def quality(a):
    train = os.path.join(a.data, "train.bin")
    val = os.path.join(a.data, "val.bin")
    losses = {}
    for recipe in a.recipes.split(","):
        out = launch(a, [*QUALITY, "--data", train, "--val-data", val, "--steps", str(a.steps),
                         "--eval-every", str(a.eval_every), "--recipe", recipe, "--bench"])
        evals = [(int(m.group(2)), float(m.group(1)))
                 for m in re.finditer(r"eval_loss ([0-9.eE+-]+|nan|inf)\s+step (\d+)", out)]
        if not evals:
            print(out[-4000:])
            sys.exit("no eval_loss line")
        b = bench_line(out)
        losses[recipe] = evals
        print(f"  {recipe}: eval_loss " + ", ".join(f"{l:.4f}@{s}" for s, l in evals) +
              f"; {b['tokens_per_s_median']:.0f} tok/s", flush=True)
    print()
    base = losses.get("bf16", [(0, None)])[-1][1]
    print("| recipe | final eval_loss | vs bf16 |")
    print("|---|---|---|")
    for recipe, ev in losses.items():
        rel = f"{(ev[-1][1] - base) / base * 100:+.2f} %" if base else "-"
        print(f"| {recipe} | {ev[-1][1]:.4f} | {rel} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["speed", "quality"])
    ap.add_argument("--exe", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--recipes", default="bf16,fp8,fp8-current,fp8-delayed,fp8-block")
    ap.add_argument("--sizes", default="large,xl")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--data", help="folder with train.bin and val.bin (prepare_text.sh)")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--timeout", type=float, default=1800)
    a = ap.parse_args()
    if a.mode == "speed":
        a.steps = a.steps or 20
        speed(a)
    else:
        if not a.data:
            sys.exit("quality needs --data DIR (bench/fp8/prepare_text.sh makes one)")
        a.steps = a.steps or 1500
        quality(a)


if __name__ == "__main__":
    main()
