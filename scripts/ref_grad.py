#!/usr/bin/python3
"""ref_grad.py — the PyTorch float64 reference for one training step: the
summed next-token cross-entropy of a batch and the autograd gradients of
(summed loss / n_norm), with LoRA adapters (PEFT's formula) or with every
weight trainable (full fine-tuning).

  ref_grad.py --model HF_DIR --in IN.safetensors --out OUT.safetensors

IN holds I32 tensors "tokens", "targets" (-1 = ignored), "pos" (position ids,
reset per packed document) and optionally "doc" (document ids: a query sees
only keys of its own document), all (B, T); in LoRA mode also the F32 adapter
tensors under their PEFT names (...q_proj.lora_A.weight, ...lora_B.weight).
Its __metadata__: "mode" ("lora" or "full"), "n_norm" (the loss divisor),
and for LoRA "r", "alpha", "rslora" ("0"/"1"); for full mode optionally
"want" (comma-separated names whose gradients to write; default all).
OUT gets F64 tensors: "loss_sum" (1) and each gradient under its name.

The forward is ref_llama.py's, rewritten only where a training batch needs
more: per-row position ids, a document mask, and the adapters.
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_llama as R  # noqa: E402

PEFT_PREFIX = "base_model.model."


def lora_linear(x, p, name, lora, scale):
    """x @ W^T (+ b) + scale * (x @ A^T) @ B^T when name has an adapter."""
    y = R.linear(x, p, name)
    key = PEFT_PREFIX + name
    if key + ".lora_A.weight" in lora:
        A, B = lora[key + ".lora_A.weight"], lora[key + ".lora_B.weight"]
        y = y + scale * ((x @ A.t()) @ B.t())
    return y


def forward_loss_sum(model, lora, scale, tokens, targets, pos, doc):
    """Summed cross-entropy over targets != -1. tokens, targets, pos, doc: (B, T)."""
    cfg, p = model.cfg, model.params
    B, T = tokens.shape
    NH, NKV, HS = cfg.NH, cfg.NKV, cfg.HS
    x = p["model.embed_tokens.weight"][tokens]                                   # (B, T, C)
    ang = pos.to(torch.float64)[..., None] * R.rope_inv_freq(cfg)[None, None, :]  # (B, T, HS/2)
    ang = torch.cat([ang, ang], dim=-1)[:, None]                                  # (B, 1, T, HS)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    allowed = causal[None] & (doc[:, :, None] == doc[:, None, :])                 # (B, T, T)
    for l in range(cfg.L):
        pre = f"model.layers.{l}."
        h = R.rmsnorm(x, p[pre + "input_layernorm.weight"], cfg.eps)
        a = pre + "self_attn."
        q = lora_linear(h, p, a + "q_proj", lora, scale).view(B, T, NH, HS).transpose(1, 2)
        k = lora_linear(h, p, a + "k_proj", lora, scale).view(B, T, NKV, HS).transpose(1, 2)
        v = lora_linear(h, p, a + "v_proj", lora, scale).view(B, T, NKV, HS).transpose(1, 2)
        q, k = R.apply_rope(q, cos, sin), R.apply_rope(k, cos, sin)
        rep = NH // NKV
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        att = att.masked_fill(~allowed[:, None], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * HS)
        x = x + lora_linear(y, p, a + "o_proj", lora, scale)
        h = R.rmsnorm(x, p[pre + "post_attention_layernorm.weight"], cfg.eps)
        m = pre + "mlp."
        g = F.silu(lora_linear(h, p, m + "gate_proj", lora, scale)) * lora_linear(h, p, m + "up_proj", lora, scale)
        x = x + lora_linear(g, p, m + "down_proj", lora, scale)
    x = R.rmsnorm(x, p["model.norm.weight"], cfg.eps)
    logits = x @ model.lm_head.t()
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-1, reduction="sum")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--in", dest="inp", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    _, meta, _ = R.read_safetensors_header(args.inp)
    t = {k: v for k, (v, _) in R.load_safetensors(args.inp).items()}
    tokens, targets, pos = (t[k].to(torch.long) for k in ("tokens", "targets", "pos"))
    doc = t["doc"].to(torch.long) if "doc" in t else torch.zeros_like(tokens)
    mode, n_norm = meta["mode"], float(meta["n_norm"])
    model = R.load_model(args.model, torch.float64, requires_grad=(mode == "full"))
    lora, scale = {}, 0.0
    if mode == "lora":
        r, alpha = int(meta["r"]), float(meta["alpha"])
        scale = alpha / (math.sqrt(r) if meta.get("rslora") == "1" else r)
        lora = {k: v.to(torch.float64).requires_grad_(True) for k, v in t.items() if ".lora_" in k}
        trainable = lora
    else:
        want = meta.get("want")
        names = want.split(",") if want else list(model.params)
        trainable = {n: model.params[n] for n in names}
    loss_sum = forward_loss_sum(model, lora, scale, tokens, targets, pos, doc)
    (loss_sum / n_norm).backward()
    out = [("loss_sum", "F64", [1], np.array([loss_sum.item()], "<f8").tobytes())]
    for name, v in trainable.items():
        g = v.grad if v.grad is not None else torch.zeros_like(v)
        out.append((name, "F64", list(g.shape), g.detach().numpy().astype("<f8").tobytes()))
    R.write_safetensors(args.out, out)


if __name__ == "__main__":
    main()
