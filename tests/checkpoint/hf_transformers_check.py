#!/usr/bin/env python3
"""kshard's Hugging Face exports loaded by transformers itself.

  hf_transformers_check.py DIR...   # what checkpoint_hf_export wrote (config.json,
                                    # model.safetensors, ids.i32, logits.f32,
                                    # batch.json, greedy.i32)

For each DIR: AutoModelForCausalLM.from_pretrained(DIR) (float32, eager
attention, on the GPU when there is one) must load every tensor (no missing or
unexpected keys), give kshard's logits for the batch to 1e-4 relative to the
largest logit, and continue the first `prompt` ids greedily (generate,
do_sample=False) with exactly kshard::generate's tokens. Needs torch and
transformers, which CI does not install: run where they are (the GPU machine
has both) and record the result in docs/CHECKPOINTS.md.
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def check(d, device):
    model, info = AutoModelForCausalLM.from_pretrained(
        d, torch_dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
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


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ok = all([check(d, device) for d in sys.argv[1:]])
    sys.exit(0 if ok and len(sys.argv) > 1 else 1)


if __name__ == "__main__":
    main()
