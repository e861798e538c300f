#!/usr/bin/env bash
# make bench: ftune against PyTorch 1.13 on the same shapes, batch, sequence
# and threads, interleaved in one run (the machine is shared and noisy),
# medians and ratios to BENCHMARKS.md, each row's MFU against the bf16 peaks
# measured in the same run (bench_gemm --peaks-only, 1 and THREADS threads).
# Inference (prefill, decode; f32 and bf16), then training steps (LoRA r=16
# in f32 and bf16, full fine-tuning in bf16; PyTorch: bf16 autocast).
#   env: THREADS (2)  ROUNDS (2)  INFER_RUNS  TRAIN_RUNS  (formats below)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-2}
# inference: "preset dtype prefill decode runs" per run
INFER_RUNS=${INFER_RUNS:-"llama-110m f32 512 64 3;llama-110m bf16 512 64 3;llama-3.2-1b bf16 512 16 1"}
# training: "preset B T mode dtype timed-steps warmup-steps" per run
TRAIN_RUNS=${TRAIN_RUNS:-"llama-110m 4 512 lora f32 3 1;llama-110m 4 512 lora bf16 3 1;llama-110m 4 512 full bf16 3 1;llama-3.2-1b 1 256 lora bf16 2 1;llama-3.2-1b 1 256 lora f32 2 1"}
LORA_R=16
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
# random-weight models, one file per preset and stored dtype (created on first use)
model() { # preset stored-dtype -> path
    local p="$tmp/$1-$2"
    if [ ! -d "$p" ]; then
        echo "writing a random $1 ($2) to $p" >&2
        "$BUILD/ftune" init --preset "$1" --dtype "$2" "$p" >/dev/null 2>&1
    fi
    echo "$p"
}
# f32 runs of llama-3.2-1b read the bf16 file (widened at load): one file on disk
stored() { [ "$1" = llama-3.2-1b ] && echo bf16 || echo "$2"; }
results=$tmp/results.jsonl
tag() { sed "s/^{/{\"bench\":\"$1\",$2/"; }
peaks() { # round: the FMA / VDPBF16PS peaks and the read bandwidth, 1 and THREADS threads
    "$BUILD/bench_gemm" --peaks-only "$THREADS" 1 0.2 |
        awk -F'\t' -v r="$1" '$1 == "peak" { split($3, t, "="); split($5, v, "=");
            printf "{\"bench\":\"peak\",\"kind\":\"%s\",\"threads\":%s,\"round\":%s,\"value\":%s}\n", $2, t[2], r, v[2] }' >> "$results"
}
torch_dt() { [ "$1" = f32 ] && echo float32 || echo bfloat16; }
IFS=';' read -ra infer <<< "$INFER_RUNS"
IFS=';' read -ra train <<< "$TRAIN_RUNS"
for r in $(seq "$ROUNDS"); do
    echo "round $r: peaks" >&2
    peaks "$r"
    for run in "${infer[@]}"; do
        read -r preset dt P D runs <<< "$run"
        m=$(model "$preset" "$(stored "$preset" "$dt")")
        t="\"preset\":\"$preset\",\"dtype\":\"$dt\",\"round\":$r,"
        echo "round $r: inference $preset $dt: ftune" >&2
        "$BUILD/bench_forward" "$m" "$P" "$D" "$THREADS" "$runs" none "$dt" | tag infer "$t" >> "$results" ||
            echo "FAILED: ftune inference $preset $dt (its row will be missing)" >&2
        echo "round $r: inference $preset $dt: pytorch" >&2
        /usr/bin/python3 bench/torch_bench.py --preset "$preset" --dtype "$(torch_dt "$dt")" --prefill "$P" \
            --decode "$D" --threads "$THREADS" --runs "$runs" --json | tag infer "$t" >> "$results" ||
            echo "FAILED: pytorch inference $preset $dt (its row will be missing)" >&2
    done
    for run in "${train[@]}"; do
        read -r preset B T mode dt steps warmup <<< "$run"
        m=$(model "$preset" "$(stored "$preset" "$dt")")
        t="\"preset\":\"$preset\",\"round\":$r,"
        full=$([ "$mode" = full ] && echo --full || true)
        echo "round $r: training $preset $mode $dt B=$B T=$T: ftune" >&2
        "$BUILD/bench_train" "$m" "$B" "$T" "$steps" "$THREADS" "$warmup" "$dt" "$mode" "$LORA_R" |
            tag train "$t" >> "$results" || echo "FAILED: ftune training $preset $mode $dt (its row will be missing)" >&2
        echo "round $r: training $preset $mode $dt B=$B T=$T: pytorch" >&2
        /usr/bin/python3 bench/torch_train_bench.py --preset "$preset" --batch "$B" --ctx "$T" --steps "$steps" \
            --warmup "$warmup" --threads "$THREADS" --dtype "$(torch_dt "$dt")" --lora-r "$LORA_R" $full --json |
            tag train "$t" >> "$results" || echo "FAILED: pytorch training $preset $mode $dt (its row will be missing)" >&2
    done
done
echo "peaks, again" >&2
peaks $((ROUNDS + 1))
grep -qw amx_bf16 /proc/cpuinfo && amx=1 || amx=0
cp "$results" "$BUILD/bench-results.jsonl"   # the raw lines, to re-summarize without re-running
/usr/bin/python3 bench/summarize.py "$results" "$THREADS" "$amx" > BENCHMARKS.md.tmp
# sections measured by other scripts (bench/threads.sh) follow a marker line: keep them
[ -f BENCHMARKS.md ] && sed -n '/^<!-- measured by other scripts: kept by bench\/run.sh -->$/,$p' BENCHMARKS.md >> BENCHMARKS.md.tmp
mv BENCHMARKS.md.tmp BENCHMARKS.md
cat BENCHMARKS.md
