#!/usr/bin/python3
"""gemm_summary.py — Markdown tables of bench/gemm.sh's lines (stdin): the
peaks, and per shape and thread count the median GFLOP/s of every engine, the
bf16 kernels' share of the machine's bf16 peak (MFU: the TDPBF16PS tile peak
where the amx level ran, else the VDPBF16PS one) and their ratio to the best
of oneDNN and PyTorch."""
import collections
import statistics
import sys

level = None  # the kernel level bench_gemm ran ours_bf16 on
peaks = collections.defaultdict(list)
gemm = collections.defaultdict(list)
order = []
for line in sys.stdin:
    f = line.rstrip("\n").split("\t")
    kv = dict(x.split("=", 1) for x in f[1:] if "=" in x)
    if f[0] == "cpu":
        level = kv.get("level", level)
    elif f[0] == "peak":
        peaks[(f[1], int(kv["threads"]))].append(float(kv["value"]))
    elif f[0] == "gemm":
        key = (int(kv["threads"]), kv["model"], kv["kind"], int(kv["T"]), int(kv["in"]), int(kv["out"]))
        if key not in order:
            order.append(key)
        gemm[key + (kv["engine"],)].append(float(kv["gflops"]))

med = lambda v: statistics.median(v) if v else None
print("| peak | threads | median | runs |\n|---|---|---|---|")
for (name, t), v in sorted(peaks.items()):
    print(f"| {name} | {t} | {med(v):.1f} | {len(v)} |")
engines = ["ours_f32", "ours_bf16", "onednn_bf16", "torch_bf16"]
for t in sorted({k[0] for k in order}):
    tile = level == "amx" and peaks.get(("tdpbf16_gflops", t))
    pk = med(peaks.get(("tdpbf16_gflops" if tile else "dpbf16_gflops", t), []))
    which = "TDPBF16PS (tile)" if tile else "VDPBF16PS"
    print(f"\n{t} thread(s), level {level}, GFLOP/s (median of rounds); MFU = ours_bf16 / the {which} peak on {t} thread(s)\n")
    print("| model | product | T | in→out | " + " | ".join(engines) + " | MFU | bf16 / best other |")
    print("|---|---|---|---|" + "---|" * (len(engines) + 2))
    for key in order:
        if key[0] != t:
            continue
        vals = [med(gemm.get(key + (e,), [])) for e in engines]
        cells = [f"{v:.1f}" if v is not None else "–" for v in vals]
        others = [v for v in vals[2:] if v is not None]
        ratio = f"{vals[1] / max(others):.2f}" if others and vals[1] else "–"
        mfu = f"{vals[1] / pk:.0%}" if pk and vals[1] else "–"
        print(f"| {key[1]} | {key[2]} | {key[3]} | {key[4]}→{key[5]} | " + " | ".join(cells) + f" | {mfu} | {ratio} |")
