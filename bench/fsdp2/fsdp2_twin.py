#!/usr/bin/env python3
"""fsdp2_twin: kshard-train's model, data and optimizer in PyTorch (FSDP2, eager, compiled).

The reference side of bench/fsdp2/compare.py. It trains the model that
examples/train/train.cpp builds, on the same data, with the same optimizer
settings and the same timing rules, and prints kshard-train's "BENCH {json}"
keys where they mean the same thing. --torch-mode picks how PyTorch runs it
(issue 20: the anchor is the best of them, not FSDP2 alone):

  fsdp2        (default) fully_shard as described under FSDP2 below; any
               world size (torchrun), NCCL or gloo
  eager        one device, no process group, no FSDP: the plain module
  compile      as eager, but the model's forward AND the loss are one
               torch.compile'd function (default mode, inductor)
  compile-max  as compile with mode="max-autotune-no-cudagraphs"
eager, compile and compile-max refuse WORLD_SIZE > 1 (one device only).

Model, --arch gpt2 (default; mirrors kshard's layers; the parameter count
equals kshard-train's):
  Embedding(vocab, d) with a learned position table (max_seq = --seq), both
      N(0, 0.02) as kshard's Embedding; token + position, no dropout
  L x TransformerLayer (kshard's TransformerLayer = LayerNorm ln1 ->
      CausalSelfAttention, residual; then LayerNormMLP, residual):
        x1 = x + proj(attn(qkv(ln1(x))))       qkv Linear(d, 3d), proj Linear(d, d)
        y  = x1 + fc2(gelu_tanh(fc1(ln(x1))))  fc1 Linear(d, ff), fc2 Linear(ff, d)
      ff = --ffn-hidden (default 4d); qkv's output columns are [q | k | v], each
      split into heads side by side (kshard's layout); attention is
      F.scaled_dot_product_attention(is_causal) with the 1/sqrt(d/heads) scale;
      LayerNorm eps --norm-eps (1e-5); every Linear has a bias
  LayerNorm(d) -> Linear(d, vocab) head with bias
Model, --arch llama (kshard-train --arch llama: examples/train/train.cpp,
engine/src/nn/llama_layer.cpp; no bias anywhere):
  Embedding(vocab, d), N(0, 0.02), token table only (positions are rotary)
  L x LlamaLayer (kshard's: RMSNorm norm1 -> attention, residual; then
      SwiGLUMLP = RMSNorm norm -> gate_up -> SwiGLU -> down, residual):
        x1 = x + proj(attn(rope(qkv(norm1(x)))))
        y  = x1 + down(silu(g) * u),  [g | u] = gate_up(norm(x1))
      qkv  ONE Linear(d, (heads + 2 kv) hd), hd = d / heads, kv = --kv-heads
           (default heads): output rows q (heads hd), then k (kv hd), then v
           (kv hd), heads side by side (kshard's layout)
      rope rotary embeddings on q and k, rotate-half layout (element i pairs
           with i + hd/2; GPT-NeoX, HF Llama, kshard's qkv_pack), angle =
           position x theta^(-2i/hd), theta = --rope-theta (10000), cos/sin
           computed in f32 once, cast to the activations' dtype at use
      attn F.scaled_dot_product_attention(q, k, v, is_causal=True,
           enable_gqa=True) on k/v with kv heads (no repeated copies): query
           head i reads k/v head i // (heads / kv), as kshard; 1/sqrt(hd)
           scale (enable_gqa only where kv < heads: with kv = heads it is
           plain multi-head attention, every SDPA backend eligible)
      gate_up ONE Linear(d, 2 ffn): rows [gate | up], gate first (kshard's
           fused layout); down Linear(ffn, d); ffn = --ffn-hidden (default
           8d/3 rounded up to a multiple of 256, kshard-train's rule: 5632 at
           d 2048)
      RMSNorm: F.rms_norm(x, (d,), weight, eps = --norm-eps (1e-5)), weight
           ones; called on whatever dtype reaches it (f32 residual stream
           under autocast, bf16 under FSDP2's param_dtype)
  RMSNorm(d) -> Linear(d, vocab) head without bias
--tie-embeddings (either arch, kshard-train's option): no head module, the
  head is F.linear(x, embed.weight) (one parameter, N(0, 0.02) as the table;
  no head bias, as kshard's tied head)
loss: mean cross entropy over all tokens (logits upcast to f32 first, as
  autocast does and as kshard's loss statistics are f32)
Parameter counts in BENCH (also: arch, kv_heads, ffn_hidden, tie_embeddings,
rope_theta, norm_eps):
  params         all parameters, a tied table once: embedding (and gpt2's
                 position) table, every Linear weight and bias, every
                 LayerNorm / RMSNorm weight (and bias)
  matmul_params  the weights of the nn.Linear modules, plus d x vocab for a
                 tied head (still a GEMM): gpt2 per layer qkv (d x 3d), proj
                 (d x d), fc1 (d x ff), fc2 (ff x d) = 4 d^2 + 2 d ff (12 d^2
                 at ff = 4d); llama per layer qkv d x (d + 2 kv hd), proj
                 d x d, gate_up + down 3 d ffn; plus the head (d x vocab):
                   gpt2   L (4 d^2 + 2 d ff) + d vocab
                   llama  L (d (d + 2 kv hd) + d^2 + 3 d ffn) + d vocab
                 Not the embedding or position tables (lookups, no matmul),
                 not the biases, not the norms (PaLM's MFU convention)
Init: LayerNorm ones/zeros, RMSNorm ones, Linear PyTorch's default
  uniform(+-1/sqrt(fan_in)) for weight and bias (the same laws kshard uses;
  the draws differ).
FSDP2: fully_shard on each TransformerLayer / LlamaLayer, then on the root
  (which holds the embedding, the final norm and the head); --wrap units also
  shards the embedding, the final norm and the head as units of their own, as
  kshard-train does (every layer one FSDP unit); with --tie-embeddings the
  tied table stays in the root (the head reads it after the embedding's
  forward) and only the final norm is a unit of its own. Reshard after
  forward on.
  --recipe bf16: MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32).
eager / compile / compile-max: the module as built, on one device, no wrapper.
  --recipe bf16: torch.autocast(device, bfloat16) around forward + loss with
  f32 parameters (f32 master weights, f32 gradients): PyTorch's standard AMP
  recipe. Unlike FSDP2's param_dtype, autocast runs the LayerNorms (the
  RMSNorms: F.rms_norm on the f32 stream), the embedding sum and the
  residual stream in f32 and only the matmuls and
  attention in bf16; --recipe fp32: no autocast. The compiled function is
      fwd_loss(ids, tgt) = cross_entropy(model(ids).float(), tgt)  (autocast inside)
  so inductor sees the head and the loss in the same graph; backward and the
  optimizer step run outside it, as in the other modes.
Optimizer: torch.optim.AdamW(fused=True), lr 3e-3, betas (0.9, 0.999), eps 1e-8,
  weight_decay 0 (kshard's FusedAdam defaults), global-norm clipping at --clip
  (1.0, kshard-train's default) through clip_grad_norm_.
Data: kshard's MarkovTask ported exactly (splitmix64 streams), so the token ids
  and targets equal kshard-train's for the same --seed, --vocab, --seq, --batch.
  The batches are generated on the host before the timed loop (kshard fills
  its host buffer inside the step, microseconds); the host->device copy of
  each step's ids and targets is inside the timed step, as in kshard.
Timing: as kshard-train: each step is timed between synchronisations;
  tokens_per_s is the mean and tokens_per_s_median the median over steps
  2..N (step 1 pays first-use costs); peak_bytes is
  torch.cuda.max_memory_allocated over the steps (reset before step 1).
  fsdp2 and eager take no warm-up (that rule alone). compile and compile-max
  first run --warmup full steps (default 2: forward, backward, clip,
  optimizer step) on the first batches, untimed: dynamo traces, inductor
  compiles (and autotunes) the forward on the first call and the backward on
  the first backward. Their wall time is BENCH's compile_s: excluded from
  tokens/s, stated beside it (it includes the warm-up steps' own compute,
  negligible beside a compile). Before the warm-up the parameters are copied
  to the host; after it they are copied back in place (the compiled code
  keeps the same tensors) and the optimizer is built afresh (it had no state
  yet), so the timed steps 1..N start from the same weights and see the same
  batches as kshard's steps 1..N and the losses stay comparable step for
  step. inductor's on-disk caches (/tmp/torchinductor_$USER) survive between
  launches, so a repeat launch may compile faster: compile_s is per launch;
  TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 makes every launch compile cold.
  recompiles_timed counts dynamo graphs compiled during the timed steps
  (should be 0; a non-zero count means compile time leaked into tokens/s).

Launch: single process, world size 1, no torchrun needed (fsdp2 sets
MASTER_ADDR/PORT itself; the other modes create no process group); under
torchrun (fsdp2 only) the RANK/WORLD_SIZE it sets are used and the data are
sliced per rank as kshard does.

  python3 bench/fsdp2/fsdp2_twin.py --width 1024 --heads 16 --layers 8 \
      --seq 512 --batch 8 --vocab 8192 --recipe bf16 --steps 20 --bench
  python3 bench/fsdp2/fsdp2_twin.py --torch-mode compile-max --width 4096 --heads 32 \
      --layers 8 --seq 1024 --batch 4 --vocab 32000 --recipe bf16 --steps 20 --bench
  python3 bench/fsdp2/fsdp2_twin.py --device cpu --width 64 --layers 2 --steps 30  # gloo
  python3 bench/fsdp2/fsdp2_twin.py --device cpu --torch-mode eager --steps 30
  python3 bench/fsdp2/fsdp2_twin.py --torch-mode compile --arch llama --width 2048 \
      --heads 16 --kv-heads 4 --ffn-hidden 5632 --layers 8 --seq 1024 --batch 4 \
      --vocab 32000 --recipe bf16 --steps 20 --bench
"""
import argparse
import json
import math
import os
import socket
import statistics
import sys
import time

