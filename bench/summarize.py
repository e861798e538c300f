#!/usr/bin/python3
"""summarize.py — turns bench/run.sh's JSON lines into BENCHMARKS.md:
medians over rounds per engine and dtype (inference) or preset (LoRA
training), and ftune/PyTorch ratios."""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

path, threads, prefill, decode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [json.loads(line) for line in open(path) if line.strip()]
for r in rows:
    r.setdefault("bench", "infer")
    # torch_bench.py's own "dtype" (float32, bfloat16) follows run.sh's tag in
    # its line, so it is the one json.loads keeps: name it as ftune does
    if "dtype" in r:
        r["dtype"] = {"float32": "f32", "bfloat16": "bf16"}.get(r["dtype"], r["dtype"])


def med(bench, engine, key, **match):
    v = [r[key] for r in rows if r["bench"] == bench and r["engine"] == engine and key in r
         and r[key] is not None and all(r.get(k) == x for k, x in match.items())]
    return statistics.median(v) if v else float("nan")


def first(bench, engine, key, **match):
    return next((r[key] for r in rows if r["bench"] == bench and r["engine"] == engine and key in r
                 and all(r.get(k) == x for k, x in match.items())), None)


cpu = "unknown"
try:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            cpu = line.split(":", 1)[1].strip()
except OSError:
    pass
torch_ver = next((r.get("torch") for r in rows if r["engine"] == "pytorch"), "?")
cores = sorted({r["blas_core"] for r in rows if r.get("blas_core") and r["engine"] == "pytorch"})
loads = [r["loadavg_1m"] for r in rows if "loadavg_1m" in r]
out = []
out.append("# Benchmarks\n")
out.append(f"Measured {datetime.date.today().isoformat()} on {cpu}, {threads} threads, "
           f"{platform.system()} {platform.release()}; PyTorch {torch_ver} (Debian, OpenBLAS).")
out.append("Command: `make bench` (bench/run.sh). Engines run interleaved, "
           f"{max(r['round'] for r in rows)} rounds; each number is the median over rounds of per-round medians.")
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
out.append("## Inference: random-weight llama-110m (dim 768, 12 layers, 12 heads, vocab 32000)\n")
out.append(f"Prefill: one batched forward of {prefill} tokens. Decode: {decode} tokens one at a time with the KV cache.\n")
out.append("| weights | ftune prefill tok/s | PyTorch prefill tok/s | ratio | ftune decode tok/s | PyTorch decode tok/s | ratio | ftune decode weight GB/s | read bandwidth GB/s |")
out.append("|---|---|---|---|---|---|---|---|---|")
for dt in ("f32", "bf16"):
    fp, tp = med("infer", "ftune", "prefill_tok_s", dtype=dt), med("infer", "pytorch", "prefill_tok_s", dtype=dt)
    fd, td = med("infer", "ftune", "decode_tok_s", dtype=dt), med("infer", "pytorch", "decode_tok_s", dtype=dt)
    gbs, bw = med("infer", "ftune", "decode_weight_gb_s", dtype=dt), med("infer", "ftune", "read_bw_gb_s", dtype=dt)
    out.append(f"| {dt} | {fp:.0f} | {tp:.0f} | {fp / tp:.2f}x | {fd:.1f} | {td:.1f} | {fd / td:.2f}x | {gbs:.1f} | {bw:.1f} |")
out.append("")
out.append("Decode weight GB/s = bytes of weights (as stored) × decode tokens/s: how close decode comes to "
           "streaming the weights at the machine's measured read bandwidth (summing a 1 GiB buffer).")

presets = []
for r in rows:
    if r["bench"] == "train" and r["preset"] not in presets:
        presets.append(r["preset"])
if presets:
    out.append("")
    out.append("## LoRA training: random-weight f32 models, frozen base\n")
    out.append("LoRA r=8, alpha 16, dropout 0 on q,k,v,o,gate,up,down; AdamW on the adapters. One step = zero-grad, "
               "forward, cross-entropy over every position (targets = next tokens of random token rows), backward, "
               "global-norm clipping to 1, AdamW update. Tokens/s = B·T / median step time; the ratio is the median over rounds of "
               "each round's ftune/PyTorch ratio (the two runs of a round share the machine's load). Peak RSS = the "
               "process's ru_maxrss, model loading included (ftune maps the f32 weights from the file; PyTorch "
               "builds the model in memory). ftune: bench/bench_train.c (the public ftune_trainer_step); PyTorch: "
               "bench/torch_train_bench.py (nn.Linear + PEFT-style lora_A/lora_B, torch.optim.AdamW).\n")
    out.append("| model | B × T | trainable params | ftune tok/s | PyTorch tok/s | ratio | ftune step s | PyTorch step s | ftune peak RSS MiB | PyTorch peak RSS MiB |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for p in presets:
        ft, pt = med("train", "ftune", "tok_s", preset=p), med("train", "pytorch", "tok_s", preset=p)
        # engines of one round ran back to back under the same load: the ratio
        # is the median of the per-round ratios
        ratios = [f / q for f, q in ((med("train", "ftune", "tok_s", preset=p, round=r),
                                      med("train", "pytorch", "tok_s", preset=p, round=r))
                                     for r in sorted({x["round"] for x in rows})) if f == f and q == q]
        ratio = statistics.median(ratios) if ratios else float("nan")
        fs, ps = med("train", "ftune", "step_s", preset=p), med("train", "pytorch", "step_s", preset=p)
        fr, pr = med("train", "ftune", "peak_rss_mb", preset=p), med("train", "pytorch", "peak_rss_mb", preset=p)
        B, T = first("train", "ftune", "B", preset=p), first("train", "ftune", "T", preset=p)
        n = first("train", "ftune", "n_trainable", preset=p)
        out.append(f"| {p} | {B} × {T} | {n:,} | {ft:.0f} | {pt:.0f} | {ratio:.2f}x | {fs:.3f} | {ps:.3f} | "
                   f"{fr:.0f} | {pr:.0f} |")
print("\n".join(out))
