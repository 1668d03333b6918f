#!/usr/bin/env python3
"""Hugging Face's forward pass, in numpy, from an exported directory alone.

  hf_reference.py check DIR...   # each DIR: config.json, model.safetensors,
                                 # ids.i32, logits.f32, batch.json (kshard's)
  hf_reference.py names DIR...   # config.json + model.safetensors only: the
                                 # architecture and every tensor transformers loads
  hf_reference.py make OUT       # Hugging Face folders for kshard's import_hf
                                 # (OUT/np_*: config.json + safetensors written by
                                 # Python's safetensors, with this forward's
                                 # logits and greedy continuation beside them;
                                 # OUT/bad/*: broken copies, one fault each)

Reads config.json and model.safetensors the way transformers does (names,
shapes and layouts of LlamaForCausalLM and GPT2LMHeadModel) and runs the
model as transformers' modeling_llama.py / modeling_gpt2.py define it, in
float64: Llama = embed_tokens, per layer x + o_proj(attn(input_layernorm(x)))
then x + down_proj(silu(gate_proj(h)) * up_proj(h)) with h =
post_attention_layernorm(x), RMSNorm x * rsqrt(mean(x^2) + eps) * w, rotary
embeddings in the rotate-half form (inv_freq = theta^(-2i/head_dim), cos/sin
of position x inv_freq repeated over both halves), grouped-query attention by
repeating each k/v head for its group (repeat_kv), causal softmax(q k^T /
sqrt(head_dim)) v, final norm, lm_head (embed_tokens when tied). GPT-2 =
wte + wpe, per layer x + c_proj(attn(c_attn(ln_1(x)))) then x +
mlp.c_proj(gelu_new(mlp.c_fc(ln_2(x)))) with Conv1D (x @ W + b, W [in, out]),
ln_f, logits against wte. Nothing of kshard's code is used.

The logits must match kshard's (computed in f32) to 1e-4 relative to the
largest logit (measured on the host: 2-3e-7), and kshard::generate's greedy
continuation (greedy.i32) must be this forward's argmax loop token for token.
"""
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def causal_attention(q, k, v):
    """q, k, v: [heads, T, hd] -> [T, heads * hd]."""
    h, t, hd = q.shape
    s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
    s = s + np.triu(np.full((t, t), -np.inf), 1)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ v).transpose(1, 0, 2).reshape(t, h * hd)


