#!/usr/bin/env bash
# make bench: ftune against PyTorch on the same shapes, interleaved in one
# run (the machine is shared and noisy), medians and ratios to BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
PREFILL=${PREFILL:-128}
DECODE=${DECODE:-64}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS
echo "writing random llama-110m models (f32, bf16) to $tmp" >&2
"$BUILD/ftune" init --preset llama-110m --dtype f32 "$tmp/f32" 2>/dev/null
"$BUILD/ftune" init --preset llama-110m --dtype bf16 "$tmp/bf16" 2>/dev/null
results=$tmp/results.jsonl
for r in $(seq "$ROUNDS"); do
    for dt in f32 bf16; do
        tdt=$([ $dt = f32 ] && echo float32 || echo bfloat16)
        echo "round $r: ftune $dt" >&2
        "$BUILD/bench_forward" "$tmp/$dt" "$PREFILL" "$DECODE" "$THREADS" 3 | sed "s/^{/{\"dtype\":\"$dt\",\"round\":$r,/" >> "$results"
        echo "round $r: pytorch $tdt" >&2
        /usr/bin/python3 bench/torch_bench.py --preset llama-110m --dtype "$tdt" --prefill "$PREFILL" --decode "$DECODE" \
            --threads "$THREADS" --runs 3 --json | sed "s/^{/{\"dtype\":\"$dt\",\"round\":$r,/" >> "$results"
    done
done
/usr/bin/python3 bench/summarize.py "$results" "$THREADS" "$PREFILL" "$DECODE" > BENCHMARKS.md.tmp
mv BENCHMARKS.md.tmp BENCHMARKS.md
cat BENCHMARKS.md
