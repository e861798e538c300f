#!/usr/bin/env bash
# LoRA training step (bf16, r 16 on all seven Linears) at each bf16 kernel
# level this CPU has (FTUNE_CPU=amx, avx512bf16) against PyTorch's bf16
# autocast step (bench/torch_train_bench.py), the three interleaved round
# by round in one sitting; prints a Markdown table of median tokens/s, the
# range, and ftune's ratio to PyTorch. The shapes are issue #7's targets:
# llama-110m B 4 T 512 and llama-3.2-1b B 1 T 256 (random weights).
#   bash bench/levels_train.sh   (after make build/bench_train)
#   env: THREADS (2)  ROUNDS (3)  STEPS (3)  RUNS ("llama-110m 4 512;llama-3.2-1b 1 256")
# A benchmark, not a test: the numbers depend on what else the machine runs.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-3}
RUNS=${RUNS:-"llama-110m 4 512;llama-3.2-1b 1 256"}
[ -x "$BUILD/bench_train" ] || { echo "levels_train.sh: $BUILD/bench_train not found (make $BUILD/bench_train)" >&2; exit 1; }
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
levels=""
grep -qw amx_bf16 /proc/cpuinfo && levels="amx"
grep -qw avx512_bf16 /proc/cpuinfo && levels="$levels avx512bf16"
[ -n "$levels" ] || { echo "levels_train.sh: this CPU has no bf16 kernel level (avx512_bf16)" >&2; exit 1; }
IFS=';' read -ra runs <<< "$RUNS"
out=$tmp/lines
for r in $(seq "$ROUNDS"); do
    for run in "${runs[@]}"; do
        read -r preset B T <<< "$run"
        m=$tmp/$preset
        [ -d "$m" ] || "$BUILD/ftune" init --preset "$preset" --dtype bf16 "$m" > /dev/null
        # the engine that goes first rotates with the round
        engines=(torch $levels)
        n=${#engines[@]}
        for i in $(seq 0 $((n - 1))); do
            e=${engines[$(((i + r) % n))]}
            echo "round $r/$ROUNDS: $preset B=$B T=$T: $e" >&2
            if [ "$e" = torch ]; then
                tok=$(/usr/bin/python3 bench/torch_train_bench.py --preset "$preset" --batch "$B" --ctx "$T" \
                    --steps "$STEPS" --warmup 1 --threads "$THREADS" --dtype bfloat16 --lora-r 16 --json |
                    grep -o '"tok_s": *[0-9.]*' | grep -o '[0-9.]*$')
            else
                tok=$(FTUNE_CPU=$e "$BUILD/bench_train" "$m" "$B" "$T" "$STEPS" "$THREADS" 1 bf16 lora 16 |
                    grep -o '"tok_s":[0-9.]*' | grep -o '[0-9.]*$')
            fi
            echo "$preset B$B T$T	$e	$tok" >> "$out"
        done
    done
done
/usr/bin/python3 - "$out" "$levels" <<'EOF'
import collections, statistics, sys
v = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    shape, eng, tok = line.rstrip("\n").split("\t")
    if shape not in order:
        order.append(shape)
    v[(shape, eng)].append(float(tok))
levels = sys.argv[2].split()
print("| shape | engine | tokens/s (median) | range | / PyTorch bf16 |")
print("|---|---|---|---|---|")
for shape in order:
    t = statistics.median(v[(shape, "torch")])
    for e in ["torch"] + levels:
        x = v[(shape, e)]
        name = "PyTorch bf16 autocast" if e == "torch" else f"ftune, FTUNE_CPU={e}"
        print(f"| {shape} | {name} | {statistics.median(x):.0f} | {min(x):.0f}–{max(x):.0f} | {statistics.median(x) / t:.2f} |")
EOF
