#!/usr/bin/python3
"""torch_bench.py — the PyTorch side of the inference benchmark: a random-weight
Llama of a given shape, built directly in torch, timed on prefill (one batched
forward of N tokens) and greedy decode (one token at a time with a KV cache).

  torch_bench.py --preset llama-110m --dtype float32|bfloat16 --prefill 128 --decode 64 --threads 2 --json

Prefill computes the logits of the last position only (what generation needs);
its tokens/s is the median over --runs runs. Decode starts after a prefill and
times --decode steps; its tokens/s is the median over --runs runs.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch_common

# a 1024-token cache is all the inference benchmark needs
PRESETS = {name: dict(p, ctx=min(p["ctx"], 1024)) for name, p in torch_common.PRESETS.items()}


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="llama-110m", choices=sorted(PRESETS))
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--prefill", type=int, default=128, help="prompt tokens")
    ap.add_argument("--decode", type=int, default=64, help="generated tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5, help="timed repetitions (median reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--omp-wait", default="passive", choices=["passive", "active"],
                    help="OMP_WAIT_POLICY: idle OpenMP threads spinning (active) steal the cores "
                         "that OpenBLAS's own threads need; passive is faster here")
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    return ap.parse_args()


args = parse()
torch_common.set_thread_env(args.threads, args.omp_wait)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, p, dtype):
        super().__init__()
        C, NH, NKV = p["dim"], p["n_heads"], p["n_kv_heads"]
        HS = C // NH
        self.NH, self.NKV, self.HS = NH, NKV, HS
        mk = lambda o, i: nn.Linear(i, o, bias=False, dtype=dtype)  # noqa: E731
        self.wq, self.wk, self.wv, self.wo = mk(NH * HS, C), mk(NKV * HS, C), mk(NKV * HS, C), mk(C, NH * HS)
        self.w1, self.w3, self.w2 = mk(p["hidden"], C), mk(p["hidden"], C), mk(C, p["hidden"])
        self.n1 = nn.Parameter(torch.ones(C, dtype=dtype))
        self.n2 = nn.Parameter(torch.ones(C, dtype=dtype))
        # KV cache: (NKV, ctx, HS), filled up to the current position
        self.register_buffer("kc", torch.zeros(NKV, p["ctx"], HS, dtype=dtype), persistent=False)
        self.register_buffer("vc", torch.zeros(NKV, p["ctx"], HS, dtype=dtype), persistent=False)

    @staticmethod
    def norm(x, w):
        xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w

    @staticmethod
    def rope(x, cos, sin):  # x (heads, T, HS), rotate-half layout
        h = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin

    def forward(self, x, pos, cos, sin):
        """x (T, C) at positions pos..pos+T-1 -> (T, C); extends the cache."""
        T = x.shape[0]
        NH, NKV, HS = self.NH, self.NKV, self.HS
        h = self.norm(x, self.n1)
        q = self.rope(self.wq(h).view(T, NH, HS).transpose(0, 1), cos, sin)    # (NH, T, HS)
        k = self.rope(self.wk(h).view(T, NKV, HS).transpose(0, 1), cos, sin)   # (NKV, T, HS)
        v = self.wv(h).view(T, NKV, HS).transpose(0, 1)
        self.kc[:, pos:pos + T] = k
        self.vc[:, pos:pos + T] = v
        S = pos + T
        K, Vv = self.kc[:, :S], self.vc[:, :S]                                   # (NKV, S, HS)
        qg = q.reshape(NKV, NH // NKV * T, HS)                                   # heads grouped by kv head
        att = (qg @ K.transpose(1, 2)).view(NKV, NH // NKV, T, S) * (1.0 / math.sqrt(HS))
        if T > 1:
            mask = torch.arange(S)[None, :] > (pos + torch.arange(T))[:, None]
            att = att.masked_fill(mask, float("-inf"))
        att = (att.float() if att.dtype != torch.float64 else att).softmax(-1).to(x.dtype).view(NKV, NH // NKV * T, S)
        y = (att @ Vv).view(NH, T, HS).transpose(0, 1).reshape(T, NH * HS)
        x = x + self.wo(y)
        h = self.norm(x, self.n2)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Model(nn.Module):
    def __init__(self, p, dtype):
        super().__init__()
        self.p = p
        self.emb = nn.Embedding(p["vocab"], p["dim"], dtype=dtype)
        self.blocks = nn.ModuleList(Block(p, dtype) for _ in range(p["n_layers"]))
        self.norm = nn.Parameter(torch.ones(p["dim"], dtype=dtype))
        self.head = nn.Linear(p["dim"], p["vocab"], bias=False, dtype=dtype)
        self.head.weight = self.emb.weight   # tied, as in llama2.c's stories models
        cos, sin = torch_common.rope_tables(p, dtype)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens, pos):
        """tokens (T,) at positions pos.. -> logits of the last position (V,)."""
        T = tokens.shape[0]
        x = self.emb(tokens)
        cos, sin = self.cos[pos:pos + T], self.sin[pos:pos + T]
        for b in self.blocks:
            x = b(x, pos, cos, sin)
        return self.head(Block.norm(x[-1:], self.norm))[0]


def blas_libraries():
    """Shared libraries with 'blas' in their name mapped into this process."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "blas" in os.path.basename(path).lower():
                    libs.add(os.path.realpath(path))
    except OSError:
        pass
    return sorted(libs)


