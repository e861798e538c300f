#!/usr/bin/python3
"""torch_train_bench.py — the PyTorch side of the training benchmark: a
random-weight Llama of a preset shape in float32 (f32 master weights; with
--dtype bfloat16 the step runs under torch.autocast("cpu", bfloat16), as
mixed-precision training does), base weights frozen, LoRA
on all seven Linears as PEFT computes it (y = W·x + B·A·x · alpha/r, A
Kaiming-uniform, B zero, no dropout), AdamW on the adapters, timed on
optimizer steps over random (B, T) token batches whose targets are the next
tokens. A step is zero-grad, forward, cross-entropy, backward, global-norm
clipping to 1 and the AdamW update — what bench/bench_train.c times in ftune.
With --full every weight trains (no adapters).

  torch_train_bench.py --preset llama-110m --dtype bfloat16 --batch 4 --ctx 128 --steps 5 --threads 2 --json

Prints one JSON line: median step time, tokens/s = B·T / step, peak RSS.
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch_common

PRESETS = torch_common.PRESETS


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="llama-110m", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=4, help="rows per step (B)")
    ap.add_argument("--ctx", type=int, default=128, help="tokens per row (T)")
    ap.add_argument("--steps", type=int, default=5, help="timed optimizer steps (median reported)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="bfloat16: the step under torch.autocast('cpu', torch.bfloat16)")
    ap.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    ap.add_argument("--grad-checkpoint", action="store_true",
                    help="torch.utils.checkpoint around every block (non-reentrant: the frozen embedding's output "
                         "needs no grad), as Hugging Face's gradient_checkpointing")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-alpha", type=float, default=16.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--omp-wait", default="passive", choices=["passive", "active"],
                    help="OMP_WAIT_POLICY, as in bench/torch_bench.py")
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    return ap.parse_args()


args = parse()
torch_common.set_thread_env(args.threads, args.omp_wait)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint  # noqa: E402


class LoraLinear(nn.Module):
    """A frozen Linear with a PEFT-style adapter: base(x) + lora_B(lora_A(x)) · scaling."""

    def __init__(self, i, o, r, alpha):
        super().__init__()
        self.base = nn.Linear(i, o, bias=False)
        self.r = r
        if r == 0:   # full fine-tuning: a plain trainable Linear
            return
        self.base.weight.requires_grad_(False)
        self.lora_A = nn.Linear(i, r, bias=False)
        self.lora_B = nn.Linear(r, o, bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / r

    def forward(self, x):
        if self.r == 0:
            return self.base(x)
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling


def rmsnorm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


class Block(nn.Module):
    def __init__(self, p, r, alpha):
        super().__init__()
        C, NH, NKV = p["dim"], p["n_heads"], p["n_kv_heads"]
        HS = C // NH
        self.NH, self.NKV, self.HS = NH, NKV, HS
        mk = lambda o, i: LoraLinear(i, o, r, alpha)  # noqa: E731
        self.q_proj, self.k_proj, self.v_proj = mk(NH * HS, C), mk(NKV * HS, C), mk(NKV * HS, C)
        self.o_proj = mk(C, NH * HS)
        self.gate_proj, self.up_proj, self.down_proj = mk(p["hidden"], C), mk(p["hidden"], C), mk(C, p["hidden"])
        self.n1 = nn.Parameter(torch.ones(C), requires_grad=r == 0)
        self.n2 = nn.Parameter(torch.ones(C), requires_grad=r == 0)

    def forward(self, x, cos, sin, mask):
        """x (B, T, C) -> (B, T, C), causal attention within each row."""
        B, T, _ = x.shape
        NH, NKV, HS = self.NH, self.NKV, self.HS
        h = rmsnorm(x, self.n1)
        q = self.q_proj(h).view(B, T, NH, HS).transpose(1, 2)        # (B, NH, T, HS)
        k = self.k_proj(h).view(B, T, NKV, HS).transpose(1, 2)       # (B, NKV, T, HS)
        v = self.v_proj(h).view(B, T, NKV, HS).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if NKV != NH:
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))      # (B, NH, T, T)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * HS)
        x = x + self.o_proj(y)
        h = rmsnorm(x, self.n2)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Model(nn.Module):
    def __init__(self, p, r, alpha):
        super().__init__()
        self.emb = nn.Embedding(p["vocab"], p["dim"])
        self.blocks = nn.ModuleList(Block(p, r, alpha) for _ in range(p["n_layers"]))
        self.norm = nn.Parameter(torch.ones(p["dim"]), requires_grad=r == 0)
        self.emb.weight.requires_grad_(r == 0)   # the head is tied to it, as in the presets
        cos, sin = torch_common.rope_tables(p, torch.float32)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens):
        """tokens (B, T) -> logits (B, T, V)."""
        T = tokens.shape[1]
        x = self.emb(tokens)
        cos, sin = self.cos[:T], self.sin[:T]
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        for b in self.blocks:
            if args.grad_checkpoint and self.training:
                x = torch.utils.checkpoint.checkpoint(b, x, cos, sin, mask, use_reentrant=False)
            else:
                x = b(x, cos, sin, mask)
        return F.linear(rmsnorm(x, self.norm), self.emb.weight)


def openblas_core():
    """The kernel set the OpenBLAS mapped into this process picked ("Prescott"
    when it does not recognise the CPU), or None without OpenBLAS."""
    import ctypes
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libopenblas" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).openblas_get_corename
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_char_p
        return fn().decode()
    return None


def main():
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    p = PRESETS[args.preset]
    B, T = args.batch, args.ctx
    if B < 1 or T < 1 or T > p["ctx"] or args.steps < 1 or args.warmup < 0:
        sys.exit(f"torch_train_bench: need B >= 1, 1 <= T <= {p['ctx']}, steps >= 1")
    model = Model(p, 0 if args.full else args.lora_r, args.lora_alpha)
    with torch.no_grad():   # random base weights of the scale `ftune init` writes
        for name, t in model.named_parameters():
            if "lora_" in name:
                continue
            if name == "norm" or name.endswith(".n1") or name.endswith(".n2"):
                t.copy_(1.0 + 0.1 * torch.randn_like(t))
            else:
                t.copy_(0.02 * torch.randn_like(t))
    params = [t for t in model.parameters() if t.requires_grad]
    n_trainable = sum(t.numel() for t in params)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1234)

    times, losses = [], []
    for s in range(-args.warmup, args.steps):
        seq = torch.randint(0, p["vocab"], (B, T + 1), generator=gen)
        tokens, targets = seq[:, :-1], seq[:, 1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
            logits = model(tokens)
        loss = F.cross_entropy(logits.float().reshape(B * T, -1), targets.reshape(B * T))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        t1 = time.perf_counter()
        losses.append(loss.item())
        if s >= 0:
            times.append(t1 - t0)

    step_s = statistics.median(times)
    res = {
        "engine": "pytorch",
        "preset": args.preset,
        "dtype": args.dtype,
        "mode": "full" if args.full else "lora",
        "grad_checkpoint": args.grad_checkpoint,
        "lora_r": 0 if args.full else args.lora_r,
        "B": B,
        "T": T,
        "steps": args.steps,
        "threads": args.threads,
        "n_trainable": n_trainable,
        "step_s": round(step_s, 4),
        "tok_s": round(B * T / step_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "first_loss": round(losses[0], 4),
        "last_loss": round(losses[-1], 4),
        "torch": torch.__version__,
        "blas_core": openblas_core(),
        "loadavg_1m": round(os.getloadavg()[0], 2),   # other work on the machine skews the numbers
    }
    if not args.json:
        print(f"# {args.preset} LoRA r={args.lora_r} on q,k,v,o,gate,up,down ({n_trainable} trainable), "
              f"B={B} T={T}, {args.threads} threads")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
