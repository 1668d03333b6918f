#!/usr/bin/env python3
"""Per-kernel time of ONE training step, from an ncu CSV of a kshard-train run.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv \\
        kshard-train ... --steps 2 > ncu.csv
    python3 bench/profile/ncu_step_breakdown.py ncu.csv [--step 2] [--json out.json]

Steps are told apart by the optimizer's update kernels (kshard's FusedAdam: one per unit
per step; PyTorch's fused AdamW: its multi-tensor kernels, so the FSDP2 twin can be read
the same way, `ncu ... python3 bench/fsdp2/fsdp2_twin.py ... --steps 3`): step s is
every kernel after the last update kernel of step s-1 up to the last update kernel of step
s. Kernels are grouped by what the name says they are (cuBLAS GEMM, attention, elementwise,
NCCL, ...) and summed; the sum is the GPU busy time of the step, to set against the step's
wall time that kshard-train prints (the difference is time the GPU waited for the host).
"""
import argparse
import csv
import json
import re
import sys
from collections import defaultdict

# First match wins; patterns are searched in the demangled kernel name.
CATEGORIES = [
    ("NCCL", r"nccl|oneRank"),
    # cuDNN runs only the fused attention here (its SDPA kernels' names carry
    # "sdpa" / "fprop" / "bprop"), so it goes before the GEMM patterns.
    ("attention (fused)", r"flash|Flash|sdpa|fmha|cudnn"),
    ("GEMM (cuBLAS/cuBLASLt)", r"nvjet|cutlass|gemm|Gemm|sm90_xmma|splitKreduce|Gemv"),
    ("FusedAdam update", r"AdamUpdate|adam_update|FusedAdam"),
    # PyTorch's cross-entropy (log-softmax + NLL) before the attention softmax.
    ("cross-entropy", r"cross_entropy|ce_rows|softmax_xent|logsumexp|cunn_SoftMax|nll_loss"),
    ("attention softmax / mask", r"softmax|Softmax|causal"),
    ("LayerNorm", r"layer_norm|LayerNorm|ln_forward|ln_backward"),
    ("GELU", r"gelu|Gelu"),
    ("bias add", r"add_row_vector"),
    ("residual add", r"detail::add<|kshard::detail::add|AddOp"),
    ("embedding", r"embedding|Embedding"),
    ("gradient reduce / stats", r"accumulate|grad_stats|reduce_scatter|sum_grad|stats_kernel|stats_total"),
    ("fp8 amax / cast (+transpose, dbias)", r"fp8_amax|fp8_cast|fp8_dbias|CastTiles|CastStream|CastBlockTiles|add_column_partials"),
    ("casts", r"cast|convert|dequant|quant|FromF32|ToF32|CastOp"),
    ("fills", r"fill|ViewFill|zero"),
]


def category(name):
    for cat, pat in CATEGORIES:
        if re.search(pat, name):
            return cat
    return "other"


def read(path):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # skip ncu's own log lines
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0,
                 "msecond": 1.0}.get(unit, 1e-6)
        rows.append((int(r["ID"]), r["Kernel Name"], v * scale))
    rows.sort()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--step", type=int, default=2, help="which step (1-based)")
    ap.add_argument("--json", help="write the breakdown here")
    ap.add_argument("--top", type=int, default=12, help="longest kernels to list")
    ap.add_argument("--names", type=int, default=0,
                    help="also list the N kernel names with the most time summed over the step")
    a = ap.parse_args()
    rows = read(a.csv)
    if not rows:
        sys.exit("no gpu__time_duration.sum rows in " + a.csv)
    adam = [i for i, (_, n, _) in enumerate(rows) if category(n) == "FusedAdam update"]
    # Boundaries: an update kernel followed by a non-update kernel ends a step.
    ends = [i for i in adam if i + 1 >= len(rows) or category(rows[i + 1][1]) != "FusedAdam update"]
    if len(ends) < a.step:
        sys.exit(f"found {len(ends)} steps (optimizer update runs), asked for step {a.step}")
    lo = ends[a.step - 2] + 1 if a.step >= 2 else 0
    hi = ends[a.step - 1] + 1
    step = rows[lo:hi]
    by_cat = defaultdict(lambda: [0.0, 0])
    for _, n, ms in step:
        c = by_cat[category(n)]
        c[0] += ms
        c[1] += 1
    total = sum(ms for _, _, ms in step)
    print(f"step {a.step}: {len(step)} kernels, {total:.3f} ms of kernel time")
    print(f"{'category':32s} {'ms':>9s} {'share':>7s} {'kernels':>8s}")
    for cat, (ms, k) in sorted(by_cat.items(), key=lambda kv: -kv[1][0]):
        print(f"{cat:32s} {ms:9.3f} {100 * ms / total:6.1f}% {k:8d}")
    print("longest kernels:")
    for _, n, ms in sorted(step, key=lambda r: -r[2])[: a.top]:
        print(f"  {ms:8.3f} ms  {n[:110]}")
    if a.names:
        by_name = defaultdict(lambda: [0.0, 0])
        for _, n, ms in step:
            by_name[n[:110]][0] += ms
            by_name[n[:110]][1] += 1
        print("kernel names by summed time:")
        for n, (ms, k) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[: a.names]:
            print(f"  {ms:8.3f} ms  {k:5d}x  {n}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"step": a.step, "kernels": len(step), "total_ms": total,
                       "by_category": {c: {"ms": v[0], "kernels": v[1]} for c, v in by_cat.items()}},
                      f, indent=1)


if __name__ == "__main__":
    main()
