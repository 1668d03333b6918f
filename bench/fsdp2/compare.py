#!/usr/bin/env python3
"""kshard-train vs its PyTorch FSDP2 twin, alternating, in ONE command (issue 6).

For each size and each recipe it launches kshard-train --bench and
fsdp2_twin.py --bench (same model, data, optimizer and dtypes; see the twin's
docstring) alternately, --repeats times each (kshard, twin, kshard, twin, ...
so drift and noise show), parses their BENCH lines and prints one table:

  tok/s      tokens_per_s_median of each launch (median over steps 2..N, the
             same rule on both sides), averaged over the repeats; "spread" is
             (max - min) / mean over the repeats of both sides, the noise
  ratio      kshard / FSDP2 tokens/s (> 1: kshard faster)
  MFU        (6 * params + 12 * layers * width * seq) * tokens/s / peak, the
             PaLM / nanoGPT convention: params = ALL parameters (embedding
             tables and head included, as issue 6 states it), attention
             12 * L * d * seq FLOPs per token (forward + backward of QK^T and
             PV, counted without the causal half). peak = --peak-tflops
             (989: the H200/H100 SXM bf16 dense tensor-core peak). The fp32
             rows use the SAME 989 denominator (fp32 has no such peak; the
             figure only compares the two sides), marked "(vs bf16 peak)"
  peak GiB   peak memory per rank: kshard's peak_bytes (Kokkos memory
             tracker, max over steps) and the twin's
             torch.cuda.max_memory_allocated (over the steps), the max over
             the repeats; ratio kshard / FSDP2 (<= 1: kshard uses less)
  loss       last loss of each (both fall from ~ln(vocab) towards 0.5 nats)

Sizes (width, heads, layers, seq, batch per rank, vocab):
  small   256,  4, 4,  128, 32,   512
  medium 1024, 16, 8,  512,  8,  8192
  large  2048, 16, 8, 1024,  4, 32000
  tiny     64,  4, 2,   32,  8,    64   (a smoke test on a host build / CPU)
or a custom size written WxHxLxSxBxV, e.g. 128x4x2x64x4x256.

On the GPU machine (one H200 or H100; as root; about 5-6 minutes with the
defaults: 3 sizes x 2 recipes x 2 repeats x 2 sides = 24 launches of 20 steps):

  python3 bench/fsdp2/compare.py --exe build/cuda/examples/train/kshard-train \\
      --out $OUT/fsdp2.json

(if kshard-train's shared libraries travelled beside it, export
LD_LIBRARY_PATH first.) kshard-train is launched as `mpiexec -n 1 --bind-to
none EXE ...` with OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 set; --mpiexec '' runs
it directly (MPI singleton). The twin runs as `python3 fsdp2_twin.py ...`,
world size 1, NCCL (gloo with --device cpu).

Locally, without a GPU (host build; a CPU torch):
  python3 bench/fsdp2/compare.py --exe build/host/examples/train/kshard-train \\
      --sizes tiny --device cpu --steps 10 --repeats 1 --out /tmp/fsdp2.json

A benchmark, not a test. A launch that fails (non-zero exit, no BENCH line,
or a timeout) prints the tail of its output and the others go on; the exit
code is 1 if any launch failed. --out is rewritten after every launch, so an
interrupted run keeps what it measured.
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# name: (width, heads, layers, seq, batch, vocab)
SIZES = {
    "small": (256, 4, 4, 128, 32, 512),
    "medium": (1024, 16, 8, 512, 8, 8192),
    "large": (2048, 16, 8, 1024, 4, 32000),
    "tiny": (64, 4, 2, 32, 8, 64),
}
KEYS = ("width", "heads", "layers", "seq", "batch", "vocab")
IMPLS = ("kshard", "fsdp2")


def parse_size(token):
    if token in SIZES:
        return token, dict(zip(KEYS, SIZES[token]))
    parts = token.lower().split("x")
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) != 6 or min(vals) < 1:
        raise argparse.ArgumentTypeError(
            f"size '{token}' is neither one of {', '.join(SIZES)} nor WxHxLxSxBxV")
    return token, dict(zip(KEYS, vals))


def flops_per_token(params, size):
    return 6.0 * params + 12.0 * size["layers"] * size["width"] * size["seq"]


def model_args(size, recipe, steps):
    args = []
    for k in KEYS:
        args += [f"--{k}", str(size[k])]
    return args + ["--recipe", recipe, "--steps", str(steps), "--bench"]


def command(a, impl, size, recipe):
    margs = model_args(size, recipe, a.steps)
    if impl == "kshard":
        launcher = [a.mpiexec, "-n", "1", "--bind-to", "none"] if a.mpiexec else []
        return launcher + [a.exe] + margs + shlex.split(a.kshard_extra)
    return ([a.python, os.path.join(HERE, "fsdp2_twin.py")] + margs +
            ["--device", a.device] + shlex.split(a.torch_extra))


def launch(a, impl, size, recipe):
    cmd = command(a, impl, size, recipe)
    env = dict(os.environ)
    if impl == "kshard":
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    text = " ".join(shlex.quote(c) for c in cmd)
    print(f"$ {text}", flush=True)
    run = {"impl": impl, "recipe": recipe, "size": dict(size), "cmd": text}
    t0 = time.perf_counter()
    if a.dry_run:
        return run
    try:
        # A session of its own, so that a timeout ends the launcher and
        # everything it started (mpiexec's ranks), not the launcher alone.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=a.timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, _ = p.communicate()
            rc = None
    except OSError as e:
        out, rc = f"could not start: {e}", None
    run["wall_s"] = round(time.perf_counter() - t0, 2)
    run["rc"] = rc
    bench = None
    for line in out.splitlines():
        if line.startswith("BENCH "):
            try:
                bench = json.loads(line[len("BENCH "):])
            except json.JSONDecodeError:
                pass
    if rc == 0 and bench is not None:
        run["bench"] = bench
        print(f"  {impl:6s} {recipe:4s}: {bench['tokens_per_s_median']:12.0f} tok/s (median), "
              f"peak {bench['peak_bytes'] / 2**30:.3f} GiB, loss {bench['first_loss']:.3f} -> "
              f"{bench['last_loss']:.3f}, {run['wall_s']:.1f} s", flush=True)
    else:
        why = ("timed out after %g s" % a.timeout if rc is None and "could not start" not in out
               else f"exit code {rc}" if rc not in (0, None) else
               "no BENCH line" if rc == 0 else out.strip())
        tail = "\n".join(out.splitlines()[-a.tail:])
        run["error"] = why
        run["output_tail"] = tail
        print(f"  FAILED ({impl}, {recipe}): {why}; last lines:\n" +
              "\n".join("    | " + l for l in tail.splitlines()), flush=True)
    return run


def summarize(name, size, recipe, runs, peak_flops):
    row = {"size": name, **size, "recipe": recipe}
    for impl in IMPLS:
        ok = [r["bench"] for r in runs if r["impl"] == impl and "bench" in r]
        row[impl] = None
        if not ok:
            continue
        t = [b["tokens_per_s_median"] for b in ok]
        mean = sum(t) / len(t)
        params = ok[0]["params"]
        row[impl] = {
            "runs": len(ok), "tokens_per_s": mean, "tokens_per_s_runs": t,
            "spread": (max(t) - min(t)) / mean if mean > 0 else 0.0,
            "params": params,
            "mfu": flops_per_token(params, size) * mean / peak_flops,
            "peak_bytes": max(b["peak_bytes"] for b in ok),
            "first_loss": ok[-1]["first_loss"], "last_loss": ok[-1]["last_loss"],
        }
    k, f = row["kshard"], row["fsdp2"]
    row["ratio"] = k["tokens_per_s"] / f["tokens_per_s"] if k and f and f["tokens_per_s"] else None
    row["peak_ratio"] = k["peak_bytes"] / f["peak_bytes"] if k and f and f["peak_bytes"] else None
    row["params_match"] = (k["params"] == f["params"]) if k and f else None
    return row


def count(n):
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def fmt_table(rows, peak_tflops):
    hdr = ["size", "recipe", "params", "kshard tok/s", "FSDP2 tok/s", "ratio", "spread",
           "kshard MFU", "FSDP2 MFU", "kshard GiB", "FSDP2 GiB", "mem ratio",
           "last loss k / F"]
    lines = []
    for r in rows:
        k, f = r["kshard"], r["fsdp2"]
        fp32 = r["recipe"] == "fp32"

        def tps(x):
            return f"{x['tokens_per_s']:,.0f}" if x else "FAILED"

        def mfu(x):
            return f"{100 * x['mfu']:.1f}%" + ("*" if fp32 else "") if x else "-"

        def gib(x):
            return f"{x['peak_bytes'] / 2**30:.3f}" if x else "-"

        params = (k or f or {}).get("params")
        ptxt = "-" if params is None else count(params)
        if r["params_match"] is False:
            ptxt += f" (!= {count(f['params'])})"
        spread = max((x["spread"] for x in (k, f) if x), default=None)
        loss = " / ".join(f"{x['last_loss']:.3f}" if x else "-" for x in (k, f))
        lines.append([
            r["size"], r["recipe"], ptxt, tps(k), tps(f),
            f"{r['ratio']:.2f}x" if r["ratio"] else "-",
            f"{100 * spread:.0f}%" if spread is not None else "-",
            mfu(k), mfu(f), gib(k), gib(f),
            f"{r['peak_ratio']:.2f}" if r["peak_ratio"] else "-", loss])
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(hdr)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(hdr, widths)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += ["| " + " | ".join(c.ljust(w) for c, w in zip(l, widths)) + " |" for l in lines]
    out.append(f"MFU = (6 x params + 12 x layers x width x seq) x tokens/s / {peak_tflops:g} "
               f"TFLOP/s (all params; causal attention counted in full).")
    out.append(f"* fp32 rows: against the same {peak_tflops:g} TFLOP/s bf16 dense peak "
               "(a comparison between the sides, not an fp32 utilisation).")
    out.append("tok/s: mean over the repeats of each launch's median over steps 2..N; spread: "
               "the larger (max-min)/mean of the two sides; GiB: peak per rank (max over "
               "repeats); ratios kshard / FSDP2.")
    return "\n".join(out)


def write_out(a, runs, rows, started, done):
    if not a.out:
        return
    d = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(d, exist_ok=True)
    doc = {"complete": done, "started": started, "argv": sys.argv,
           "config": {"sizes": [n for n, _ in a.sizes], "recipes": a.recipes, "steps": a.steps,
                      "repeats": a.repeats, "exe": a.exe, "mpiexec": a.mpiexec,
                      "python": a.python, "device": a.device, "kshard_extra": a.kshard_extra,
                      "torch_extra": a.torch_extra, "peak_tflops": a.peak_tflops,
                      "mfu_flops_per_token": "6*params + 12*layers*width*seq"},
           "rows": rows, "runs": runs}
    tmp = a.out + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, a.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--exe", required=True, help="kshard-train executable")
    ap.add_argument("--sizes", default="small,medium,large",
                    help="comma-separated: small, medium, large, tiny or WxHxLxSxBxV")
    ap.add_argument("--recipes", default="fp32,bf16", help="comma-separated: fp32, bf16")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps per launch")
    ap.add_argument("--repeats", type=int, default=2, help="launches of each side per cell")
    ap.add_argument("--mpiexec", default="mpiexec",
                    help="launcher for kshard-train ('' runs it directly)")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="the twin's device (cpu: gloo, for a smoke test)")
    ap.add_argument("--kshard-extra", default="", help="extra kshard-train options (one string)")
    ap.add_argument("--torch-extra", default="", help="extra fsdp2_twin.py options (one string)")
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="MFU denominator in TFLOP/s (989: H200/H100 SXM bf16 dense)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per launch")
    ap.add_argument("--tail", type=int, default=25, help="output lines shown for a failure")
    ap.add_argument("--out", help="write the full results here as JSON")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    a = ap.parse_args()
    try:
        a.sizes = [parse_size(s.strip()) for s in a.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    a.recipes = [r.strip() for r in a.recipes.split(",") if r.strip()]
    for r in a.recipes:
        if r not in ("fp32", "bf16"):
            ap.error(f"recipe '{r}': expected fp32 or bf16 (the twin has no fp16/fp8)")
    if a.steps < 2 or a.repeats < 1 or not a.sizes or not a.recipes:
        ap.error("need --steps >= 2, --repeats >= 1, at least one size and one recipe")
    if not a.dry_run and not os.path.exists(a.exe):
        print(f"compare.py: warning: --exe {a.exe} does not exist; its launches will fail",
              file=sys.stderr)

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    runs, rows = [], []
    failed = 0
    t_all = time.perf_counter()
    for name, size in a.sizes:
        for recipe in a.recipes:
            dims = 'x'.join(str(size[k]) for k in KEYS)
            label = dims if name == dims else f"{name} {dims}"
            print(f"\n== {label} (width x heads x layers x seq x batch x vocab), {recipe}",
                  flush=True)
            cell = []
            for rep in range(a.repeats):
                for impl in IMPLS:
                    r = launch(a, impl, size, recipe)
                    r["size_name"], r["repeat"] = name, rep
                    cell.append(r)
                    runs.append(r)
                    failed += 1 if "error" in r else 0
                    write_out(a, runs, rows, started, False)
            if not a.dry_run:
                rows.append(summarize(name, size, recipe, cell, a.peak_tflops * 1e12))
                write_out(a, runs, rows, started, False)
    if a.dry_run:
        return 0
    write_out(a, runs, rows, started, True)
    print(f"\nkshard-train ({a.exe}) vs PyTorch FSDP2 twin, 1 rank, {a.steps} steps, "
          f"{a.repeats} repeat(s), {time.perf_counter() - t_all:.0f} s in all\n")
    print(fmt_table(rows, a.peak_tflops))
    for r in rows:
        if r["params_match"] is False:
            print(f"WARNING: {r['size']}: kshard has {r['kshard']['params']} params, the twin "
                  f"{r['fsdp2']['params']}: the models differ")
    if a.out:
        print(f"\nresults: {a.out}")
    if failed:
        print(f"\n{failed} launch(es) failed (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
