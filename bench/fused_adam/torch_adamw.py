#!/usr/bin/env python3
"""torch.optim.AdamW(fused=True) on CUDA: GB/s at 28 B/param, next to a copy.

The same accounting as kshard-bench-fused-adam: fp32 params, grads and both
moments; one step reads param, grad, exp_avg, exp_avg_sq and writes param,
exp_avg, exp_avg_sq = 28 B/param. A device copy of 14 B/param (read + write =
28 B/param) is timed in the same run, interleaved, for the ratio. Each figure
is the median of --reps timed repetitions (CUDA events) after --warmup.

    python3 torch_adamw.py [--params 2^28] [--reps 20] [--warmup 3] [--tensors 1]

--tensors splits the parameters into that many equal tensors (the fused
kernel's multi-tensor path, as a model with many parameters would use it).
"""
import argparse
import statistics
import sys

import torch


def count(s: str) -> int:
    if "^" in s:
        base, exp = s.split("^")
        return int(base) ** int(exp)
    return int(s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=count, default=2**28, help="number of fp32 parameters (N or 2^K)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tensors", type=int, default=1)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_adamw.py: CUDA is not available", file=sys.stderr)
        return 2
    n, k = args.params, max(1, args.tensors)
    dev = torch.device("cuda")
    torch.manual_seed(0)

    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    params = [torch.nn.Parameter(torch.empty(s, device=dev).uniform_(-1, 1)) for s in sizes]
    for p in params:
        p.grad = torch.empty_like(p).uniform_(-1e-2, 1e-2)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=args.weight_decay, fused=True)
    opt.step()  # allocates exp_avg / exp_avg_sq (not timed)

    copy_elems = n // 2 * 7  # 14 B/param of fp32
    src = torch.empty(copy_elems, device=dev).uniform_(-1, 1)
    dst = torch.empty_like(src)

    def timed(fn) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3

    t_copy, t_step = [], []
    for r in range(args.warmup + args.reps):
        tc = timed(lambda: dst.copy_(src))
        ts = timed(opt.step)
        if r >= args.warmup:
            t_copy.append(tc)
            t_step.append(ts)
    c, s = statistics.median(t_copy), statistics.median(t_step)
    copy_bw = 2 * 4 * copy_elems / c / 1e9
    adam_bw = 28 * n / s / 1e9
    name = torch.cuda.get_device_name()
    print(f"torch_adamw.py: {name}, torch {torch.__version__}, {n} params in {k} tensor(s), "
          f"{args.reps} reps (median) after {args.warmup} warm-ups")
    print(f"  {'copy (14 B/param)':34s} {c * 1e3:9.3f} ms  {copy_bw:8.2f} GB/s")
    print(f"  {'AdamW(fused=True).step()':34s} {s * 1e3:9.3f} ms  {adam_bw:8.2f} GB/s  "
          f"ratio {adam_bw / copy_bw:.3f}  (28 B/param)")
    print(f"adam_over_copy {adam_bw / copy_bw:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