# ---------------------------------------------------------------- data ----
# A port of examples/train/markov_task.cpp in plain Python integers masked to
# 64 bits (no numpy needed: torch does not require it). Its output equals the
# C++ generator's for the same (vocab, seed, first, count, seq).

M64 = (1 << 64) - 1


def _mix(x):
    """splitmix64's finaliser."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


class _Stream:
    """kshard's counter-based Stream: next() = mix(state++ * C)."""

    def __init__(self, state):
        self.state = state & M64

    def next(self):
        v = _mix((self.state * 0x2545F4914F6CDD1D) & M64)
        self.state = (self.state + 1) & M64
        return v

    def uniform(self):
        return (self.next() >> 11) * (1.0 / 9007199254740992.0)

    def below(self, n):
        return self.next() % n


class MarkovTask:
    LIKELY = 0.8

    def __init__(self, vocab, seed):
        self.vocab = int(vocab)
        self.seed = _mix((int(seed) & M64) ^ 0x6B73686172642D74)
        s = _Stream(_mix((self.seed + 1) & M64))
        self.likely, self.unlikely = [], []
        for _ in range(self.vocab):
            a = s.below(self.vocab)
            b = (a + 1 + s.below(self.vocab - 1)) % self.vocab if self.vocab > 1 else a
            self.likely.append(a)
            self.unlikely.append(b)

    def fill(self, first, count, seq):
        """Sequences first .. first+count-1: (ids, targets), lists of count*seq ints."""
        ids, targets = [], []
        likely, unlikely = self.likely, self.unlikely
        for i in range(count):
            s = _Stream(_mix(self.seed ^ _mix((first + i + 0x51) & M64)))
            tok = s.below(self.vocab)
            for _ in range(seq):
                nxt = likely[tok] if s.uniform() < self.LIKELY else unlikely[tok]
                ids.append(tok)
                targets.append(nxt)
                tok = nxt
        return ids, targets

    def entropy_floor(self):
        p = self.LIKELY
        return 0.0 if self.vocab < 2 else -(p * math.log(p) + (1 - p) * math.log(1 - p))


