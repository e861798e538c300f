#!/usr/bin/env bash
# make bench-dist: full fine-tuning of a random-weight llama-110m over 1, 2 and
# 4 MPI ranks (oversubscribed on this machine) at ZeRO 0 to 3, configurations
# interleaved, ROUNDS rounds: per-rank peak RSS (from /usr/bin/time around each
# rank) against the predicted saving (ZeRO 1: 8 bytes x P x (1 - 1/N) of AdamW
# state; 2: and 4 bytes x P x (1 - 1/N) of gradients less one segment's window;
# 3: and as much of values), rank 0's memory table total (planned), the bytes
# its collectives sent per step, the tokens/s of steps 2-4, and the per-step
# losses against one process. Prints a Markdown table (BENCHMARKS.md's
# data-parallel sections were made with it). CONFIGS="ranks:zero[:o] ..." picks
# the rows (:o adds --overlap). About 2 GB of memory per rank.
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
CONFIGS=${CONFIGS:-"1:0 2:0 2:1 2:2 2:3 4:3"}
args=(train -m "$tmp/m.gguf" --data "$tmp/d.jsonl" --ctx 32 -t 1 --steps 4 --batch-size 4 --lr 1e-4
      --val-split 0 --overwrite --seed 2 --full)
P=$("$FT" "${args[@]}" --steps 1 -o "$tmp/p" 2>&1 >/dev/null | sed -n 's/^trainable parameters: //p')
# the largest segment (ZeRO 2/3's window): the embedding, vocab x hidden
W=$((32000 * 768))
echo "| round | ranks | ZeRO | peak RSS per rank (MiB) | predicted saving vs 1 process (MiB) | memory table total, rank 0 (MiB) | MB sent per step, rank 0 | tokens/s, steps 2-4 | max rel. loss diff vs 1 process | load |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
    for nz in $CONFIGS; do
        set -- ${nz//:/ }
        ov=(); [ "${3:-}" = o ] && ov=(--overlap)
        out=$tmp/r$1z$2${3:-}
        if [ "$1" = 1 ]; then /usr/bin/time -f "rss %M" "$FT" "${args[@]}" -o "$out" 2> "$tmp/rss.txt"
        else mpirun --oversubscribe --bind-to none -np "$1" /usr/bin/time -f "rss %M" "$FT" "${args[@]}" --zero "$2" "${ov[@]}" -o "$out" \
                 2> "$tmp/rss.txt"; fi
        rss=$(grep -o 'rss [0-9]*' "$tmp/rss.txt" | awk '{print int($2 / 1024)}' | paste -sd' ')
        pred=$($PY -c "
N, z, P, W = $1, $2, $P, $W
s = 8 * P * (1 - 1 / N) if z >= 1 else 0
s += 4 * P * (1 - 1 / N) - 4 * W if z >= 2 else 0
s += 4 * P * (1 - 1 / N) - 4 * W if z >= 3 else 0
print('%.0f' % (s / 2**20))")
        total=$(grep -m1 '^total' "$tmp/rss.txt" | awk '{print $2}')
        comm=$(sed -n 's/^communication per step and rank: \([0-9.]*\) MB.*/\1/p' "$tmp/rss.txt")
        stats=$($PY - "$out/metrics.jsonl" "$tmp/r1z0/metrics.jsonl" <<'PYEOF'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
r = [json.loads(l) for l in open(sys.argv[2])]
d = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(m, r))
print("%s | %.1e" % (" ".join("%.0f" % x["tokens_per_s"] for x in m[1:]), d))
PYEOF
)
        echo "| $round | $1 | $2${3:+ (overlap)} | $rss | $pred | ${total:--} | ${comm:-0} | $stats | $(cut -d' ' -f1 /proc/loadavg) |"
    done
done
echo
echo "P = $P trainable parameters; 8 bytes each of AdamW state = $($PY -c "print('%.1f' % (8 * $P / 2**20))") MiB"
