#!/usr/bin/python3
"""summarize.py — turns bench/run.sh's JSON lines into the top of
BENCHMARKS.md: the peaks measured in the run, inference (prefill, decode)
and training rows with ftune/PyTorch ratios, the issue's targets and each
row's MFU (model FLOPs per second over the measured VDPBF16PS peak on the
run's threads).

  summarize.py RESULTS.jsonl THREADS HAS_AMX"""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

path, threads, has_amx = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
rows = [json.loads(line) for line in open(path) if line.strip()]
for r in rows:
    # the Python scripts' own "dtype" (float32, bfloat16) follows run.sh's tag
    # in their line, so it is the one json.loads keeps: name it as ftune does
    if "dtype" in r:
        r["dtype"] = {"float32": "f32", "bfloat16": "bf16"}.get(r["dtype"], r["dtype"])

# The shapes of `ftune init --preset` (and of the PyTorch scripts).
PRESETS = {
    "llama-110m": dict(C=768, L=12, NH=12, NKV=12, F=2048, V=32000),
    "llama-3.2-1b": dict(C=2048, L=16, NH=32, NKV=8, F=8192, V=128256),
    "stories260K": dict(C=64, L=5, NH=8, NKV=4, F=172, V=512),
}


def shapes(p):
    s = PRESETS[p]
    C, L, NH, NKV, F, V = s["C"], s["L"], s["NH"], s["NKV"], s["F"], s["V"]
    HS = C // NH
    q, kv = NH * HS, NKV * HS
    lin = L * (C * q + 2 * C * kv + q * C + 3 * C * F)          # the layers' Linear weights
    adapters = L * ((C + q) + 2 * (C + kv) + (q + C) + 2 * (C + F) + (F + C))   # sum of (in + out)
    return dict(lin=lin, head=V * C, adapters=adapters, L=L, q=q)


def attn_fwd(p, T):
    """Causal attention's forward FLOPs per token, averaged over a row of T:
    QKᵀ and PV, 2·HS each per (head, key), (T+1)/2 keys on average."""
    s = shapes(p)
    return 2 * 2 * s["L"] * s["q"] * (T + 1) / 2


def train_flops_per_token(p, T, mode, R):
    """Full: 6 FLOPs per weight (forward 2, dX 2, dW 2). LoRA over a frozen
    base: forward 2N, backward to the input 2N, no dW of the base; the
    adapters 6·R·(in + out) each (forward, dX, dA/dB). Attention: its
    forward, and twice that backward (dQ, dK, dV, dP)."""
    s = shapes(p)
    n = s["lin"] + s["head"]
    base = 6 * n if mode == "full" else 4 * n + 6 * R * s["adapters"]
    return base + 3 * attn_fwd(p, T)


def prefill_flops(p, T):
    """One forward of T tokens, logits of the last position only."""
    s = shapes(p)
    return T * (2 * s["lin"] + attn_fwd(p, T)) + 2 * s["head"]


def med(bench, engine, key, **match):
    v = [r[key] for r in rows if r.get("bench") == bench and r.get("engine") == engine and r.get(key) is not None
         and all(r.get(k) == x for k, x in match.items())]
    return statistics.median(v) if v else float("nan")


def ratio(bench, key, **match):
    """Median over rounds of each round's ftune/PyTorch ratio (the two runs of a
    round shared the machine's load)."""
    rs = []
    for rd in sorted({x["round"] for x in rows if "round" in x}):
        f, q = med(bench, "ftune", key, round=rd, **match), med(bench, "pytorch", key, round=rd, **match)
        if f == f and q == q and q > 0:
            rs.append(f / q)
    return statistics.median(rs) if rs else float("nan")


def peak(kind, t):
    v = [r["value"] for r in rows if r.get("bench") == "peak" and r["kind"] == kind and r["threads"] == t]
    return statistics.median(v) if v else float("nan")


def pct(x):
    return f"{100 * x:.0f}%" if x == x else "n/a"


def num(x, f="{:.0f}"):
    return f.format(x) if x == x else "n/a"


cpu = "unknown"
try:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            cpu = line.split(":", 1)[1].strip()
except OSError:
    pass