# --------------------------------------------------------------- model ----

def ffn_hidden(a):
    """The MLP's hidden width, kshard-train's rule (examples/train/train.cpp):
    --ffn-hidden if > 0, else 4 d (gpt2) or Llama's 8 d / 3 rounded up to a
    multiple of 256 (llama: d 2048 -> 5632, d 4096 -> 11008)."""
    if a.ffn_hidden:
        return a.ffn_hidden
    if a.arch == "gpt2":
        return 4 * a.width
    return (8 * a.width // 3 + 255) // 256 * 256


def kv_heads(a):
    """Key/value heads (llama; kshard-train's --kv-heads 0 = as many as --heads)."""
    return a.kv_heads or a.heads


def build_model(torch, nn, F, a):
    """kshard-train's model for --arch (see the docstring); returns the module.
    Every model has .embed, .layers, .final_norm and .head (None when tied:
    the head is then F.linear with the token table)."""
    return (build_llama if a.arch == "llama" else build_gpt2)(torch, nn, F, a)


def build_gpt2(torch, nn, F, a):
    d, heads = a.width, a.heads
    hd = d // heads
    ffn, eps = ffn_hidden(a), a.norm_eps

    class Embedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(a.vocab, d))
            self.position = nn.Parameter(torch.empty(a.seq, d))

        def forward(self, ids):
            return self.weight[ids] + self.position[: ids.shape[1]]

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, hd).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class LayerNormMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(d, eps=eps)
            self.fc1 = nn.Linear(d, ffn)
            self.fc2 = nn.Linear(ffn, d)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(self.ln(x)), approximate="tanh"))

    class TransformerLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d, eps=eps)
            self.attn = CausalSelfAttention()
            self.mlp = LayerNormMLP()

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(x)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = Embedding()
            self.layers = nn.ModuleList(TransformerLayer() for _ in range(a.layers))
            self.final_norm = nn.LayerNorm(d, eps=eps)
            # Tied: no head module (and no bias), the token table is the head.
            self.head = None if a.tie_embeddings else nn.Linear(d, a.vocab)

        def forward(self, ids):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            x = self.final_norm(x)
            return F.linear(x, self.embed.weight) if self.head is None else self.head(x)

    m = Model()
    nn.init.normal_(m.embed.weight, std=0.02)
    nn.init.normal_(m.embed.position, std=0.02)
    return m


