#!/usr/bin/python3
"""torch_gemm.py — PyTorch's bf16 matmul on the shapes of tests/bench_gemm.c
(Linear forward/backward and the rank-16 LoRA products of llama-110m and
llama-3.2-1b), printed in bench_gemm's line format (engine=torch_bf16).

  torch_gemm.py THREADS ROUNDS SECONDS

Each product is C = A @ B with bf16 operands (f32 accumulation inside
PyTorch's kernel, bf16 result, as autocast gives it); operands are made once,
outside the timing, in the layout PyTorch's Linear and its autograd use
(weights (out, in) seen transposed, gradients as transposed views).
"""
import sys
import time

import torch

R = 16


def shapes():
    for model, C, F in (("llama-110m", 768, 2048), ("llama-3.2-1b", 2048, 8192)):
        for T in (1, 128, 512, 2048):
            for i, o in ((C, F), (F, C)):
                yield model, "fwd", T, i, o
                if T > 1:
                    yield model, "dx", T, i, o
                    yield model, "dw", T, i, o
        for k in ("lora_u", "lora_out", "lora_dA", "lora_dB", "lora_g", "lora_dx"):
            yield model, k, 512, C, F


def operands(kind, T, IC, OC):
    bf = dict(dtype=torch.bfloat16)
    r = lambda *s: torch.randn(*s, **bf)
    if kind == "fwd":  # x (T, IC) @ W (OC, IC)ᵀ
        return r(T, IC), r(OC, IC).t()
    if kind == "dx":  # dy (T, OC) @ W (OC, IC)
        return r(T, OC), r(OC, IC)
    if kind == "dw":  # dyᵀ (OC, T) @ x (T, IC)
        return r(T, OC).t(), r(T, IC)
    if kind == "lora_u":
        return r(T, IC), r(R, IC).t()
    if kind == "lora_out":
        return r(T, R), r(OC, R).t()
    if kind == "lora_dA":
        return r(T, R).t(), r(T, IC)
    if kind == "lora_dB":
        return r(T, OC).t(), r(T, R)
    if kind == "lora_g":
        return r(T, OC), r(OC, R)
    if kind == "lora_dx":
        return r(T, R), r(R, IC)
    raise ValueError(kind)


def main():
    nt, rounds, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    torch.set_num_threads(nt)
    for rd in range(rounds):
        for model, kind, T, IC, OC in shapes():
            a, b = operands(kind, T, IC, OC)
            M, K, N = a.shape[0], a.shape[1], b.shape[1]
            with torch.no_grad():
                for s in (secs / 5, secs):
                    calls, t0 = 0, time.perf_counter()
                    while True:
                        torch.matmul(a, b)
                        calls += 1
                        t = time.perf_counter() - t0
                        if t >= s:
                            break
            print(f"gemm\tmodel={model}\tkind={kind}\tT={T}\tin={IC}\tout={OC}\tM={M}\tN={N}\tK={K}\tthreads={nt}"
                  f"\tround={rd}\tengine=torch_bf16\tgflops={2.0 * M * N * K / (t / calls) * 1e-9:.2f}", flush=True)


if __name__ == "__main__":
    main()
