#!/usr/bin/env python3
"""kshard-train vs its PyTorch twin, alternating, in ONE command (issues 6, 20).

For each size and each recipe it launches kshard-train --bench and
fsdp2_twin.py --bench (same model, data, optimizer and dtypes; see the twin's
docstring) alternately, --repeats times each, one round = kshard then each
--torch-modes side (kshard, eager, compile, kshard, eager, compile, ... so
drift and noise show), parses their BENCH lines and prints one table.

Torch sides (--torch-modes, comma-separated; default fsdp2 alone, issue 6's
table), each the twin with --torch-mode M:
  fsdp2        FSDP2 fully_shard, world size 1
  eager        one GPU, no FSDP (bf16: autocast, f32 master weights)
  compile      eager + torch.compile of the model's forward with the loss
               inside the compiled region
  compile-max  compile with mode="max-autotune-no-cudagraphs"
The compile sides compile in untimed warm-up steps (weights restored after);
that time is excluded from tok/s and stated in its own column.

  tok/s      tokens_per_s_median of each launch (median over steps 2..N, the
             same rule on every side), averaged over the repeats; "spread" is
             the largest (max - min) / mean over the repeats of any side, the
             noise
  k/M        kshard / side M tokens/s (> 1: kshard faster); k/best against
             the fastest torch side of the row (shown when there are several)
  compile s  the compile side's warm-up wall time (dynamo + inductor, and
             autotuning for compile-max, plus the warm-up steps), mean over
             the repeats; excluded from tok/s. inductor's on-disk cache may
             make a repeat launch compile faster (the JSON keeps each launch's)
  MFU        under two conventions, both (F * tokens/s) / peak:
             all-params     F = 6 * params + 12 * layers * width * seq, params
                            = ALL parameters (embedding table, gpt2's
                            position table and the head included; issue
                            6's figure)
             matmul-params  F = 6 * matmul_params + 12 * layers * width * seq,
                            matmul_params = the Linear weights, not the
                            embedding/position tables, biases or norms
                            (PaLM's convention); hd = width / heads:
               gpt2   L * (4 d^2 + 2 d ffn) + d * vocab  (qkv, proj, fc1,
                      fc2, head; = 12 L d^2 + d vocab at ffn = 4d)
               llama  L * (d * (d + 2 kv hd) + d^2 + 3 d ffn) + d * vocab
                      (qkv with kv key/value heads, proj, gate_up = 2 d ffn,
                      down = d ffn, head); a tied head counts too (still a
                      d x vocab GEMM)
             attention 12 * L * d * seq FLOPs per token (forward + backward of
             QK^T and PV, counted without the causal half). peak =
             --peak-tflops (989: the H200/H100 SXM bf16 dense tensor-core
             peak). The fp32 rows use the SAME 989 denominator (fp32 has no
             such peak; the figure only compares the sides), marked "*".
             kshard's matmul_params is computed here from the size; the
             twin's BENCH reports its own count, and a mismatch is flagged
  peak GiB   peak memory per rank: kshard's peak_bytes (Kokkos memory
             tracker, max over steps) and the twin's
             torch.cuda.max_memory_allocated (over the timed steps), the max
             over the repeats; mem k/best (and k/compile when compile runs):
             kshard / that side (<= 1: kshard uses less)
  loss       last loss of each (all fall from ~ln(vocab) towards 0.5 nats)

Architecture (--arch, passed to both sides with the same option names as
kshard-train's): gpt2 (default; LayerNorm, GELU MLP, learned positions,
biases) or llama (RMSNorm, SwiGLU, rotary embeddings, grouped-query
attention, no biases; the twin's F.rms_norm and SDPA with enable_gqa).
--kv-heads, --ffn-hidden, --rope-theta, --norm-eps and --tie-embeddings go
to both sides as given; for llama --kv-heads and --ffn-hidden are always
passed, resolved per size: the size's llama default below, else --heads and
kshard-train's rule (8 d / 3 rounded up to a multiple of 256). gpt2 commands
carry none of them unless given.

Sizes (width, heads, layers, seq, batch per rank, vocab):
  small   256,  4, 4,  128, 32,   512
  medium 1024, 16, 8,  512,  8,  8192
  large  2048, 16, 8, 1024,  4, 32000
  xl     4096, 32, 8, 1024,  4, 32000   (not in the default --sizes)
  tiny     64,  4, 2,   32,  8,    64   (a smoke test on a host build / CPU)
or a custom size written WxHxLxSxBxV, e.g. 128x4x2x64x4x256.
With --arch llama, large is issue 22's Llama-style large: --kv-heads 4
--ffn-hidden 5632 unless given; the other sizes keep kv-heads = heads and
ffn = 8 d / 3 rounded up to 256 (xl: 11008).

On the GPU machine (one H200 or H100; as root; about 5-6 minutes with the
defaults: 3 sizes x 2 recipes x 2 repeats x 2 sides = 24 launches of 20 steps):

  python3 bench/fsdp2/compare.py --exe build/cuda/examples/train/kshard-train \\
      --out $OUT/fsdp2.json

The anchor of issue 20 (kshard against the best PyTorch can do on one GPU):

  python3 bench/fsdp2/compare.py --exe build/cuda/examples/train/kshard-train \\
      --sizes large,xl --recipes bf16 --torch-modes eager,compile,compile-max \\
      --out $OUT/anchor.json

The Llama-shaped anchor of issue 22 (d2048, 16 heads, 4 kv heads, 8 layers,
ffn 5632, T1024, B4, V32000, bf16):

  python3 bench/fsdp2/compare.py --exe build/cuda/examples/train/kshard-train \\
      --arch llama --sizes large --recipes bf16 --torch-modes eager,compile \\
      --out $OUT/llama.json

Run time: the launches without compile cost what they did (seconds each at
large and xl); each compile launch adds its compile, and a cold compile-max
launch autotunes every matmul shape of forward and backward, expected to take
minutes at large and xl (an estimate, not a measurement). The default
--timeout is per side: 300 s, 600 s for compile, 900 s for compile-max; a
--timeout given applies to every launch. Split a long run by sizes or modes
where one command has a wall-clock limit.

(if kshard-train's shared libraries travelled beside it, export
LD_LIBRARY_PATH first.) kshard-train is launched as `mpiexec -n 1 --bind-to
none EXE ...` with OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 set; --mpiexec '' runs
it directly (MPI singleton); --mpiexec may carry options of its own
("mpiexec --oversubscribe"). The twin runs as `python3 fsdp2_twin.py
--torch-mode M ...`, world size 1 (fsdp2: NCCL, gloo with --device cpu; the
other modes no process group).

Locally, without a GPU (host build; a CPU torch):
  python3 bench/fsdp2/compare.py --exe build/host/examples/train/kshard-train \\
      --sizes tiny --device cpu --steps 10 --repeats 1 --torch-modes fsdp2,eager \\
      --out /tmp/fsdp2.json

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
    "xl": (4096, 32, 8, 1024, 4, 32000),
    "tiny": (64, 4, 2, 32, 8, 64),
}
KEYS = ("width", "heads", "layers", "seq", "batch", "vocab")
# The twin's --torch-mode values; each is a side of its own, named by its mode
# (so the default run's rows keep issue 6's "fsdp2" key).
TORCH_MODES = ("fsdp2", "eager", "compile", "compile-max")
COMPILE_MODES = ("compile", "compile-max")
LABEL = {"kshard": "kshard", "fsdp2": "FSDP2", "eager": "eager", "compile": "compile",
         "compile-max": "compile-max"}
# Seconds per launch when --timeout is not given: a cold compile-max autotunes
# every matmul shape of forward and backward, which takes minutes.
DEFAULT_TIMEOUT = {"compile": 600.0, "compile-max": 900.0}
DEFAULT_TIMEOUT_OTHER = 300.0


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


# --arch llama's defaults per named size, where they differ from kshard-train's
# (--kv-heads 0 = heads, --ffn-hidden 0 = 8d/3 rounded up to 256): issue 22's
# Llama-style large has 4 key/value heads. --kv-heads / --ffn-hidden override.
LLAMA_SIZE_DEFAULTS = {"large": {"kv_heads": 4, "ffn_hidden": 5632}}


def default_ffn(arch, width):
    """kshard-train's --ffn-hidden 0 (examples/train/train.cpp): 4d for gpt2,
    Llama's 8d/3 rounded up to a multiple of 256 for llama."""
    return 4 * width if arch == "gpt2" else (8 * width // 3 + 255) // 256 * 256


def resolve_arch(a, name, size):
    """The size's block shape: arch, kv_heads (llama; gpt2 None), ffn_hidden,
    tie_embeddings added to the size dict (kept in the JSON rows)."""
    dflt = LLAMA_SIZE_DEFAULTS.get(name, {}) if a.arch == "llama" else {}
    kv = None
    if a.arch == "llama":
        kv = a.kv_heads or dflt.get("kv_heads") or size["heads"]
        if size["heads"] % kv:
            raise argparse.ArgumentTypeError(
                f"size '{name}': --kv-heads {kv} does not divide heads {size['heads']}")
        if (size["width"] // size["heads"]) % 2:
            raise argparse.ArgumentTypeError(
                f"size '{name}': head dim {size['width'] // size['heads']} is odd (llama's "
                "rotary embeddings need an even one)")
    ffn = a.ffn_hidden or dflt.get("ffn_hidden") or default_ffn(a.arch, size["width"])
    return {**size, "arch": a.arch, "kv_heads": kv, "ffn_hidden": ffn,
            "tie_embeddings": a.tie_embeddings}


def matmul_params(size):
    """The Linear weights of kshard-train's model (the twin's nn.Linear weights;
    a tied head counted too: it is still a d x vocab GEMM), hd = d / heads:
      gpt2   per layer qkv d x 3d, proj d x d, fc1 d x ff, fc2 ff x d
             = 4 d^2 + 2 d ff (12 d^2 at the default ff = 4d)
             matmul_params = L (4 d^2 + 2 d ff) + d vocab
      llama  per layer qkv d x (d + 2 kv hd) (q, then k and v of kv heads),
             proj d x d, gate_up d x 2 ffn and down ffn x d (3 d ffn)
             matmul_params = L (d (d + 2 kv hd) + d^2 + 3 d ffn) + d vocab
    No embedding/position tables, biases or norms."""
    d, L, ffn = size["width"], size["layers"], size.get("ffn_hidden") or 4 * size["width"]
    if size.get("arch", "gpt2") == "llama":
        hd = d // size["heads"]
        return L * (d * (d + 2 * size["kv_heads"] * hd) + d * d + 3 * d * ffn) + d * size["vocab"]
    return L * (4 * d * d + 2 * d * ffn) + d * size["vocab"]


def arch_text(size):
    """E.g. "llama (kv-heads 4, ffn 5632)" or "gpt2 (ffn 4096)"."""
    if size.get("arch", "gpt2") == "llama":
        t = f"llama (kv-heads {size['kv_heads']}, ffn {size['ffn_hidden']}"
    else:
        t = f"gpt2 (ffn {size.get('ffn_hidden') or 4 * size['width']}"
    return t + (", tied embeddings)" if size.get("tie_embeddings") else ")")


def flops_per_token(params, size):
    """6 FLOPs per parameter per token (forward + backward) plus attention's
    12 * L * d * seq; params is all parameters or the matmul ones (the two MFU
    conventions)."""
    return 6.0 * params + 12.0 * size["layers"] * size["width"] * size["seq"]


def model_args(a, size, recipe, steps):
    """The options kshard-train and the twin share, spelled the same for both."""
    args = []
    for k in KEYS:
        args += [f"--{k}", str(size[k])]
    if a.arch == "llama":
        # Always explicit, so both sides build the same model whatever their
        # defaults.
        args += ["--arch", "llama", "--kv-heads", str(size["kv_heads"]),
                 "--ffn-hidden", str(size["ffn_hidden"])]
    elif a.ffn_hidden:  # gpt2 commands stay as they were unless asked
        args += ["--ffn-hidden", str(size["ffn_hidden"])]
    if a.rope_theta is not None:
        args += ["--rope-theta", f"{a.rope_theta:g}"]
    if a.norm_eps is not None:
        args += ["--norm-eps", f"{a.norm_eps:g}"]
    if a.tie_embeddings:
        args += ["--tie-embeddings"]
    return args + ["--recipe", recipe, "--steps", str(steps), "--bench"]


def launch_timeout(a, impl):
    if a.timeout is not None:
        return a.timeout
    return DEFAULT_TIMEOUT.get(impl, DEFAULT_TIMEOUT_OTHER)


def command(a, impl, size, recipe):
    margs = model_args(a, size, recipe, a.steps)
    if impl == "kshard":
        # --mpiexec may carry options of its own ("mpiexec --oversubscribe").
        launcher = shlex.split(a.mpiexec) + ["-n", "1", "--bind-to", "none"] if a.mpiexec else []
        return launcher + [a.exe] + margs + shlex.split(a.kshard_extra)
    return ([a.python, os.path.join(HERE, "fsdp2_twin.py"), "--torch-mode", impl] + margs +
            ["--device", a.device] + shlex.split(a.torch_extra))


def launch(a, impl, size, recipe):
    cmd = command(a, impl, size, recipe)
    timeout = launch_timeout(a, impl)
    env = dict(os.environ)
    if impl == "kshard":
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    text = " ".join(shlex.quote(c) for c in cmd)
    print(f"$ {text}", flush=True)
    run = {"impl": impl, "recipe": recipe, "size": dict(size), "cmd": text, "timeout_s": timeout}
    t0 = time.perf_counter()
    if a.dry_run:
        return run
    try:
        # A session of its own, so that a timeout ends the launcher and
        # everything it started (mpiexec's ranks), not the launcher alone.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout)
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
        comp = (f", compile {bench['compile_s']:.1f} s (excluded)"
                if bench.get("warmup_steps") else "")
        print(f"  {impl:11s} {recipe:4s}: {bench['tokens_per_s_median']:12.0f} tok/s (median), "
              f"peak {bench['peak_bytes'] / 2**30:.3f} GiB, loss {bench['first_loss']:.3f} -> "
              f"{bench['last_loss']:.3f}{comp}, {run['wall_s']:.1f} s", flush=True)
    else:
        why = ("timed out after %g s" % timeout if rc is None and "could not start" not in out
               else f"exit code {rc}" if rc not in (0, None) else
               "no BENCH line" if rc == 0 else out.strip())
        tail = "\n".join(out.splitlines()[-a.tail:])
        run["error"] = why
        run["output_tail"] = tail
        print(f"  FAILED ({impl}, {recipe}): {why}; last lines:\n" +
              "\n".join("    | " + l for l in tail.splitlines()), flush=True)
    return run


def summarize(name, size, recipe, runs, peak_flops, modes=("fsdp2",)):
    """One table row: per side (kshard and each torch mode) the means over its
    successful launches, then kshard against each mode and against the best."""
    mm_formula = matmul_params(size)
    row = {"size": name, **size, "recipe": recipe, "modes": list(modes),
           "matmul_params": mm_formula}
    for impl in ("kshard",) + tuple(modes):
        ok = [r["bench"] for r in runs if r["impl"] == impl and "bench" in r]
        row[impl] = None
        if not ok:
            continue
        t = [b["tokens_per_s_median"] for b in ok]
        mean = sum(t) / len(t)
        params = ok[0]["params"]
        # kshard's BENCH has no matmul count: the formula is its count. The
        # twin counts its nn.Linear weights itself (an older twin did not).
        mm_reported = ok[0].get("matmul_params")
        mm = mm_reported if mm_reported is not None else mm_formula
        side = {
            "runs": len(ok), "tokens_per_s": mean, "tokens_per_s_runs": t,
            "spread": (max(t) - min(t)) / mean if mean > 0 else 0.0,
            "params": params, "matmul_params": mm, "matmul_params_reported": mm_reported,
            "mfu": flops_per_token(params, size) * mean / peak_flops,
            "mfu_matmul": flops_per_token(mm, size) * mean / peak_flops,
            "peak_bytes": max(b["peak_bytes"] for b in ok),
            "first_loss": ok[-1]["first_loss"], "last_loss": ok[-1]["last_loss"],
        }
        if impl in COMPILE_MODES:
            c = [b.get("compile_s", 0.0) for b in ok]
            rc = [b.get("recompiles_timed") for b in ok]
            side["compile_s"] = sum(c) / len(c)
            side["compile_s_runs"] = c
            side["recompiles_timed"] = max((x for x in rc if x is not None), default=None)
        row[impl] = side

    k = row["kshard"]

    def ratio(num, den, key):
        return num[key] / den[key] if num and den and den[key] else None

    row["ratios"] = {m: ratio(k, row[m], "tokens_per_s") for m in modes}
    row["peak_ratios"] = {m: ratio(k, row[m], "peak_bytes") for m in modes}
    ran = [m for m in modes if row[m]]
    best = max(ran, key=lambda m: row[m]["tokens_per_s"]) if ran else None
    row["best"] = best
    # "ratio" and "peak_ratio" are kshard against the best mode: with the
    # default modes (fsdp2 alone) they mean what issue 6's rows meant.
    row["ratio"] = row["ratios"][best] if best else None
    row["peak_ratio"] = row["peak_ratios"][best] if best else None
    row["peak_ratio_compile"] = row["peak_ratios"].get("compile")
    twins = [row[m] for m in ran]
    row["params_match"] = all(t["params"] == k["params"] for t in twins) if k and twins else None
    reported = [t["matmul_params_reported"] for t in twins
                if t["matmul_params_reported"] is not None]
    row["matmul_match"] = all(x == mm_formula for x in reported) if reported else None
    return row


def count(n):
    return (f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else
            f"{n / 1e3:.1f}k")


def fmt_table(rows, peak_tflops):
    modes = list(rows[0].get("modes", ["fsdp2"])) if rows else ["fsdp2"]
    several = len(modes) > 1
    comp = [m for m in modes if m in COMPILE_MODES]
    vs = "best" if several else LABEL[modes[0]]  # whom the summary columns compare with
    hdr = (["size", "recipe", "params all / matmul", "kshard tok/s"] +
           [f"{LABEL[m]} tok/s" for m in modes] +
           [f"k/{LABEL[m]}" for m in modes] + (["k/best"] if several else []) +
           ["spread"] + [f"compile s ({LABEL[m]})" for m in comp] +
           ["kshard GiB"] + [f"{LABEL[m]} GiB" for m in modes] +
           [f"mem k/{vs}"] + (["mem k/compile"] if several and "compile" in modes else []) +
           [f"MFU all-params k / {vs}", f"MFU matmul-params k / {vs}",
            "last loss k / " + " / ".join(LABEL[m] for m in modes)])
    lines = []
    for r in rows:
        k = r["kshard"]
        sides = [r.get(m) for m in modes]
        best = r[r["best"]] if r.get("best") else None
        fp32 = r["recipe"] == "fp32"

        def tps(x):
            return f"{x['tokens_per_s']:,.0f}" if x else "FAILED"

        def times(v, unit="x"):
            return f"{v:.2f}{unit}" if v else "-"

        def mfu(key):
            if not k and not best:
                return "-"
            star = "*" if fp32 else ""
            return " / ".join(f"{100 * x[key]:.1f}%{star}" if x else "-" for x in (k, best))

        def gib(x):
            return f"{x['peak_bytes'] / 2**30:.3f}" if x else "-"

        def compile_s(x):
            if not x:
                return "-"
            warn = " (!recompiled)" if x.get("recompiles_timed") else ""
            return f"{x['compile_s']:.1f}{warn}"

        ref = next((x for x in [k] + sides if x), {})
        if ref:
            ptxt = f"{count(ref['params'])} / {count(r['matmul_params'])}"
        else:
            ptxt = "-"
        # A mismatch in exact counts: a rounded one could hide it.
        if r["params_match"] is False:
            others = sorted({x["params"] for x in sides if x and x["params"] != k["params"]})
            ptxt += f" (all {k['params']} != twin " + ", ".join(map(str, others)) + ")"
        if r.get("matmul_match") is False:
            others = sorted({x["matmul_params_reported"] for x in sides
                             if x and x["matmul_params_reported"] not in (None,
                                                                          r["matmul_params"])})
            ptxt += (f" (matmul {r['matmul_params']} != twin " + ", ".join(map(str, others)) +
                     ")")
        spread = max((x["spread"] for x in [k] + sides if x), default=None)
        kbest = times(r["ratio"]) + (f" ({LABEL[r['best']]})" if r["ratio"] else "")
        loss = " / ".join(f"{x['last_loss']:.3f}" if x else "-" for x in [k] + sides)
        lines.append(
            [r["size"], r["recipe"], ptxt, tps(k)] + [tps(x) for x in sides] +
            [times(r["ratios"][m]) for m in modes] + ([kbest] if several else []) +
            [f"{100 * spread:.0f}%" if spread is not None else "-"] +
            [compile_s(r.get(m)) for m in comp] +
            [gib(k)] + [gib(x) for x in sides] + [times(r["peak_ratio"], "")] +
            ([times(r["peak_ratio_compile"], "")] if several and "compile" in modes else []) +
            [mfu("mfu"), mfu("mfu_matmul"), loss])
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(hdr)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(hdr, widths)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += ["| " + " | ".join(c.ljust(w) for c, w in zip(l, widths)) + " |" for l in lines]
    what = {"fsdp2": "FSDP2 = the twin under fully_shard (1 rank)",
            "eager": "eager = the twin on one device, no FSDP",
            "compile": "compile = eager + torch.compile(forward + loss)",
            "compile-max": 'compile-max = compile with mode="max-autotune-no-cudagraphs"'}
    out.append("Sides: " + "; ".join(what[m] for m in modes) +
               ("; best = the fastest of them in the row" if several else "") + ".")
    llama = bool(rows) and rows[0].get("arch") == "llama"
    out.append(f"MFU all-params = (6 x params + 12 x layers x width x seq) x tokens/s / "
               f"{peak_tflops:g} TFLOP/s, params = ALL parameters (embedding "
               f"{'table' if llama else 'and position tables'} included).")
    mm = ("layers x (width x (width + 2 x kv_heads x head_dim) + width^2 + 3 x width x ffn) "
          "+ width x vocab (qkv, proj, gate_up, down, head" if llama else
          "layers x (4 x width^2 + 2 x width x ffn) + width x vocab (= 12 x layers x width^2 "
          "+ width x vocab at ffn = 4 x width; qkv, proj, fc1, fc2, head")
    out.append(f"MFU matmul-params = (6 x matmul_params + 12 x layers x width x seq) x "
               f"tokens/s / {peak_tflops:g} TFLOP/s, matmul_params = {mm}: Linear weights "
               "only; no embedding/position tables, biases or norms: PaLM's convention). Both "
               "count causal attention in full.")
    out.append(f"* fp32 rows: against the same {peak_tflops:g} TFLOP/s bf16 dense peak "
               "(a comparison between the sides, not an fp32 utilisation).")
    if comp:
        out.append("compile s: wall time of the twin's untimed warm-up steps (compile"
                   + (", autotune" if "compile-max" in comp else "") +
                   " and the steps themselves), mean over the repeats: EXCLUDED from tok/s "
                   "(weights restored after the warm-up, so the timed steps match kshard's).")
    out.append("tok/s: mean over the repeats of each launch's median over steps 2..N; spread: "
               "the largest (max-min)/mean of the sides; GiB: peak per rank (max over "
               f"repeats); ratios kshard / {'that side' if several else LABEL[modes[0]]}.")
    return "\n".join(out)


def write_out(a, runs, rows, started, done):
    if not a.out:
        return
    d = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(d, exist_ok=True)
    doc = {"complete": done, "started": started, "argv": sys.argv,
           "config": {"sizes": [n for n, _ in a.sizes], "recipes": a.recipes, "steps": a.steps,
                      "repeats": a.repeats, "torch_modes": a.torch_modes, "exe": a.exe,
                      "mpiexec": a.mpiexec, "python": a.python, "device": a.device,
                      "kshard_extra": a.kshard_extra, "torch_extra": a.torch_extra,
                      "peak_tflops": a.peak_tflops,
                      "timeout_s": {m: launch_timeout(a, m) for m in a.impls},
                      "arch": a.arch, "kv_heads": a.kv_heads, "ffn_hidden": a.ffn_hidden,
                      "rope_theta": a.rope_theta, "norm_eps": a.norm_eps,
                      "tie_embeddings": a.tie_embeddings,
                      "mfu_flops_per_token": "6*params + 12*layers*width*seq",
                      "mfu_matmul_flops_per_token": "6*matmul_params + 12*layers*width*seq",
                      "matmul_params": (
                          "layers*(width*(width+2*kv_heads*head_dim) + width^2 + 3*width*ffn)"
                          " + width*vocab" if a.arch == "llama" else
                          "layers*(4*width^2 + 2*width*ffn) + width*vocab")},
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
                    help="comma-separated: small, medium, large, xl, tiny or WxHxLxSxBxV")
    ap.add_argument("--recipes", default="fp32,bf16", help="comma-separated: fp32, bf16")
    # The model's shape, passed identically to kshard-train and the twin (the
    # same option names on both).
    ap.add_argument("--arch", default="gpt2", choices=["gpt2", "llama"],
                    help="block shape of both sides: gpt2 (default) or llama")
    ap.add_argument("--kv-heads", type=int, default=0,
                    help="llama: key/value heads (0: the size's default: 4 for large, else "
                         "--heads)")
    ap.add_argument("--ffn-hidden", type=int, default=0,
                    help="MLP hidden width (0: the size's default: llama large 5632, else "
                         "kshard-train's rule, 4 x width / Llama's 8 x width / 3 up to 256)")
    ap.add_argument("--rope-theta", type=float, default=None,
                    help="llama: rotary base (default: not passed, both sides use 10000)")
    ap.add_argument("--norm-eps", type=float, default=None,
                    help="norm epsilon (default: not passed, both sides use 1e-5)")
    ap.add_argument("--tie-embeddings", action="store_true",
                    help="tie the head to the token table on both sides")
    ap.add_argument("--torch-modes", default="fsdp2",
                    help="comma-separated torch sides: fsdp2, eager, compile, compile-max")
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
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per launch (default: 300, compile 600, compile-max 900)")
    ap.add_argument("--tail", type=int, default=25, help="output lines shown for a failure")
    ap.add_argument("--out", help="write the full results here as JSON")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    a = ap.parse_args()
    if a.kv_heads < 0 or a.ffn_hidden < 0:
        ap.error("--kv-heads and --ffn-hidden must be >= 0 (0: the default)")
    if a.arch == "gpt2" and (a.kv_heads or a.rope_theta is not None):
        ap.error("--kv-heads / --rope-theta with --arch gpt2; expected --arch llama")
    try:
        a.sizes = [parse_size(s.strip()) for s in a.sizes.split(",") if s.strip()]
        a.sizes = [(n, resolve_arch(a, n, z)) for n, z in a.sizes]
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    a.recipes = [r.strip() for r in a.recipes.split(",") if r.strip()]
    for r in a.recipes:
        if r not in ("fp32", "bf16"):
            ap.error(f"recipe '{r}': expected fp32 or bf16 (the twin has no fp16/fp8)")
    a.torch_modes = list(dict.fromkeys(m.strip() for m in a.torch_modes.split(",") if m.strip()))
    for m in a.torch_modes:
        if m not in TORCH_MODES:
            ap.error(f"torch mode '{m}': expected one of {', '.join(TORCH_MODES)}")
    if a.steps < 2 or a.repeats < 1 or not a.sizes or not a.recipes or not a.torch_modes:
        ap.error("need --steps >= 2, --repeats >= 1, at least one size, recipe and torch mode")
    a.impls = ["kshard"] + a.torch_modes  # one round: kshard, then each mode in order
    if not a.dry_run and not os.path.exists(a.exe):
        print(f"compare.py: warning: --exe {a.exe} does not exist; its launches will fail",
              file=sys.stderr)
    print("sides: " + ", ".join(a.impls) + "; timeout per launch: " +
          ", ".join(f"{m} {launch_timeout(a, m):g} s" for m in a.impls), flush=True)

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    runs, rows = [], []
    failed = 0
    t_all = time.perf_counter()
    for name, size in a.sizes:
        for recipe in a.recipes:
            dims = 'x'.join(str(size[k]) for k in KEYS)
            label = dims if name == dims else f"{name} {dims}"
            print(f"\n== {label} (width x heads x layers x seq x batch x vocab), "
                  f"{arch_text(size)}, {recipe}", flush=True)
            cell = []
            for rep in range(a.repeats):
                for impl in a.impls:
                    r = launch(a, impl, size, recipe)
                    r["size_name"], r["repeat"] = name, rep
                    cell.append(r)
                    runs.append(r)
                    failed += 1 if "error" in r else 0
                    write_out(a, runs, rows, started, False)
            if not a.dry_run:
                rows.append(summarize(name, size, recipe, cell, a.peak_tflops * 1e12,
                                      a.torch_modes))
                write_out(a, runs, rows, started, False)
    if a.dry_run:
        return 0
    write_out(a, runs, rows, started, True)
    shapes = "; ".join(f"{n}: {arch_text(z).split(' ', 1)[1][1:-1]}" for n, z in a.sizes)
    print(f"\nkshard-train ({a.exe}) vs PyTorch twin ({', '.join(a.torch_modes)}), arch "
          f"{a.arch} ({shapes}), 1 rank, {a.steps} steps, {a.repeats} repeat(s), "
          f"{time.perf_counter() - t_all:.0f} s in all\n")
    print(fmt_table(rows, a.peak_tflops))
    for r in rows:
        k = r["kshard"]
        for m in a.torch_modes:
            x = r[m]
            if r["params_match"] is False and x and x["params"] != k["params"]:
                print(f"WARNING: {r['size']}: kshard has {k['params']} params, the twin ({m}) "
                      f"{x['params']}: the models differ")
            if x and x["matmul_params_reported"] not in (None, r["matmul_params"]):
                print(f"WARNING: {r['size']}: the twin ({m}) counts {x['matmul_params_reported']}"
                      f" matmul params, the formula {r['matmul_params']}: the MFU matmul-params "
                      "column of kshard and the twin count different models")
            if x and x.get("recompiles_timed"):
                print(f"WARNING: {r['size']} {r['recipe']}: the twin ({m}) recompiled "
                      f"{x['recompiles_timed']} graph(s) in its timed steps: compile time is "
                      "inside its tok/s")
    if a.out:
        print(f"\nresults: {a.out}")
    if failed:
        print(f"\n{failed} launch(es) failed (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
