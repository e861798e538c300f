#!/usr/bin/env bash
# The matrix-product benchmark: this machine's peaks, then ftune's kernels
# (f32, and bf16 on VDPBF16PS), oneDNN's bf16 matmul (when bench_gemm was
# built with DNNL=1) and PyTorch's bf16 matmul on the Linear and LoRA shapes
# of llama-110m and llama-3.2-1b, the C and the Python programs alternating
# round by round in one sitting; prints Markdown tables of the medians.
#   make bench-gemm          (or: bash bench/gemm.sh, after make build/bench_gemm)
#   env: THREADS (1 2)  ROUNDS (3)  SECS (0.1 s per measurement)
# A benchmark, not a test: the numbers depend on what else the machine runs.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
THREADS=${THREADS:-"1 2"}
ROUNDS=${ROUNDS:-3}
SECONDS_PER=${SECS:-0.1}
[ -x "$BUILD/bench_gemm" ] || { echo "gemm.sh: $BUILD/bench_gemm not found (make $BUILD/bench_gemm)" >&2; exit 1; }
# oneDNN in Debian runs on OpenMP (libgomp): no spinning between calls, and
# its thread count from omp_set_num_threads (bench_gemm sets it)
export OMP_WAIT_POLICY=PASSIVE
out=$(mktemp); trap 'rm -f "$out"' EXIT
for t in $THREADS; do
    for r in $(seq "$ROUNDS"); do
        echo "threads $t, round $r/$ROUNDS" >&2
        if [ $((r % 2)) = 1 ]; then
            "$BUILD/bench_gemm" "$t" 1 "$SECONDS_PER" >> "$out"
            /usr/bin/python3 bench/torch_gemm.py "$t" 1 "$SECONDS_PER" >> "$out"
        else
            /usr/bin/python3 bench/torch_gemm.py "$t" 1 "$SECONDS_PER" >> "$out"
            "$BUILD/bench_gemm" "$t" 1 "$SECONDS_PER" >> "$out"
        fi
    done
done
/usr/bin/python3 bench/gemm_summary.py < "$out"