def build_llama(torch, nn, F, a):
    d, heads, kv = a.width, a.heads, kv_heads(a)
    hd = d // heads
    ffn, eps = ffn_hidden(a), a.norm_eps

    def linear(n_in, n_out):
        # No bias anywhere (kshard's Linear(.., .., false)); weight
        # uniform(+-1/sqrt(fan_in)), PyTorch's default, the law kshard uses.
        return nn.Linear(n_in, n_out, bias=False)

    class RMSNorm(nn.Module):
        # kshard's RMSNorm: gamma (ones) only, y = x / sqrt(mean(x^2) + eps) * gamma.
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            # F.rms_norm as called: under autocast it runs on what autocast
            # gives it (the f32 residual stream); under FSDP2's param_dtype in
            # bf16 (accumulating in f32).
            return F.rms_norm(x, (d,), self.weight, eps)

    def rotate(x, cos, sin):
        # RoPE, rotate-half layout (GPT-NeoX, HF Llama, kshard's qkv_pack):
        # element i pairs with i + hd/2.
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            # ONE GEMM for [q | k | v]: rows q (heads*hd), then k (kv*hd), then v
            # (kv*hd), heads side by side (kshard's qkv layout).
            self.qkv = linear(d, (heads + 2 * kv) * hd)
            self.proj = linear(d, d)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).split((heads * hd, kv * hd, kv * hd), dim=-1)
            q = q.view(b, t, heads, hd).transpose(1, 2)
            k = k.view(b, t, kv, hd).transpose(1, 2)
            v = v.view(b, t, kv, hd).transpose(1, 2)
            cos, sin = cos[:t].to(q.dtype), sin[:t].to(q.dtype)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            # GQA without repeat copies: SDPA maps query head i to k/v head
            # i // (heads / kv), as kshard's pack does; scale 1/sqrt(hd).
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != heads)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class SwiGLUMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = RMSNorm()
            self.gate_up = linear(d, 2 * ffn)  # ONE GEMM: rows [gate | up], gate first
            self.down = linear(ffn, d)

        def forward(self, x):
            gate, up = self.gate_up(self.norm(x)).chunk(2, dim=-1)
            return self.down(F.silu(gate) * up)

    class LlamaLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = RMSNorm()
            self.attn = Attention()
            self.mlp = SwiGLUMLP()

        def forward(self, x, cos, sin):
            x = x + self.attn(self.norm1(x), cos, sin)
            return x + self.mlp(x)

    class Embedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(a.vocab, d))  # no position table

        def forward(self, ids):
            return self.weight[ids]

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = Embedding()
            self.layers = nn.ModuleList(LlamaLayer() for _ in range(a.layers))
            self.final_norm = RMSNorm()
            self.head = None if a.tie_embeddings else linear(d, a.vocab)
            # cos/sin of position x theta^(-2i/hd), i < hd/2, repeated for the
            # two halves, in f32 (as HF and kshard compute angles); not
            # parameters, not saved. Cast to the activations' dtype at use.
            inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64)
                                               .float() / hd))
            ang = torch.outer(torch.arange(a.seq, dtype=torch.int64).float(), inv_freq)
            ang = torch.cat((ang, ang), dim=-1)
            self.register_buffer("rope_cos", ang.cos(), persistent=False)
            self.register_buffer("rope_sin", ang.sin(), persistent=False)

        def forward(self, ids):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x, self.rope_cos, self.rope_sin)
            x = self.final_norm(x)
            return F.linear(x, self.embed.weight) if self.head is None else self.head(x)

    m = Model()
    nn.init.normal_(m.embed.weight, std=0.02)
    return m


