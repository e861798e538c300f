#!/usr/bin/env bash
# Gradient checkpointing benchmark: `ftune train` LoRA (r 8, all seven
# targets, dropout 0.05) tokens/s, planned activation MiB and peak RSS
# without --grad-checkpoint and with each K, interleaved in every round, on
# stories260K and on a random llama-110m (`ftune init --preset llama-110m`,
# given stories260K's tokenizer: the benchmark needs token ids, not words).
# Prints every run and a Markdown table of medians and ratios to the run
# without checkpointing.
#   bash bench/grad_checkpoint.sh [REPS]   env: THREADS (1)  FTUNE_DATA
# Tokens/s of a run: the median of its steps' tokens_per_s after the first.
# A benchmark, not a test: the numbers depend on what else the machine runs.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
THREADS=${THREADS:-1}
DATA=${FTUNE_DATA:-../shared/data}
FT=build/ftune
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 100000 "$DATA/text/tinyshakespeare/input.txt" >"$tmp/text.txt"
"$FT" init --preset llama-110m "$tmp/llama110m" >/dev/null 2>&1
cp "$DATA/models/stories260K-hf/tokenizer.json" "$DATA/models/stories260K-hf/tokenizer_config.json" "$tmp/llama110m/"

# name model ctx batch steps Ks
configs=(
    "stories260K|$DATA/models/stories260K-hf|256|8|12|0 1 2"
    "llama-110m|$tmp/llama110m|256|2|4|0 1 4"
)
one_run() {  # model ctx batch steps K -> "tok_s acts_mib peak_rss_mib"
    local k=()
    [ "$5" = 0 ] || k=(--grad-checkpoint "$5")
    "$FT" train -m "$1" --data "$tmp/text.txt" -o "$tmp/out" --overwrite --ctx "$2" --batch-size "$3" --steps "$4" \
        -t "$THREADS" --val-split 0 --lora-dropout 0.05 --seed 1 "${k[@]}" 2>"$tmp/err.txt" >/dev/null \
        || { cat "$tmp/err.txt" >&2; exit 1; }
    /usr/bin/python3 - "$tmp/out/metrics.jsonl" "$tmp/err.txt" <<'EOF'
import json, re, statistics, sys
t = [json.loads(l)["tokens_per_s"] for l in open(sys.argv[1])][1:]
err = open(sys.argv[2]).read()
acts = re.search(r"^activations\s+([\d.]+)", err, re.M).group(1)
rss = re.search(r"^peak RSS ([\d.]+) MiB", err, re.M).group(1)
print(statistics.median(t), acts, rss)
EOF
}
declare -A tok acts rss
for ((r = 1; r <= REPS; r++)); do
    for c in "${configs[@]}"; do
        IFS='|' read -r name model ctx batch steps ks <<<"$c"
        for K in $ks; do
            read -r t a p < <(one_run "$model" "$ctx" "$batch" "$steps" "$K")
            echo "round $r $name K=$K: $t tok/s, activations $a MiB planned, peak RSS $p MiB" >&2
            tok[$name,$K]+="$t "; acts[$name,$K]=$a; rss[$name,$K]+="$p "
        done
    done
done
med() { /usr/bin/python3 -c 'import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))' $1; }
echo "| model (B x T, $THREADS thread) | --grad-checkpoint | tok/s (median of $REPS) | vs off | activations planned MiB | peak RSS MiB (median) |"
echo "|---|---|---|---|---|---|"
for c in "${configs[@]}"; do
    IFS='|' read -r name model ctx batch steps ks <<<"$c"
    base=$(med "${tok[$name,0]}")
    for K in $ks; do
        m=$(med "${tok[$name,$K]}")
        printf '| %s (%s x %s) | %s | %s | %.2f | %s | %s |\n' "$name" "$batch" "$ctx" "$([ "$K" = 0 ] && echo off || echo "$K")" \
            "$m" "$(/usr/bin/python3 -c "print($m / $base)")" "${acts[$name,$K]}" "$(med "${rss[$name,$K]}")"
    done
done
