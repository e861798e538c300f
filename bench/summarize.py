#!/usr/bin/python3
"""summarize.py — turns bench/run.sh's JSON lines into BENCHMARKS.md:
medians over rounds per engine and dtype, and ftune/PyTorch ratios."""
import datetime
import json
import platform
import statistics
import subprocess
import sys

path, threads, prefill, decode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [json.loads(line) for line in open(path) if line.strip()]


def med(engine, dtype, key):
    v = [r[key] for r in rows if r["engine"] == engine and r["dtype"] == dtype and key in r]
    return statistics.median(v) if v else float("nan")


cpu = "unknown"
try:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            cpu = line.split(":", 1)[1].strip()
except OSError:
    pass
torch_ver = next((r.get("torch") for r in rows if r["engine"] == "pytorch"), "?")
out = []
out.append("# Benchmarks\n")
out.append(f"Measured {datetime.date.today().isoformat()} on {cpu}, {threads} threads, "
           f"{platform.system()} {platform.release()}; PyTorch {torch_ver} (Debian, OpenBLAS).")
out.append("Command: `make bench` (bench/run.sh). Engines run interleaved, "
           f"{max(r['round'] for r in rows)} rounds; each number is the median over rounds of per-round medians.\n")
out.append("## Inference: random-weight llama-110m (dim 768, 12 layers, 12 heads, vocab 32000)\n")
out.append(f"Prefill: one batched forward of {prefill} tokens. Decode: {decode} tokens one at a time with the KV cache.\n")
out.append("| weights | ftune prefill tok/s | PyTorch prefill tok/s | ratio | ftune decode tok/s | PyTorch decode tok/s | ratio | ftune decode weight GB/s | read bandwidth GB/s |")
out.append("|---|---|---|---|---|---|---|---|---|")
for dt in ("f32", "bf16"):
    fp, tp = med("ftune", dt, "prefill_tok_s"), med("pytorch", dt, "prefill_tok_s")
    fd, td = med("ftune", dt, "decode_tok_s"), med("pytorch", dt, "decode_tok_s")
    gbs, bw = med("ftune", dt, "decode_weight_gb_s"), med("ftune", dt, "read_bw_gb_s")
    out.append(f"| {dt} | {fp:.0f} | {tp:.0f} | {fp / tp:.2f}x | {fd:.1f} | {td:.1f} | {fd / td:.2f}x | {gbs:.1f} | {bw:.1f} |")
out.append("")
out.append("Decode weight GB/s = bytes of weights (as stored) × decode tokens/s: how close decode comes to "
           "streaming the weights at the machine's measured read bandwidth (summing a 1 GiB buffer).")
print("\n".join(out))
