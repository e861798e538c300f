#!/usr/bin/env bash
# make bench-real: prefill and decode of the two real GGUF models that
# scripts/fetch_models.sh keeps (SmolLM2-135M-Instruct Q4_1, Qwen2.5-Coder-
# 0.5B-Instruct Q4_K_M) with `ftune generate`, at the best kernel level (with
# decode's integer products, and without: "/widened") and at avx2,
# interleaved, ROUNDS rounds, 2 threads; decode against the read
# bandwidth bound (weight bytes per token over bench_gemm's measured read
# GB/s on 2 threads). Prints a Markdown table (BENCHMARKS.md's real-model
# section was made with it); medians over rounds.
set -u
BUILD=${BUILD:-build}
FT=$BUILD/ftune
D=${FTUNE_DATA:-../shared/data}
M=${FTUNE_MODELS:-$HOME/.cache/ftune/models}
ROUNDS=${ROUNDS:-3}
P=${P:-512}
N=${N:-64}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for f in SmolLM2-135M-Instruct.Q4_1.gguf qwen2.5-coder-0.5b-instruct-q4_k_m.gguf; do
    [ -f "$M/$f" ] || { echo "bench/real_models.sh: $M/$f is missing (scripts/setup.sh fetches it)" >&2; exit 1; }
done
gbs=$("$BUILD/bench_gemm" --peaks-only 2>/dev/null | awk -F'\t' '$2 == "read_gbs" && $3 == "threads=2" { sub("value=", "", $5); print $5 }' |
    sort -n | awk '{ v[n++] = $1 } END { if (n) print v[int((n - 1) / 2)] }')
best=$("$FT" -v 2>&1 | sed -n 's/^kernels: *\([a-z0-9]*\).*/\1/p' | head -1)
# a prompt of about P tokens of Shakespeare (~3.5 bytes a token)
prompt() { head -c $((P * 7 / 2)) "$D/text/tinyshakespeare/input.txt"; }
for round in $(seq "$ROUNDS"); do
    for f in SmolLM2-135M-Instruct.Q4_1.gguf qwen2.5-coder-0.5b-instruct-q4_k_m.gguf; do
        # decode's integer products (the default) and, on the best level, the widened reference
        for cfg in "$best:1" "$best:0" avx2:1; do
            lv=${cfg%:*} idot=${cfg#*:}
            out=$(FTUNE_CPU=$lv FTUNE_INT_DOT=$idot "$FT" generate -m "$M/$f" -p "$(prompt)" -n "$N" --temp 0 -t 2 -c 2048 2>&1 >/dev/null)
            [ "$idot" = 0 ] && lv="$lv/widened"
            pf=$(echo "$out" | sed -n 's/^prefill: *\([0-9]*\) tokens in .*(\([0-9.]*\) tokens\/s).*/\1 \2/p')
            dc=$(echo "$out" | sed -n 's/^decode: .*(\([0-9.]*\) tokens\/s).*/\1/p')
            echo "$f $lv $pf $dc" >> "$tmp/rows"
        done
    done
done
/usr/bin/python3 - "$tmp/rows" "$M" "${gbs:-0}" <<'PY'
import os, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
gbs = float(sys.argv[3])
print(f"| model | file MiB | kernel level | prefill tokens | prefill tok/s | decode tok/s | bound tok/s ({gbs:.1f} GB/s) | % of bound |")
print("|---|---|---|---|---|---|---|---|")
seen = []
for r in rows:
    if (r[0], r[1]) not in seen: seen.append((r[0], r[1]))
for f, lv in seen:
    rs = [r for r in rows if r[0] == f and r[1] == lv]
    pt = rs[0][2]; pf = statistics.median(float(r[3]) for r in rs); dc = statistics.median(float(r[4]) for r in rs)
    mib = os.path.getsize(os.path.join(sys.argv[2], f)) / 2**20
    bound = gbs * 1e9 / (mib * 2**20) if gbs else float("nan")
    print(f"| {f} | {mib:.0f} | {lv} | {pt} | {pf:.1f} | {dc:.1f} | {bound:.1f} | {100 * dc / bound:.0f}% |")
PY
