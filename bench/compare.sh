#!/usr/bin/env bash
# Before/after: runs bench_forward and bench_train of two build directories
# alternately in one sitting (the build that goes first alternates by round),
# on the same models, shapes and threads as bench/run.sh, and prints a Markdown
# table of medians over rounds and the median of each round's new/old ratio.
#   bash bench/compare.sh OLD_BUILD NEW_BUILD [ROUNDS=3]
#   env: THREADS (2) PREFILL (128) DECODE (64) TRAIN_RUNS (as bench/run.sh; "" for none)
# Both trees' bench programs take the same arguments (MODEL PREFILL DECODE
# THREADS RUNS; MODEL B T STEPS THREADS WARMUP) and print one JSON line. The
# models are written by the NEW build's `ftune init`, so both read the same files.
# A benchmark, not a test: the numbers depend on what else the machine runs.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then echo "usage: bash bench/compare.sh OLD_BUILD NEW_BUILD [ROUNDS]" >&2; exit 2; fi
OLD=$1 NEW=$2 ROUNDS=${3:-3}
THREADS=${THREADS:-2}
PREFILL=${PREFILL:-128}
DECODE=${DECODE:-64}
TRAIN_RUNS=${TRAIN_RUNS-"stories260K 8 128 10 2;llama-110m 4 128 3 1"}   # set but empty: inference only
for b in "$OLD" "$NEW"; do
    for p in bench_forward bench_train; do
        [ -x "$b/$p" ] || { echo "compare.sh: $b/$p not found (make $b/$p in that tree)" >&2; exit 1; }
    done
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# An OpenBLAS/OpenMP build (the old tree) reads these; a build without them ignores them.
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS
# OpenBLAS 0.3.21 falls back to its SSE3 kernels on CPUs it does not know: pick
# the same kernels bench/run.sh picks, unless the caller chose.
core=$("$OLD/bench_train" --blas-core)
if [ -z "${OPENBLAS_CORETYPE+x}" ] && [ "$core" = Prescott ]; then
    if grep -qw avx512_bf16 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Cooperlake
    elif grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell
    fi
fi
echo "old build's OpenBLAS kernels: $("$OLD/bench_train" --blas-core)" >&2
echo "writing random llama-110m models (f32, bf16) and a stories260K (f32) to $tmp" >&2
"$NEW/ftune" init --preset llama-110m --dtype f32 "$tmp/f32" 2>/dev/null
"$NEW/ftune" init --preset llama-110m --dtype bf16 "$tmp/bf16" 2>/dev/null
"$NEW/ftune" init --preset stories260K --dtype f32 "$tmp/stories260K" 2>/dev/null
res=$tmp/results.jsonl
tag() { sed "s/^{/{\"build\":\"$1\",\"round\":$2,\"row\":\"$3\",/" >> "$res"; }
IFS=';' read -ra runs <<< "$TRAIN_RUNS"
for r in $(seq "$ROUNDS"); do
    order="old new"; [ $((r % 2)) = 0 ] && order="new old"
    echo "round $r/$ROUNDS ($order), load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    for dt in f32 bf16; do
        for b in $order; do
            dir=$OLD; [ $b = new ] && dir=$NEW
            "$dir/bench_forward" "$tmp/$dt" "$PREFILL" "$DECODE" "$THREADS" 3 | tag $b "$r" "infer $dt"
        done
    done
    for run in "${runs[@]}"; do
        read -r preset B T steps warmup <<< "$run"
        model=$tmp/f32; [ "$preset" = llama-110m ] || model=$tmp/$preset
        # f32, LoRA r 8: what bench_train did before it took them (an older one ignores them)
        for b in $order; do
            dir=$OLD; [ $b = new ] && dir=$NEW
            "$dir/bench_train" "$model" "$B" "$T" "$steps" "$THREADS" "$warmup" f32 lora 8 | tag $b "$r" "LoRA train $preset ${B}x$T"
        done
    done
done
[ -n "${KEEP:-}" ] && cp "$res" "$KEEP"
/usr/bin/python3 - "$res" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def vals(row, build, key):
    return {r["round"]: r[key] for r in rows if r["row"] == row and r["build"] == build}
print("| benchmark | metric | old median | new median | new/old (median of per-round ratios) | per-round new/old |")
print("|---|---|---|---|---|---|")
seen = []
for r in rows:
    if r["row"] not in seen: seen.append(r["row"])
for row in seen:
    keys = ["prefill_tok_s", "decode_tok_s"] if row.startswith("infer") else ["tok_s", "peak_rss_mb"]
    for k in keys:
        o, n = vals(row, "old", k), vals(row, "new", k)
        ratios = [n[i] / o[i] for i in sorted(o) if i in n and o[i]]
        print(f"| {row} | {k} | {statistics.median(o.values()):.1f} | {statistics.median(n.values()):.1f} | "
              f"{statistics.median(ratios):.2f}x | {', '.join(f'{x:.2f}' for x in ratios)} |")
for row in seen:
    if row.startswith("LoRA"):
        for b in ("old", "new"):
            r = next(x for x in rows if x["row"] == row and x["build"] == b)
            print(f"\n{row} {b}: trainable {r['n_trainable']}, first/last loss {r['first_loss']:.4f}/{r['last_loss']:.4f}, threads {r['threads']}", end="")
print()
EOF
