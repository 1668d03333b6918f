#!/usr/bin/env python3
"""kshard's Hugging Face exports loaded by transformers itself, and models
saved by transformers for kshard to import.

  hf_transformers_check.py DIR...    # what checkpoint_hf_export wrote (config.json,
                                     # model.safetensors, ids.i32, logits.f32,
                                     # batch.json, greedy.i32)
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
and transformers: CI installs them from PyPI into a cached virtual
environment (ci/hf-client) and passes it to CMake as KSHARD_HF_PYTHON.
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def check(d, device):
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
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
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


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        import shutil
        shutil.rmtree(sys.argv[2], ignore_errors=True)
        make(sys.argv[2])
        print("OK", flush=True)
        return
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ok = all([check(d, device) for d in sys.argv[1:]])
    sys.exit(0 if ok and len(sys.argv) > 1 else 1)


if __name__ == "__main__":
    main()