def matmul_gflops(n=1024, dtype=torch.float32, reps=5):
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def main():
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    p = PRESETS[args.preset]
    dtype = getattr(torch, args.dtype)
    if args.prefill < 1 or args.decode < 0 or args.prefill + args.decode > p["ctx"]:
        sys.exit(f"torch_bench: prefill {args.prefill} + decode {args.decode} must fit in ctx {p['ctx']}")
    model = Model(p, dtype).eval()
    with torch.no_grad():
        for name, t in model.named_parameters():
            if "norm" in name or name.endswith(".n1") or name.endswith(".n2"):
                t.copy_(1.0 + 0.1 * torch.randn_like(t, dtype=torch.float32).to(dtype))
            else:
                t.copy_((0.02 * torch.randn(t.shape)).to(dtype))
    n_params = sum(t.numel() for t in model.parameters())
    prompt = torch.randint(0, p["vocab"], (args.prefill,))

    with torch.inference_mode():
        model(prompt, 0)   # warm-up: allocator, thread pool, kernels
        pre = []
        for _ in range(args.runs):
            t = time.perf_counter()
            logits = model(prompt, 0)
            pre.append(time.perf_counter() - t)
        dec = []
        for _ in range(args.runs if args.decode else 0):
            logits = model(prompt, 0)
            tok = int(logits.argmax())
            t = time.perf_counter()
            for i in range(args.decode):
                logits = model(torch.tensor([tok]), args.prefill + i)
                tok = int(logits.argmax())
            dec.append(time.perf_counter() - t)
        gf32 = matmul_gflops(1024, torch.float32)
        gfdt = matmul_gflops(1024, dtype) if dtype != torch.float32 else None

    res = {
        "engine": "pytorch",
        "preset": args.preset,
        "dtype": args.dtype,
        "prefill": args.prefill,
        "decode": args.decode,
        "prefill_tok_s": round(args.prefill / statistics.median(pre), 2),
        "decode_tok_s": round(args.decode / statistics.median(dec), 2) if dec else None,
        "threads": args.threads,
        "omp_wait": args.omp_wait,
        "torch": torch.__version__,
        "n_params": n_params,
        "matmul1024_f32_gflops": round(gf32, 1),
        **({f"matmul1024_{args.dtype}_gflops": round(gfdt, 1)} if gfdt else {}),
        "loadavg_1m": round(os.getloadavg()[0], 2),   # other work on the machine skews the numbers
        "blas": [os.path.basename(x) for x in blas_libraries()],
    }
    if not args.json:
        print(f"# {args.preset} ({n_params / 1e6:.1f}M params) {args.dtype}, {args.threads} threads; "
              f"BLAS libraries loaded: {', '.join(blas_libraries()) or 'none'}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
