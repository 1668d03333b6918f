#!/usr/bin/env python3
"""kshard's Hugging Face exports loaded by transformers itself, and models
saved by transformers for kshard to import.

  hf_transformers_check.py DIR...    # what checkpoint_hf_export wrote (config.json,
                                     # model.safetensors, ids.i32, logits.f32,
                                     # batch.json, greedy.i32)
  hf_transformers_check.py sample EXE DIR...
                                     # kshard-train (EXE) --init-from DIR --eval-only
                                     # --sample: its greedy tokens = greedy.i32
  hf_transformers_check.py make OUT  # OUT/tf_llama, OUT/tf_gpt2: save_pretrained
                                     # of a LlamaForCausalLM (grouped-query, untied)
                                     # and a GPT2LMHeadModel, with transformers'
                                     # logits and greedy generate() beside them

For each DIR: AutoModelForCausalLM.from_pretrained(DIR) (float32, eager
attention, on the GPU when there is one) must load every tensor (no missing or
unexpected keys), give kshard's logits for the batch to 1e-4 relative to the
largest logit, and continue the first `prompt` ids greedily (generate,
do_sample=False) with exactly kshard::generate's tokens. `make` is the
reverse: kshard's checkpoint_hf_import loads each folder with import_hf and
must give transformers' logits (1e-4 relative) and greedy tokens. Needs torch
and transformers (`sample` only numpy): CI installs them from PyPI into a cached virtual
environment (ci/hf-client) and passes it to CMake as KSHARD_HF_PYTHON.
"""
import json
import os
import sys

import numpy as np


def check(d, device):
    import torch
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        print(f"FAIL: {d}: loading reported {bad}")
        return False
    model = model.to(device).eval()
    b = json.load(open(os.path.join(d, "batch.json")))
    ids = np.fromfile(os.path.join(d, "ids.i32"), dtype="<i4").reshape(b["batch"], b["seq"])
    want = np.fromfile(os.path.join(d, "logits.f32"), dtype="<f4").reshape(b["batch"] * b["seq"], -1)
    with torch.no_grad():
        got = model(torch.tensor(ids, dtype=torch.long, device=device)).logits
    got = got.reshape(want.shape).double().cpu().numpy()
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    prompt = torch.tensor(ids[:1, : b["prompt"]], dtype=torch.long, device=device)
    kshard_gen = np.fromfile(os.path.join(d, "greedy.i32"), dtype="<i4").tolist()
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=len(kshard_gen), do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    hf_gen = out[0, b["prompt"]:].tolist()
    ok = err <= 1e-4 and hf_gen == kshard_gen
    print(f"{'OK' if ok else 'FAIL'}: {d}: {type(model).__name__} on {device}: logits max |diff| / "
          f"max |logit| = {err:.2e}; greedy transformers {hf_gen} vs kshard {kshard_gen}", flush=True)
    return ok


def make(out):
    """Random models (weights re-drawn with std 0.3 so that logits are well
    separated and greedy choices are not near ties), saved by transformers."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(11)
    batch, seq, prompt, new = 2, 12, 3, 8
    models = {
        "tf_llama": LlamaForCausalLM(LlamaConfig(
            vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rope_theta=500.0, rms_norm_eps=1e-5, tie_word_embeddings=False)),
        "tf_gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=4,
                                              n_positions=40, bos_token_id=0, eos_token_id=0)),
    }
    for name, model in models.items():
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname or ".ln_" in pname:
                    p.copy_(1.0 + 0.1 * torch.randn_like(p) if pname.endswith("weight") else 0.1 * torch.randn_like(p))
                else:
                    p.normal_(0.0, 0.3)
        d = os.path.join(out, name)
        model.save_pretrained(d)
        model.eval()
        ids = np.array([(i * 37 + 11) % 61 for i in range(batch * seq)], dtype="<i4").reshape(batch, seq)
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
        with torch.no_grad():
            logits = m(torch.tensor(ids, dtype=torch.long)).logits
            gen = m.generate(torch.tensor(ids[:1, :prompt], dtype=torch.long), max_new_tokens=new,
                             do_sample=False, pad_token_id=0, eos_token_id=None)
        ids.tofile(os.path.join(d, "ids.i32"))
        logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.f32"))
        gen[0, prompt:].numpy().astype("<i4").tofile(os.path.join(d, "greedy.i32"))
        json.dump({"batch": batch, "seq": seq, "prompt": prompt}, open(os.path.join(d, "batch.json"), "w"))
        print(f"{d}: {type(m).__name__} saved by transformers {__import__('transformers').__version__}, "
              f"greedy {gen[0, prompt:].tolist()}", flush=True)


def train_flags(cfg, seq):
    """kshard-train's flags for a config.json (what --init-from checks)."""
    if cfg["model_type"] == "llama":
        theta = cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
        f = ["--arch", "llama", "--width", cfg["hidden_size"], "--heads", cfg["num_attention_heads"],
             "--kv-heads", cfg["num_key_value_heads"], "--ffn-hidden", cfg["intermediate_size"],
             "--layers", cfg["num_hidden_layers"], "--rope-theta", theta, "--norm-eps", cfg["rms_norm_eps"]]
        if cfg.get("tie_word_embeddings"):
            f.append("--tie-embeddings")
    else:
        f = ["--arch", "gpt2", "--tie-embeddings", "--width", cfg["n_embd"], "--heads", cfg["n_head"],
             "--ffn-hidden", cfg.get("n_inner") or 4 * cfg["n_embd"], "--layers", cfg["n_layer"],
             "--norm-eps", cfg["layer_norm_epsilon"]]
    return [str(x) for x in f + ["--vocab", cfg["vocab_size"], "--seq", seq]]


def kshard_sample(exe, d):
    """kshard-train --init-from DIR --eval-only --sample: the command-line way
    to generate from a Hugging Face folder, against the greedy tokens of the
    folder's writer (transformers' generate() or the numpy forward)."""
    import re
    import subprocess
    cfg = json.load(open(os.path.join(d, "config.json")))
    b = json.load(open(os.path.join(d, "batch.json")))
    ids = np.fromfile(os.path.join(d, "ids.i32"), dtype="<i4")[: b["prompt"]].tolist()
    want = np.fromfile(os.path.join(d, "greedy.i32"), dtype="<i4").tolist()
    cmd = [exe] + train_flags(cfg, b["seq"]) + ["--init-from", d, "--eval-only", "--sample", str(len(want)),
                                                "--prompt-ids", ",".join(map(str, ids))]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    m = re.search(r"^sample: \d+ tokens after a prompt of \d+ \(greedy\): ([\d,]+)$", p.stdout, re.M)
    got = [int(x) for x in m.group(1).split(",")] if m else None
    ok = p.returncode == 0 and got == want
    print(f"{'OK' if ok else 'FAIL'}: kshard-train --init-from {d} --sample {len(want)}: {got} vs {want}"
          + ("" if ok else f"\n{' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}"), flush=True)
    return ok


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "sample":
        ok = all([kshard_sample(sys.argv[2], d) for d in sys.argv[3:]])
        sys.exit(0 if ok else 1)
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        import shutil
        shutil.rmtree(sys.argv[2], ignore_errors=True)
        make(sys.argv[2])
        print("OK", flush=True)
        return
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ok = all([check(d, device) for d in sys.argv[1:]])
    sys.exit(0 if ok and len(sys.argv) > 1 else 1)


if __name__ == "__main__":
    main()
