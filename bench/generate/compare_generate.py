#!/usr/bin/env python3
"""Generation speed: kshard::generate_batch (KV cache) beside transformers'
generate() on the same model and GPU, in ONE command (issue 22).

  compare_generate.py --exe build/cuda/bench/generate/kshard-bench-generate \\
      [--size large] [--batch 1,16] [--prompt-len 128] [--new 128] [--repeats 3] \\
      [--hf-modes dynamic,static] [--out results.json]

1. transformers builds a LlamaForCausalLM of --size (random init, seed 0;
   large = issue 22's Llama-style large: d2048, 16 heads, 4 kv heads, 8
   layers, ffn 5632, V32000) and saves it in bf16 with save_pretrained into
   --workdir: both sides run the very same weights.
2. transformers' side (bf16, SDPA attention, on the GPU): generate() greedy,
   exactly --new tokens (eos off), for each batch size; modes: dynamic (the
   default DynamicCache, eager) and static (cache_implementation="static",
   which transformers compiles with torch.compile on first use; its compile
   warm-up is excluded and stated).
3. kshard's side: kshard-bench-generate --hf <the folder> --recipe bf16, the
   same prompts (ids (b*7919 + i*104729 + 17) mod vocab).
Each figure is the median of --repeats timed calls after a warm-up call, the
prompt's prefill included (tokens/s = batch x new / seconds); prefill s is a
call that generates one token. "same16" is how many of the first 16 greedy
tokens of sequence 0 agree between the sides (bf16 rounding differs between
kernels, so a near-tie may flip a token; with random weights logits are close
to uniform and ties are common: a sanity figure, not a test).
"""
import argparse
import json
import os
import subprocess
import sys
import time

SIZES = {  # width, heads, kv heads, layers, ffn, vocab
    "tiny": (64, 4, 2, 2, 192, 256),
    "medium": (1024, 16, 4, 8, 2816, 8192),
    "large": (2048, 16, 4, 8, 5632, 32000),
}


def prompts(batch, length, vocab):
    return [[(b * 7919 + i * 104729 + 17) % vocab for i in range(length)] for b in range(batch)]


def make_model(size, path, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    d, h, kv, layers, ffn, vocab = SIZES[size]
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=h, num_key_value_heads=kv, max_position_embeddings=4096,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    model.to(torch.bfloat16).save_pretrained(path)
    n = sum(p.numel() for p in model.parameters())
    del model
    return n


def bench_transformers(path, batches, plen, new, repeats, mode, device):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa").to(device)
    model.eval()
    out = []
    for b in batches:
        ids = torch.tensor(prompts(b, plen, model.config.vocab_size), device=device)
        kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0,
                  attention_mask=torch.ones_like(ids))
        if mode == "static":
            kw["cache_implementation"] = "static"

        def run(n):
            torch.cuda.synchronize() if device == "cuda" else None
            t0 = time.perf_counter()
            with torch.no_grad():
                g = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
            torch.cuda.synchronize() if device == "cuda" else None
            return time.perf_counter() - t0, g

        t0 = time.perf_counter()
        run(4)  # warm-up (static: the compile)
        run(new)
        warm = time.perf_counter() - t0
        full, pre, first = [], [], []
        for _ in range(repeats):
            s, g = run(new)
            full.append(s)
            first = g[0, plen:plen + 16].tolist()
            pre.append(run(1)[0])
        s, p = sorted(full)[len(full) // 2], sorted(pre)[len(pre) // 2]
        out.append({"side": f"transformers-{mode}", "batch": b, "prompt": plen, "new": new, "seconds": s,
                    "tokens_per_s": b * new / s, "prefill_s": p,
                    "decode_tokens_per_s": b * (new - 1) / (s - p) if s > p else -1.0, "warmup_s": warm,
                    "first_tokens": first})
        print("BENCH " + json.dumps(out[-1]), flush=True)
    del model
    return out


def bench_kshard(a, path, batches):
    cmd = [a.exe, "--hf", path, "--recipe", "bf16", "--batch", ",".join(map(str, batches)),
           "--prompt-len", str(a.prompt_len), "--new", str(a.new), "--repeats", str(a.repeats)]
    print("+ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    if p.returncode != 0:
        sys.exit(f"kshard-bench-generate failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    rows = [json.loads(l[6:]) for l in p.stdout.splitlines() if l.startswith("BENCH ")]
    for r in rows:
        print("BENCH " + json.dumps(r), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exe", required=True, help="kshard-bench-generate")
    ap.add_argument("--size", default="large", choices=sorted(SIZES))
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hf-modes", default="dynamic", help="comma-separated: dynamic, static")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--workdir", default=None, help="where the model folder goes (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", help="write every BENCH row here as JSON")
    a = ap.parse_args()
    import tempfile
    work = a.workdir or tempfile.mkdtemp(prefix="kshard_gen_")
    path = os.path.join(work, f"llama-{a.size}")
    batches = [int(x) for x in a.batch.split(",")]
    n = make_model(a.size, path, a.device)
    print(f"model: Llama {a.size} {SIZES[a.size]}, {n / 1e6:.1f}M parameters, bf16 in {path}", flush=True)
    rows = bench_kshard(a, path, batches)
    for mode in a.hf_modes.split(","):
        rows += bench_transformers(path, batches, a.prompt_len, a.new, a.repeats, mode, a.device)
    print(f"\nprompt {a.prompt_len} + {a.new} new tokens, greedy, bf16; median of {a.repeats}")
    print(f"{'batch':>5} | {'side':<22} | {'tok/s':>9} | {'decode tok/s':>12} | {'prefill s':>9} | "
          f"{'kshard/this':>11} | same16")
    for b in batches:
        k = next(r for r in rows if r["side"] == "kshard" and r["batch"] == b)
        for r in [x for x in rows if x["batch"] == b]:
            same = sum(1 for x, y in zip(r["first_tokens"], k["first_tokens"]) if x == y)
            print(f"{b:>5} | {r['side']:<22} | {r['tokens_per_s']:>9.1f} | {r['decode_tokens_per_s']:>12.1f} | "
                  f"{r['prefill_s']:>9.4f} | {k['tokens_per_s'] / r['tokens_per_s']:>10.2f}x | {same}/16")
    if a.out:
        json.dump(rows, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