torch_ver = next((r.get("torch") for r in rows if r.get("engine") == "pytorch"), "?")
cores = sorted({r["blas_core"] for r in rows if r.get("blas_core") and r.get("engine") == "pytorch"})
loads = [r["loadavg_1m"] for r in rows if "loadavg_1m" in r]
n_rounds = max((r["round"] for r in rows if r.get("bench") != "peak"), default=0)
# the bf16 peak MFU is measured against: the tile unit's where the amx level ran (its peak was measured)
tile_peak = has_amx and peak("tdpbf16_gflops", threads) == peak("tdpbf16_gflops", threads)
peak_name = "TDPBF16PS (AMX tile)" if tile_peak else "VDPBF16PS"
bf16_peak = peak("tdpbf16_gflops" if tile_peak else "dpbf16_gflops", threads) * 1e9
out = ["# Benchmarks\n"]
out.append(f"Measured {datetime.date.today().isoformat()} on {cpu}, {threads} threads, "
           f"{platform.system()} {platform.release()}; PyTorch {torch_ver} (Debian, OpenBLAS, oneDNN).")
out.append(f"Command: `make bench` (bench/run.sh). Engines run interleaved (ftune, then PyTorch, row by row), "
           f"{n_rounds} round{'s' if n_rounds != 1 else ''}; each number is the median over rounds of per-round "
           "medians, each ratio the median of the rounds' ratios.")
out.append("ftune links no BLAS and no OpenMP: every Linear product goes through its own GEMM driver on its own "
           "thread pool.")
if cores:
    out.append(f"PyTorch's OpenBLAS kernels: {', '.join(cores)} (bench/run.sh sets OPENBLAS_CORETYPE "
               "when OpenBLAS does not recognise the CPU and would fall back to its SSE3 kernels).")
if loads:
    out.append(f"Machine load (1-minute load average, sampled at each PyTorch run): {min(loads):.1f} to "
               f"{max(loads):.1f} on {os.cpu_count()} cores: other work shares the machine, so "
               "compare the ratios more than the absolute numbers.")
out.append("")
out.append("## Peaks, measured in the same run\n")
out.append("bench_gemm --peaks-only (tests/bench_gemm.c), at the start and the end of the run; medians. MFU below is "
           f"model FLOPs per second over the {peak_name} peak on {threads} threads.\n")
out.append("| peak | 1 thread | " + (f"{threads} threads |" if threads > 1 else ""))
out.append("|---|---|" + ("---|" if threads > 1 else ""))
for kind, name in (("dpbf16_gflops", "AVX512-BF16 VDPBF16PS GFLOP/s"), ("fma_f32_gflops", "f32 FMA GFLOP/s"),
                   ("read_gbs", "memory read GB/s")):
    out.append(f"| {name} | {num(peak(kind, 1), '{:.1f}')} | " +
               (f"{num(peak(kind, threads), '{:.1f}')} |" if threads > 1 else ""))
if has_amx and peak("tdpbf16_gflops", 1) == peak("tdpbf16_gflops", 1):
    out.append(f"| AMX TDPBF16PS GFLOP/s | {num(peak('tdpbf16_gflops', 1), '{:.1f}')} | " +
               (f"{num(peak('tdpbf16_gflops', threads), '{:.1f}')} |" if threads > 1 else ""))
else:
    out.append("| AMX bf16 GFLOP/s | " + ("not measured: the amx level's probe failed here (ftune -v says why) |"
                                           if has_amx else "not on this CPU (no amx_bf16) |") +
               (" |" if threads > 1 else ""))

inf = []
for r in rows:
    if r.get("bench") == "infer" and (r["preset"], r["dtype"]) not in inf:
        inf.append((r["preset"], r["dtype"]))