def rope_theta(cfg):
    """transformers 5 writes rope_parameters {rope_theta, rope_type}; earlier
    versions rope_theta at the top level."""
    return cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta", 10000.0))


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def llama_forward(cfg, w, ids):
    d = cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", d // nh)
    eps, theta = cfg["rms_norm_eps"], rope_theta(cfg)
    t = len(ids)
    x = w["model.embed_tokens.weight"][ids]
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    freqs = np.outer(np.arange(t, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(t, nh, hd).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(t, nkv, hd).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, nkv, hd).transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, nh // nkv, axis=0)  # repeat_kv: kv head j serves heads j*g .. j*g+g-1
        v = np.repeat(v, nh // nkv, axis=0)
        x = x + causal_attention(q, k, v) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gpt2_forward(cfg, w, ids):
    d, nh, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hd = d // nh
    t = len(ids)
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][np.arange(t)]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (a.reshape(t, nh, hd).transpose(1, 0, 2) for a in np.split(qkv, 3, axis=-1))
        x = x + causal_attention(q, k, v) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        m = gelu_new(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = layer_norm(x, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return x @ w["transformer.wte.weight"].T


def expected_names(cfg):
    """Every tensor transformers' model loads (and nothing else)."""
    if cfg["model_type"] == "llama":
        names = {"model.embed_tokens.weight", "model.norm.weight"}
        if not cfg["tie_word_embeddings"]:
            names.add("lm_head.weight")
        for i in range(cfg["num_hidden_layers"]):
            for n in ("input_layernorm", "post_attention_layernorm"):
                names.add(f"model.layers.{i}.{n}.weight")
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                names.add(f"model.layers.{i}.self_attn.{n}.weight")
            for n in ("gate_proj", "up_proj", "down_proj"):
                names.add(f"model.layers.{i}.mlp.{n}.weight")
        return names
    names = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
             "transformer.ln_f.bias"}
    for i in range(cfg["n_layer"]):
        for n in ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            names |= {f"transformer.h.{i}.{n}.weight", f"transformer.h.{i}.{n}.bias"}
    return names


def weight_files(d):
    """model.safetensors, or the files model.safetensors.index.json names."""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        if os.path.exists(os.path.join(d, "model.safetensors")):
            fail(f"{d}: both model.safetensors and an index")
        return sorted({os.path.join(d, f) for f in json.load(open(index))["weight_map"].values()})
    return [os.path.join(d, "model.safetensors")]


def header(d):
    """The safetensors headers (name -> dtype, shape, offsets) of every
    weight file, read as the format defines it: numpy has no bfloat16 to load
    a bf16 file with."""
    h = {}
    for file in weight_files(d):
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            part = json.loads(f.read(n))
        part.pop("__metadata__", None)
        if set(part) & set(h):
            fail(f"{d}: tensors {sorted(set(part) & set(h))} in two files")
        h.update(part)
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        m = json.load(open(index))["weight_map"]
        if set(m) != set(h) or any(h[k] and os.path.join(d, m[k]) not in weight_files(d) for k in m):
            fail(f"{d}: the index names {sorted(m)}, the files hold {sorted(h)}")
    return h


def names_only(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    arch = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}.get(cfg.get("model_type"))
    if arch is None or cfg.get("architectures") != [arch]:
        fail(f"{d}: model_type {cfg.get('model_type')} / architectures {cfg.get('architectures')}")
    h = header(d)
    names = expected_names(cfg)
    if set(h) != names:
        fail(f"{d}: tensors {sorted(set(h) ^ names)} are missing or extra")
    want = {"float32": "F32", "bfloat16": "BF16"}[cfg["torch_dtype"]]
    if {t["dtype"] for t in h.values()} != {want}:
        fail(f"{d}: tensor dtypes {sorted({t['dtype'] for t in h.values()})}, config says {want}")
    return cfg, h


def load(d):
    """config.json and the tensors (float64) of an exported f32 directory,
    checked for the architecture and the exact set of names transformers loads."""
    cfg, _ = names_only(d)
    w = {}
    for f in weight_files(d):
        w.update({k: v.astype(np.float64) for k, v in load_file(f).items()})
    return cfg, w


def check(d):
    cfg, w = load(d)
    b = json.load(open(os.path.join(d, "batch.json")))
    ids = np.fromfile(os.path.join(d, "ids.i32"), dtype="<i4").reshape(b["batch"], b["seq"])
    got = np.fromfile(os.path.join(d, "logits.f32"), dtype="<f4").astype(np.float64)
    forward = llama_forward if cfg["model_type"] == "llama" else gpt2_forward
    want = np.concatenate([forward(cfg, w, row) for row in ids]).reshape(-1)
    if got.shape != want.shape:
        fail(f"{d}: {got.size} logits from kshard, {want.size} from the reference")
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    print(f"{d}: {cfg['model_type']} ({len(w)} tensors in {len(weight_files(d))} file(s)), kshard vs Hugging Face's forward: "
          f"max |diff| / max |logit| = {err:.2e}", flush=True)
    if not err <= 1e-4:
        fail(f"{d}: logits differ by {err:.2e} (tolerance 1e-4)")
    # kshard::generate's greedy continuation = the argmax loop of this forward.
    greedy = os.path.join(d, "greedy.i32")
    if os.path.exists(greedy):
        kshard_gen = np.fromfile(greedy, dtype="<i4").tolist()
        seq = ids[0, : b["prompt"]].tolist()
        for _ in kshard_gen:
            seq.append(int(np.argmax(forward(cfg, w, np.array(seq))[-1])))
        if seq[b["prompt"]:] != kshard_gen:
            fail(f"{d}: greedy continuation {seq[b['prompt']:]} here, {kshard_gen} from kshard")
        print(f"{d}: greedy continuation of {b['prompt']} tokens equal: {kshard_gen}", flush=True)


# --- make: Hugging Face folders written here, for kshard to import ----------

BATCH, SEQ, PROMPT, NEW = 2, 12, 3, 8


def write_folder(d, cfg, w, dtype, shards=1, extra=None):
    """config.json + the tensors (as `dtype`) in one file or `shards` files
    with transformers' index, and this forward's logits for a batch and
    greedy continuation (computed from the tensors as written)."""
    from safetensors.numpy import save_file
    os.makedirs(d, exist_ok=True)
    w = {k: v.astype(dtype) for k, v in w.items()}
    names = sorted(w)
    if shards == 1:
        save_file({**w, **(extra or {})}, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for s in range(shards):
            f = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: w[k] for k in names[s::shards]}
            save_file(part, os.path.join(d, f), metadata={"format": "pt"})
            weight_map.update({k: f for k in part})
        json.dump({"metadata": {"total_size": int(sum(v.nbytes for v in w.values()))},
                   "weight_map": weight_map}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    forward = llama_forward if cfg["model_type"] == "llama" else gpt2_forward
    vocab = cfg["vocab_size"]
    ids = np.array([(i * 37 + 11) % vocab for i in range(BATCH * SEQ)], dtype="<i4").reshape(BATCH, SEQ)
    logits = np.concatenate([forward(cfg, w64, row) for row in ids])
    seq = ids[0, :PROMPT].tolist()
    for _ in range(NEW):
        seq.append(int(np.argmax(forward(cfg, w64, np.array(seq))[-1])))
    ids.tofile(os.path.join(d, "ids.i32"))
    logits.astype("<f4").tofile(os.path.join(d, "logits.f32"))
    np.array(seq[PROMPT:], dtype="<i4").tofile(os.path.join(d, "greedy.i32"))
    json.dump({"batch": BATCH, "seq": SEQ, "prompt": PROMPT}, open(os.path.join(d, "batch.json"), "w"))
    print(f"{d}: {cfg['model_type']} with {len(w)} {np.dtype(dtype).name} tensors in {shards} file(s)", flush=True)


def random_weights(cfg, rng):
    """Weights that give clearly separated logits (std 0.3; norms near 1)."""
    def mat(*shape):
        return rng.normal(0.0, 0.3, shape)

    def norm(n):
        return 1.0 + 0.1 * rng.normal(size=n)

    w = {}
    if cfg["model_type"] == "llama":
        d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        hd = d // cfg["num_attention_heads"]
        kv = cfg["num_key_value_heads"] * hd
        w["model.embed_tokens.weight"] = mat(v, d)
        w["model.norm.weight"] = norm(d)
        if not cfg["tie_word_embeddings"]:
            w["lm_head.weight"] = mat(v, d)
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            w[p + "input_layernorm.weight"] = norm(d)
            w[p + "post_attention_layernorm.weight"] = norm(d)
            w[p + "self_attn.q_proj.weight"] = mat(d, d)
            w[p + "self_attn.k_proj.weight"] = mat(kv, d)
            w[p + "self_attn.v_proj.weight"] = mat(kv, d)
            w[p + "self_attn.o_proj.weight"] = mat(d, d)
            w[p + "mlp.gate_proj.weight"] = mat(f, d)
            w[p + "mlp.up_proj.weight"] = mat(f, d)
            w[p + "mlp.down_proj.weight"] = mat(d, f)
        return w
    d, v, n = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    f = cfg["n_inner"] or 4 * d
    w["transformer.wte.weight"] = mat(v, d)
    w["transformer.wpe.weight"] = mat(n, d)
    w["transformer.ln_f.weight"] = norm(d)
    w["transformer.ln_f.bias"] = 0.1 * rng.normal(size=d)
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            w[p + ln + ".weight"] = norm(d)
            w[p + ln + ".bias"] = 0.1 * rng.normal(size=d)
        for name, shape in (("attn.c_attn", (d, 3 * d)), ("attn.c_proj", (d, d)),
                            ("mlp.c_fc", (d, f)), ("mlp.c_proj", (f, d))):
            w[p + name + ".weight"] = mat(*shape)
            w[p + name + ".bias"] = 0.1 * rng.normal(size=shape[1])
    return w


def make(out):
    import shutil
    rng = np.random.default_rng(2024)
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 61,
             "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu",
             "max_position_embeddings": 64, "rms_norm_eps": 1e-06, "attention_bias": False,
             "mlp_bias": False, "rope_parameters": {"rope_theta": 500.0, "rope_type": "default"},
             "tie_word_embeddings": False, "dtype": "float32"}
    w = random_weights(llama, rng)
    write_folder(os.path.join(out, "np_llama"), llama, w, np.float32)
    write_folder(os.path.join(out, "np_llama_sharded"), llama, w, np.float32, shards=2)
    # transformers 4's layout: rope_theta at the top level; multi-query, tied, f16.
    tied = {k: v for k, v in llama.items() if k != "rope_parameters"}
    tied.update({"num_key_value_heads": 1, "rope_theta": 10000.0, "rope_scaling": None,
                 "tie_word_embeddings": True, "torch_dtype": "float16"})
    write_folder(os.path.join(out, "np_llama_mqa_tied_f16"), tied, random_weights(tied, rng), np.float16)
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 61, "n_embd": 32,
            "n_layer": 2, "n_head": 4, "n_inner": None, "n_positions": 40, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-05, "scale_attn_weights": True, "tie_word_embeddings": True}
    # n_positions 40 > the sequence (12): kshard reads the table's first rows;
    # attn.bias: the causal-mask buffer transformers 4.2x saved.
    mask = {"transformer.h.0.attn.bias": np.tril(np.ones((40, 40), dtype=np.float32))[None, None]}
    write_folder(os.path.join(out, "np_gpt2"), gpt2, random_weights(gpt2, rng), np.float32, extra=mask)

    # One fault per folder, each a copy of np_llama.
    from safetensors.numpy import load_file, save_file
    good = os.path.join(out, "np_llama")

    def bad(name, config=None, tensors=None, truncate=False, drop_weights=False, index=None):
        d = os.path.join(out, "bad", name)
        shutil.copytree(good, d)
        if config:
            cfg = json.load(open(os.path.join(d, "config.json")))
            config(cfg)
            json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        f = os.path.join(d, "model.safetensors")
        if tensors:
            t = load_file(f)
            tensors(t)
            save_file(t, f, metadata={"format": "pt"})
        if truncate:
            os.truncate(f, os.path.getsize(f) // 2)
        if drop_weights or index:
            os.remove(f)
        if index:
            json.dump(index, open(os.path.join(d, "model.safetensors.index.json"), "w"))

    bad("missing_tensor", tensors=lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    bad("wrong_shape", tensors=lambda t: t.update(
        {"model.layers.0.mlp.up_proj.weight": np.ascontiguousarray(t["model.layers.0.mlp.up_proj.weight"].T)}))
    bad("extra_tensor", tensors=lambda t: t.update(
        {"model.layers.0.self_attn.q_norm.weight": np.ones(8, dtype=np.float32)}))
    bad("int_tensor", tensors=lambda t: t.update(
        {"model.norm.weight": t["model.norm.weight"].astype(np.int32)}))
    bad("architecture", config=lambda c: c.update({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}))
    bad("rope_scaling", config=lambda c: c.update({"rope_parameters": {"rope_theta": 500.0, "rope_type": "linear",
                                                                       "factor": 2.0}}))
    bad("disagrees", config=lambda c: c.update({"num_key_value_heads": 4}))
    bad("biases", config=lambda c: c.update({"attention_bias": True}))
    bad("truncated", truncate=True)
    bad("no_weights", drop_weights=True)
    bad("missing_shard", index={"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})
    os.makedirs(os.path.join(out, "bad", "no_config"))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        import shutil
        shutil.rmtree(sys.argv[2], ignore_errors=True)
        make(sys.argv[2])
        print("OK", flush=True)
        return
    if len(sys.argv) < 3 or sys.argv[1] not in ("check", "names"):
        fail("usage: hf_reference.py check|names DIR... | make OUT")
    for d in sys.argv[2:]:
        if sys.argv[1] == "check":
            check(d)
        else:
            cfg, h = names_only(d)
            print(f"{d}: {cfg['architectures'][0]}, {len(h)} {cfg['torch_dtype']} tensors as "
                  f"transformers names them")
    print("OK", flush=True)


if __name__ == "__main__":
    main()
