#!/usr/bin/env bash
# make bench-dist: full fine-tuning of a random-weight llama-110m over 1, 2 and
# 4 MPI ranks (oversubscribed on this machine) at ZeRO 0 and 1, configurations
# interleaved, ROUNDS rounds: per-rank peak RSS (from /usr/bin/time around each
# rank) against the predicted ZeRO 1 saving of 8 bytes x P x (1 - 1/N), the
# tokens/s of steps 2-4, and the per-step losses against one process. Prints a
# Markdown table (BENCHMARKS.md's data-parallel section was made with it).
# About 2 GB of memory per rank.
set -u
BUILD=${BUILD:-build}
FT=$BUILD/ftune
D=${FTUNE_DATA:-../shared/data}
ROUNDS=${ROUNDS:-2}
PY=/usr/bin/python3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
"$FT" init --preset llama-110m "$tmp/m" > /dev/null || exit 1
"$FT" merge -m "$tmp/m" -o "$tmp/m.gguf" --tokenizer "$D/tokenizers/llama2/tokenizer.model" > /dev/null 2>&1 || exit 1
rm -rf "$tmp/m"
for i in $(seq 16); do echo "{\"text\": \"Story $i: once upon a time a small robot learned to paint the sky in many colours.\"}"; done > "$tmp/d.jsonl"
args=(train -m "$tmp/m.gguf" --data "$tmp/d.jsonl" --ctx 32 -t 1 --quiet --steps 4 --batch-size 4 --lr 1e-4
      --val-split 0 --overwrite --seed 2 --full)
P=$("$FT" "${args[@]}" --steps 1 -o "$tmp/p" 2>&1 >/dev/null | sed -n 's/^trainable parameters: //p')
[ -n "$P" ] || P=$("$FT" train -m "$tmp/m.gguf" --data "$tmp/d.jsonl" --ctx 32 -t 1 --steps 1 --batch-size 4 --val-split 0 \
    --overwrite --full -o "$tmp/p" 2>&1 | sed -n 's/^trainable parameters: //p')
echo "| round | ranks | ZeRO | peak RSS per rank (MiB) | predicted saving vs 1 process (MiB) | tokens/s, steps 2-4 | max rel. loss diff vs 1 process | load |"
echo "|---|---|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
    for nz in "1 0" "2 0" "2 1" "4 1"; do
        set -- $nz
        out=$tmp/r$1z$2
        if [ "$1" = 1 ]; then /usr/bin/time -f "rss %M" "$FT" "${args[@]}" -o "$out" 2> "$tmp/rss.txt"
        else mpirun --oversubscribe --bind-to none -np "$1" /usr/bin/time -f "rss %M" "$FT" "${args[@]}" --zero "$2" -o "$out" \
                 2> "$tmp/rss.txt"; fi
        rss=$(grep -o 'rss [0-9]*' "$tmp/rss.txt" | awk '{print int($2 / 1024)}' | paste -sd' ')
        pred=$($PY -c "print('%.0f' % (8 * $P * (1 - 1 / $1) / 2**20 if $2 else 0))")
        stats=$($PY - "$out/metrics.jsonl" "$tmp/r1z0/metrics.jsonl" <<'PYEOF'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
r = [json.loads(l) for l in open(sys.argv[2])]
d = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(m, r))
print("%s | %.1e" % (" ".join("%.0f" % x["tokens_per_s"] for x in m[1:]), d))
PYEOF
)
        echo "| $round | $1 | $2 | $rss | $pred | $stats | $(cut -d' ' -f1 /proc/loadavg) |"
    done
done
echo
echo "P = $P trainable parameters; 8 bytes each of AdamW state = $($PY -c "print('%.1f' % (8 * $P / 2**20))") MiB"