def count_params(nn, model, a):
    """(params, matmul_params): see the docstring."""
    params = sum(p.numel() for p in model.parameters())  # a tied table once
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    if model.head is None:  # the tied head is still a d x vocab GEMM
        matmul += a.width * a.vocab
    return params, matmul


# ----------------------------------------------------------------- run ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tf32_state(torch):
    try:
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except Exception:  # a newer torch that refuses the legacy getter
        return None


TORCH_MODES = ("fsdp2", "eager", "compile", "compile-max")
# The compile modes and their torch.compile(mode=...) (None: inductor's default).
COMPILE_MODES = {"compile": None, "compile-max": "max-autotune-no-cudagraphs"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--torch-mode", default="fsdp2", choices=TORCH_MODES,
                    help="fsdp2: fully_shard (default); eager: one device, no FSDP; compile: "
                         "torch.compile of forward + loss; compile-max: the same with "
                         "mode=max-autotune-no-cudagraphs")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed warm-up steps of the compile modes, weights restored after "
                         "(default 2; the other modes take none)")
    ap.add_argument("--recipe", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--arch", default="gpt2", choices=["gpt2", "llama"],
                    help="kshard-train's --arch: gpt2 (LayerNorm, GELU MLP, learned positions, "
                         "biases; default) or llama (RMSNorm, SwiGLU, RoPE, GQA, no biases)")
    ap.add_argument("--kv-heads", type=int, default=0,
                    help="llama: key/value heads, dividing --heads (0: as many as --heads)")
    ap.add_argument("--ffn-hidden", type=int, default=0,
                    help="MLP hidden width (0: 4 x width for gpt2; for llama 8 x width / 3 "
                         "rounded up to a multiple of 256), kshard-train's rule")
    ap.add_argument("--rope-theta", type=float, default=None,
                    help="llama: base of the rotary embeddings' angles (default 10000)")
    ap.add_argument("--norm-eps", type=float, default=1e-5,
                    help="epsilon of the LayerNorms (gpt2) / RMSNorms (llama)")
    ap.add_argument("--tie-embeddings", action="store_true",
                    help="the head is the token table (one parameter; no head bias)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--clip", type=float, default=1.0, help="max global grad norm (0: off)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: gloo process group, for a smoke test without a GPU")
    ap.add_argument("--wrap", default="blocks", choices=["blocks", "units"],
                    help="blocks: fully_shard each TransformerLayer + the root (default); "
                         "units: also the embedding, final LayerNorm and head (as kshard)")
    ap.add_argument("--no-reshard-after-forward", action="store_true")
    ap.add_argument("--no-fused", action="store_true", help="AdamW(foreach) instead of fused")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 matmuls in fp32 (off: exact)")
    ap.add_argument("--bench", action="store_true", help="print a BENCH {json} line")
    a = ap.parse_args(argv)
    if a.width % a.heads:
        ap.error(f"--width {a.width} is not divisible by --heads {a.heads}")
    # kshard-train's checks (examples/train/train_options.cpp).
    if a.kv_heads < 0 or a.ffn_hidden < 0:
        ap.error("--kv-heads and --ffn-hidden must be >= 0 (0: the default)")
    if a.arch == "gpt2" and a.kv_heads:
        ap.error(f"--kv-heads {a.kv_heads} with --arch gpt2; expected --arch llama")
    if a.arch == "gpt2" and a.rope_theta is not None:
        ap.error("--rope-theta with --arch gpt2 (learned positions); expected --arch llama")
    if a.kv_heads and a.heads % a.kv_heads:
        ap.error(f"--kv-heads {a.kv_heads} does not divide --heads {a.heads}")
    a.rope_theta = 10000.0 if a.rope_theta is None else a.rope_theta
    if not (math.isfinite(a.rope_theta) and a.rope_theta > 1.0):
        ap.error(f"--rope-theta {a.rope_theta}: expected a finite base > 1")
    if not (math.isfinite(a.norm_eps) and a.norm_eps > 0.0):
        ap.error(f"--norm-eps {a.norm_eps}: expected a finite eps > 0")
    if a.arch == "llama" and (a.width // a.heads) % 2:
        ap.error(f"--width / --heads = {a.width // a.heads} is odd; expected an even head dim "
                 "(rotary embeddings rotate pairs)")
    for k in ("layers", "width", "heads", "seq", "batch", "steps"):
        if getattr(a, k) < 1:
            ap.error(f"--{k} must be >= 1")
    if a.vocab < 2:
        ap.error("--vocab must be >= 2")
    if a.torch_mode in COMPILE_MODES:
        a.warmup = 2 if a.warmup is None else a.warmup
        if a.warmup < 1:
            ap.error("--warmup must be >= 1 for a compile mode (else compile time is timed)")
    elif a.warmup:
        # fsdp2 and eager keep kshard-train's rule: no warm-up, step 1 excluded.
        ap.error(f"--warmup applies to the compile modes only, not --torch-mode {a.torch_mode}")
    else:
        a.warmup = 0
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if a.torch_mode != "fsdp2" and world > 1:
        ap.error(f"--torch-mode {a.torch_mode} runs on one device; WORLD_SIZE is {world} "
                 "(only fsdp2 runs under torchrun)")
    if a.torch_mode != "fsdp2" and a.wrap != "blocks":
        ap.error("--wrap applies to --torch-mode fsdp2 only")
    if a.torch_mode != "fsdp2" and a.no_reshard_after_forward:
        ap.error("--no-reshard-after-forward applies to --torch-mode fsdp2 only")
    return a


def main(argv=None):
    a = parse_args(argv)
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    mode = a.torch_mode
    sharded = mode == "fsdp2"
    cuda = a.device == "cuda"
    if sharded:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(free_port())
        rank = int(os.environ.setdefault("RANK", "0"))
        world = int(os.environ.setdefault("WORLD_SIZE", "1"))
        local_rank = int(os.environ.setdefault("LOCAL_RANK", str(rank)))
    else:
        # One device, no process group (parse_args refused WORLD_SIZE > 1).
        dist = None
        rank, world, local_rank = 0, 1, int(os.environ.get("LOCAL_RANK", "0"))

    if cuda:
        if not torch.cuda.is_available():
            sys.exit("fsdp2_twin: error: --device cuda but torch sees no GPU (use --device cpu)")
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
        if a.tf32:  # else torch's defaults: fp32 matmuls exact (no TF32)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    if sharded:
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
        mesh = init_device_mesh(device.type, (world,))

    torch.manual_seed(a.seed)
    with device:  # parameters created and initialised on the device directly
        model = build_model(torch, nn, F, a)
    # Counted before fully_shard (which turns the parameters into DTensor
    # shards); see the docstring for what each count includes.
    params, matmul_params = count_params(nn, model, a)

    if sharded:
        kw = {"mesh": mesh, "reshard_after_forward": not a.no_reshard_after_forward}
        if a.recipe == "bf16":
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32)
        if a.wrap == "units":
            # A tied table stays in the root: the head reads it after the
            # embedding's forward (kshard keeps its unit 0 unsharded likewise).
            units = ([model.final_norm] if model.head is None else
                     [model.embed, model.final_norm, model.head])
            for unit in units:
                fully_shard(unit, **kw)
        for layer in model.layers:
            fully_shard(layer, **kw)
        fully_shard(model, **kw)

    def make_opt():
        opt_kw = {"lr": a.lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
        if a.no_fused:
            return torch.optim.AdamW(model.parameters(), foreach=True, **opt_kw)
        return torch.optim.AdamW(model.parameters(), fused=True, **opt_kw)

    opt = make_opt()

    # Forward + loss as one function: the unit torch.compile sees in the
    # compile modes (the head's logits and the f32 cross entropy in one graph).
    def forward_loss(ids, tgt):
        logits = model(ids)
        return F.cross_entropy(logits.float().view(-1, a.vocab), tgt.view(-1))

    def autocast_forward_loss(ids, tgt):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return forward_loss(ids, tgt)

    # FSDP2 casts through its MixedPrecisionPolicy; without it, bf16 is
    # autocast over forward + loss with the f32 parameters as master, inside
    # the function so that a compile mode traces the autocast region too.
    fwd_loss = autocast_forward_loss if a.recipe == "bf16" and not sharded else forward_loss
    if mode in COMPILE_MODES:
        fwd_loss = torch.compile(fwd_loss, mode=COMPILE_MODES[mode])

    def train_step(opt, ids_h, tgt_h):
        ids = ids_h.to(device, non_blocking=True)
        tgt = tgt_h.to(device, non_blocking=True)
        loss = fwd_loss(ids, tgt)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                            a.clip if a.clip > 0 else float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, gn

    def all_reduce(t, op):
        if sharded:
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))

    def dynamo_graphs():
        # Graphs dynamo compiled so far (a recompile adds one); None where
        # this torch lacks the counter.
        try:
            from torch._dynamo.utils import counters
            return int(counters["stats"]["unique_graphs"])
        except Exception:
            return None

    task = MarkovTask(a.vocab, a.seed)
    # Rank r's slice of global step s: sequences (s * world + r) * batch ... + batch - 1.
    batches = [task.fill((s * world + rank) * a.batch, a.batch, a.seq) for s in range(a.steps)]
    batches = [(torch.tensor(i, dtype=torch.int64).view(a.batch, a.seq),
                torch.tensor(t, dtype=torch.int64).view(a.batch, a.seq)) for i, t in batches]
    if cuda:
        batches = [(i.pin_memory(), t.pin_memory()) for i, t in batches]

    tokens_per_step = float(a.batch * a.seq * world)
    root = rank == 0
    if root:
        how = {"fsdp2": f"FSDP2 fully_shard, wrap {a.wrap}",
               "eager": "one device, no FSDP",
               "compile": "one device, no FSDP, torch.compile(forward + loss)",
               "compile-max": "one device, no FSDP, torch.compile(forward + loss, "
                              "mode=max-autotune-no-cudagraphs)"}[mode]
        pg = ("nccl" if cuda else "gloo") if sharded else "no process group"
        prec = ("" if a.recipe == "fp32" else " (param_dtype bf16)" if sharded
                else " (autocast bf16, f32 master weights)")
        block = ("TransformerLayer" if a.arch == "gpt2" else "LlamaLayer") + \
            f"(d={a.width}, heads={a.heads}" + \
            (f", kv_heads={kv_heads(a)}, rope_theta={a.rope_theta:g}" if a.arch == "llama"
             else "") + f", ff={ffn_hidden(a)}, eps={a.norm_eps:g})"
        print(f"fsdp2_twin: torch-mode {mode} ({how}), {world} ranks, {a.device} ({pg}), "
              f"recipe {a.recipe}{prec}, arch {a.arch}, {a.layers} x {block}"
              f"{', tied embeddings' if a.tie_embeddings else ''}, vocab {a.vocab}, seq "
              f"{a.seq}, batch {a.batch}/rank, {params} params ({matmul_params} matmul), torch "
              f"{torch.__version__}", flush=True)
        print(f"task: Markov chain, 2 successors per token (p 0.8/0.2): uniform guess "
              f"{math.log(a.vocab):.3f} nats, floor {task.entropy_floor():.3f} nats", flush=True)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    compile_s = 0.0
    graphs_before = None
    if a.warmup:
        # Compile (and autotune) outside the timed steps. The weights go to the
        # host and come back in place after (no dropout, so no RNG to restore);
        # the optimizer is rebuilt, as it had no state before the warm-up. The
        # timed steps then start where kshard's do, on the same batches.
        saved = [p.detach().to("cpu", copy=True) for p in model.parameters()]
        if root:
            what = "compile, autotune" if mode == "compile-max" else "compile"
            print(f"warm-up: {a.warmup} untimed steps ({what}); weights restored after",
                  flush=True)
        sync()
        t0 = time.perf_counter()
        for w in range(a.warmup):
            loss, gn = train_step(opt, *batches[w % len(batches)])
            if root:
                print(f"warm-up {w + 1}/{a.warmup}  loss {float(loss.detach()):.4f}  "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)
        sync()
        compile_s = time.perf_counter() - t0
        del loss, gn
        with torch.no_grad():
            for p, s in zip(model.parameters(), saved):
                p.copy_(s)
        del saved
        opt = make_opt()
        graphs_before = dynamo_graphs()
        if root:
            print(f"warm-up: {compile_s:.1f} s (compile_s, excluded from tokens/s)", flush=True)

    loss_buf = torch.zeros(2, dtype=torch.float64, device=device)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    first_loss = last_loss = 0.0
    tps = []
    for step in range(a.steps):
        sync()
        t0 = time.perf_counter()
        loss, gn = train_step(opt, *batches[step])
        sync()
        seconds = time.perf_counter() - t0
        # Outside the timed region (kshard reduces its loss after the step too).
        loss_buf[0] = loss.detach().double()
        loss_buf[1] = seconds
        all_reduce(loss_buf[:1], "SUM")
        all_reduce(loss_buf[1:], "MAX")
        mean_loss = float(loss_buf[0]) / world
        step_tps = tokens_per_step / float(loss_buf[1])
        if step == 0:
            first_loss = mean_loss
        last_loss = mean_loss
        if step > 0 or a.steps == 1:
            tps.append(step_tps)
        if root:
            gnv = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
            peak = torch.cuda.max_memory_allocated() if cuda else 0
            print(f"step {step + 1:4d}/{a.steps}  loss {mean_loss:.4f}  grad_norm {gnv:.3f}  "
                  f"tokens/s {step_tps:10.0f}  peak/rank {peak / 2**20:.3f} MiB", flush=True)

    recompiles = None
    if graphs_before is not None:
        graphs_after = dynamo_graphs()
        recompiles = None if graphs_after is None else graphs_after - graphs_before
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    reserved = torch.cuda.max_memory_reserved() if cuda else 0
    pk = torch.tensor([float(peak), float(reserved)], dtype=torch.float64, device=device)
    all_reduce(pk, "MAX")
    tps_mean = sum(tps) / len(tps) if tps else 0.0
    # kshard takes the upper median (sorted[n // 2]); do the same.
    tps_median = sorted(tps)[len(tps) // 2] if tps else 0.0
    if root:
        print(f"summary: first_loss={first_loss:.4f} last_loss={last_loss:.4f} (uniform "
              f"{math.log(a.vocab):.3f}, floor {task.entropy_floor():.3f}) steps={a.steps}")
        print(f"summary: tokens/s mean {tps_mean:.0f} median {tps_median:.0f} (steps "
              f"2..{max(a.steps, 2)}, {tokens_per_step:.0f} tokens per step over {world} ranks)")
        print(f"summary: params={params} matmul_params={matmul_params}  peak per rank "
              f"{float(pk[0]) / 2**20:.3f} MiB (reserved {float(pk[1]) / 2**20:.3f} MiB)")
        if a.warmup:
            print(f"summary: torch-mode {mode}: compile_s {compile_s:.1f} ({a.warmup} warm-up "
                  f"steps, excluded from tokens/s), recompiles during the timed steps: "
                  f"{'unknown' if recompiles is None else recompiles}")
            if recompiles:
                print(f"fsdp2_twin: warning: {recompiles} dynamo graph(s) compiled during the "
                      "timed steps: their compile time is inside tokens/s", file=sys.stderr)
        if a.bench:
            rec = {
                "impl": "torch", "torch_mode": mode, "ranks": world, "mesh": f"[{world}]",
                "recipe": a.recipe, "arch": a.arch, "params": params,
                "matmul_params": matmul_params,
                "kv_heads": kv_heads(a) if a.arch == "llama" else None,
                "ffn_hidden": ffn_hidden(a), "tie_embeddings": a.tie_embeddings,
                "rope_theta": a.rope_theta if a.arch == "llama" else None,
                "norm_eps": a.norm_eps,
                "shard_size": world, "steps": a.steps,
                "tokens_per_step": tokens_per_step, "tokens_per_s": tps_mean,
                "tokens_per_s_median": tps_median,
                "tokens_per_s_stdev": statistics.pstdev(tps) if len(tps) > 1 else 0.0,
                "peak_bytes": float(pk[0]), "peak_reserved_bytes": float(pk[1]),
                "first_loss": first_loss, "last_loss": last_loss,
                "compile_s": compile_s, "warmup_steps": a.warmup,
                "recompiles_timed": recompiles,
                "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                "torch": torch.__version__, "wrap": a.wrap if sharded else None,
                "fused_adamw": not a.no_fused, "tf32": tf32_state(torch) if cuda else False,
            }
            print("BENCH " + json.dumps(rec), flush=True)
    if sharded:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