if inf:
    out.append("")
    out.append("## Inference: random-weight models\n")
    out.append("Prefill: one batched forward of P tokens (logits of the last position). Decode: D tokens one at a "
               "time with the KV cache after it. bf16: ftune loads the model for compute dtype bf16 "
               "(ftune_load_opts.dtype), PyTorch runs the model in torch.bfloat16. Prefill model FLOPs = "
               "P·(2·N_layers + attention) + 2·V·C. Decode bound = read bandwidth (the better of bench_forward's "
               "probe and bench_gemm's peak) / bytes of weights, the tokens/s if every token streamed the weights once at that speed. "
               "Targets (issue #7): bf16 prefill ≥ 2× PyTorch bf16, bf16 decode ≥ 90% of the bound.\n")
    out.append("| model | dtype | P / D | ftune prefill tok/s | PyTorch | ratio | ftune MFU | PyTorch MFU | "
               "ftune decode tok/s | PyTorch | ratio | bound tok/s | ftune % of bound |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p, dt in inf:
        P = next(r["prefill"] for r in rows if r.get("bench") == "infer" and r["preset"] == p and "prefill" in r)
        D = next(r["decode"] for r in rows if r.get("bench") == "infer" and r["preset"] == p and "decode" in r)
        fp, tp = med("infer", "ftune", "prefill_tok_s", preset=p, dtype=dt), med("infer", "pytorch", "prefill_tok_s",
                                                                                  preset=p, dtype=dt)
        fd, td = med("infer", "ftune", "decode_tok_s", preset=p, dtype=dt), med("infer", "pytorch", "decode_tok_s",
                                                                                 preset=p, dtype=dt)
        # the better of the two probes (bench_forward's OpenMP sum, bench_gemm's
        # streams): the harder bound to meet
        bw = max(med("infer", "ftune", "read_bw_gb_s", preset=p, dtype=dt), peak("read_gbs", threads))
        wb = med("infer", "ftune", "weight_bytes", preset=p, dtype=dt)
        bound = bw * 1e9 / wb
        fl = prefill_flops(p, P) / P
        out.append(f"| {p} | {dt} | {P} / {D} | {num(fp)} | {num(tp)} | {ratio('infer', 'prefill_tok_s', preset=p, dtype=dt):.2f}x | "
                   f"{pct(fp * fl / bf16_peak)} | {pct(tp * fl / bf16_peak)} | {num(fd, '{:.1f}')} | {num(td, '{:.1f}')} | "
                   f"{ratio('infer', 'decode_tok_s', preset=p, dtype=dt):.2f}x | {num(bound, '{:.1f}')} | {pct(fd / bound)} |")

tr = []
for r in rows:
    if r.get("bench") == "train" and r.get("engine") == "ftune":
        k = (r["preset"], r["mode"], r["dtype"])
        if k not in tr:
            tr.append(k)
if tr:
    out.append("")
    out.append("## Training: random-weight models\n")
    out.append("One step = zero-grad, forward, cross-entropy over every position (targets = next tokens of random "
               "token rows), backward, global-norm clipping to 1, AdamW update. LoRA: r=16, alpha 16, dropout 0 on "
               "q,k,v,o,gate,up,down, frozen base; full: every weight. bf16: ftune computes the products in bf16 "
               "(ftune_train_opts.dtype, the model loaded for bf16), PyTorch runs forward under "
               "torch.autocast(\"cpu\", torch.bfloat16) with f32 master weights. Tokens/s = B·T / median step time. "
               "Peak RSS = ru_maxrss, model loading included. Model FLOPs per token: full 6·N; LoRA 4·N (forward 2N, "
               "backward to the input 2N, no weight gradient of the frozen base) + 6·r·Σ(in+out) over the adapters; "
               "N = the Linear weights with the (tied) LM head; plus causal attention, 3× its forward "
               "(2·2·L·C·(T+1)/2). Target (issue #7): LoRA ≥ 3× PyTorch bf16 tokens/s. ftune: bench/bench_train.c; "
               "PyTorch: bench/torch_train_bench.py.\n")
    out.append("| model | mode | dtype | B × T | trainable | ftune tok/s | PyTorch tok/s | ratio | ftune MFU | "
               "PyTorch MFU | ftune step s | PyTorch step s | ftune peak RSS MiB | PyTorch peak RSS MiB |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p, mode, dt in tr:
        m = dict(preset=p, mode=mode, dtype=dt)
        one = next(r for r in rows if r.get("bench") == "train" and r.get("engine") == "ftune" and
                   all(r.get(k) == x for k, x in m.items()))
        B, T, R = one["B"], one["T"], one.get("lora_r", 16)
        ft, pt = med("train", "ftune", "tok_s", **m), med("train", "pytorch", "tok_s", **m)
        fl = train_flops_per_token(p, T, mode, R)
        out.append(f"| {p} | {mode} | {dt} | {B} × {T} | {one['n_trainable']:,} | {num(ft)} | {num(pt)} | "
                   f"{ratio('train', 'tok_s', **m):.2f}x | {pct(ft * fl / bf16_peak)} | {pct(pt * fl / bf16_peak)} | "
                   f"{num(med('train', 'ftune', 'step_s', **m), '{:.2f}')} | "
                   f"{num(med('train', 'pytorch', 'step_s', **m), '{:.2f}')} | "
                   f"{num(med('train', 'ftune', 'peak_rss_mb', **m))} | {num(med('train', 'pytorch', 'peak_rss_mb', **m))} |")
print("\n".join(out))
