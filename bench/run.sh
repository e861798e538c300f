#!/usr/bin/env bash
# make bench: ftune against PyTorch on the same shapes, interleaved in one
# run (the machine is shared and noisy), medians and ratios to BENCHMARKS.md.
# Inference (prefill, decode) on llama-110m, then LoRA training steps on
# stories260K and llama-110m.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
PREFILL=${PREFILL:-128}
DECODE=${DECODE:-64}
# LoRA training: "preset B T timed-steps warmup-steps" per run
TRAIN_RUNS=${TRAIN_RUNS:-"stories260K 8 128 10 2;llama-110m 4 128 3 1"}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# ftune links no BLAS and no OpenMP (its own GEMM and thread pool; -t is its
# thread count). PyTorch does: its OpenMP pool and OpenBLAS read these, and
# bench_forward's bandwidth probe is an OpenMP loop.
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS
# PyTorch's OpenBLAS (0.3.21) falls back to its SSE3 "Prescott" kernels on CPUs
# it does not know (a family 6 model 207 Xeon): pick the AVX-512/AVX2 kernels
# for it, unless the caller chose.
torch_blas_core() {
    /usr/bin/python3 -c 'import ctypes; f = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
f.restype = ctypes.c_char_p; print(f().decode())' 2>/dev/null || echo unknown
}
if [ -z "${OPENBLAS_CORETYPE+x}" ] && [ "$(torch_blas_core)" = Prescott ]; then
    if grep -qw avx512_bf16 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Cooperlake
    elif grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell
    fi
    if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
        echo "OpenBLAS does not recognise this CPU: using OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE for PyTorch" >&2
    fi
fi
echo "writing random llama-110m models (f32, bf16) and a stories260K (f32) to $tmp" >&2
"$BUILD/ftune" init --preset llama-110m --dtype f32 "$tmp/f32" 2>/dev/null
"$BUILD/ftune" init --preset llama-110m --dtype bf16 "$tmp/bf16" 2>/dev/null
"$BUILD/ftune" init --preset stories260K --dtype f32 "$tmp/stories260K" 2>/dev/null
results=$tmp/results.jsonl
tag() { sed "s/^{/{\"bench\":\"$1\",$2/"; }
for r in $(seq "$ROUNDS"); do
    for dt in f32 bf16; do
        tdt=$([ $dt = f32 ] && echo float32 || echo bfloat16)
        echo "round $r: ftune $dt" >&2
        "$BUILD/bench_forward" "$tmp/$dt" "$PREFILL" "$DECODE" "$THREADS" 3 | tag infer "\"dtype\":\"$dt\",\"round\":$r," >> "$results"
        echo "round $r: pytorch $tdt" >&2
        /usr/bin/python3 bench/torch_bench.py --preset llama-110m --dtype "$tdt" --prefill "$PREFILL" --decode "$DECODE" \
            --threads "$THREADS" --runs 3 --json | tag infer "\"dtype\":\"$dt\",\"round\":$r," >> "$results"
    done
done
for r in $(seq "$ROUNDS"); do
    IFS=';' read -ra runs <<< "$TRAIN_RUNS"
    for run in "${runs[@]}"; do
        read -r preset B T steps warmup <<< "$run"
        model=$tmp/f32
        [ "$preset" = llama-110m ] || model=$tmp/$preset
        echo "round $r: LoRA training $preset B=$B T=$T: ftune" >&2
        "$BUILD/bench_train" "$model" "$B" "$T" "$steps" "$THREADS" "$warmup" |
            tag train "\"preset\":\"$preset\",\"round\":$r," >> "$results"
        echo "round $r: LoRA training $preset B=$B T=$T: pytorch" >&2
        /usr/bin/python3 bench/torch_train_bench.py --preset "$preset" --batch "$B" --ctx "$T" --steps "$steps" \
            --warmup "$warmup" --threads "$THREADS" --json | tag train "\"round\":$r," >> "$results"
    done
done
cp "$results" "$BUILD/bench-results.jsonl"   # the raw lines, to re-summarize without re-running
/usr/bin/python3 bench/summarize.py "$results" "$THREADS" "$PREFILL" "$DECODE" > BENCHMARKS.md.tmp
# sections measured by other scripts (bench/threads.sh) follow a marker line: keep them
[ -f BENCHMARKS.md ] && sed -n '/^<!-- measured by other scripts: kept by bench\/run.sh -->$/,$p' BENCHMARKS.md >> BENCHMARKS.md.tmp
mv BENCHMARKS.md.tmp BENCHMARKS.md
cat BENCHMARKS.md
