#!/usr/bin/env bash
# Thread-pool benchmark: training tokens/s of the `ftune train` command that
# `make demo` runs (stories260K, LoRA, tinyshakespeare, batch 8 x 128), alone
# and with a competing 2-thread CPU load that this script starts and kills,
# for a build of an earlier commit (BEFORE) and for this tree, interleaved in
# one sitting. Prints every run and the medians as a Markdown table.
#   bash bench/threads.sh [REPS]   env: BEFORE=rev (where this branch left main)
#                                  STEPS (20)  THREADS (0 = all cores)  LIMIT (60 s)
# The data is the first 200 KB of tinyshakespeare: tokenizing the whole file
# would dominate a short run, and the steps (random 8 x 128 windows) cost the
# same. A run is cut at LIMIT seconds; its tokens/s then comes from the steps
# it finished (and the table says how many runs were cut).
# A benchmark, not a test: the numbers depend on what else the machine runs.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
BEFORE=${BEFORE:-$(git merge-base main HEAD)}
STEPS=${STEPS:-20}
THREADS=${THREADS:-0}
LIMIT=${LIMIT:-60}
DATA=${FTUNE_DATA:-../shared/data}
MODEL=$DATA/models/stories260K-hf
# both builds pick their thread count themselves, as `make demo` does
unset OMP_NUM_THREADS OMP_WAIT_POLICY GOMP_SPINCOUNT OPENBLAS_NUM_THREADS

tmp=$(mktemp -d)
TEXT=$tmp/shakespeare-200k.txt
head -c 200000 "$DATA/text/tinyshakespeare/input.txt" >"$TEXT"
load_pids=()
stop_load() {
    for p in "${load_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${load_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    load_pids=()
}
cleanup() { stop_load; rm -rf "$tmp"; }
trap cleanup EXIT
start_load() {  # two busy threads, like two other developers' jobs
    for _ in 1 2; do
        bash -c 'while :; do :; done' &
        load_pids+=($!)
    done
}

before_rev=$(git rev-parse --short "$BEFORE")
after_rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tools Makefile || echo "+changes")
# the earlier commit is built from `git archive` under build/ (kept for reruns)
bdir=build/bench-before-$before_rev
if [ ! -x "$bdir/build/ftune" ]; then
    echo "building $BEFORE ($before_rev) in $bdir" >&2
    rm -rf "$bdir" && mkdir -p "$bdir"
    git archive "$before_rev" | tar -x -C "$bdir"
    make -s -C "$bdir" -j2 build/ftune >/dev/null
fi
echo "building this tree ($after_rev)" >&2
make -s -j2 build/ftune >/dev/null
declare -A BIN=([before]="$bdir/build/ftune" [after]=build/ftune)

# Runs one training; prints tokens/s over steps 2.. (step 1 pays for
# first-touch page faults) from metrics.jsonl, the command's wall seconds,
# the steps counted and 1 if the run was cut at LIMIT.
run_one() {  # which load
    local out=$tmp/out-$1-$2 t0 t1 cut=0
    rm -rf "$out"
    t0=$(date +%s.%N)
    timeout "$LIMIT" "${BIN[$1]}" train -m "$MODEL" --data "$TEXT" -o "$out" --ctx 128 --batch-size 8 \
        --steps "$STEPS" --lr 3e-3 --warmup 10 --val-split 0.02 --seed 1 -t "$THREADS" >"$tmp/log" 2>&1 ||
        { [ $? -eq 124 ] && cut=1 || { cat "$tmp/log" >&2; return 1; }; }
    t1=$(date +%s.%N)
    # with fewer than two steps done there is nothing to time: 0 tok/s
    cat "$out/metrics.jsonl" 2>/dev/null | awk -v t0="$t0" -v t1="$t1" -v cut="$cut" -F'"tokens_per_s":' '
        /"step":/ { split($0, a, "\"step\":"); step = a[2] + 0; tps = $2 + 0
                    if (step >= 2 && tps > 0) { n++; s += 1.0 / tps } }
        END { printf "%.1f %.2f %d %d\n", n ? n / s : 0, t1 - t0, n, cut }'
}

results=$tmp/results
: >"$results"
echo "rep build load tokens_per_s wall_s steps_timed cut"
for rep in $(seq 1 "$REPS"); do
    # alternate which build goes first so drifting machine load hits both alike
    if [ $((rep % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
    for load in none 2-threads; do
        [ "$load" = none ] || start_load
        for b in $order; do
            r=$(run_one "$b" "$load")
            echo "$rep $b $load $r" | tee -a "$results"
        done
        stop_load
    done
done

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
med() { awk -v b="$1" -v l="$2" -v c="$3" '$2 == b && $3 == l { print $c }' "$results" | median; }
bn=$(med before none 4); bl=$(med before 2-threads 4); an=$(med after none 4); al=$(med after 2-threads 4)
bnw=$(med before none 5); blw=$(med before 2-threads 5); anw=$(med after none 5); alw=$(med after 2-threads 5)
echo
ncut=$(awk '$7 == 1' "$results" | wc -l)
echo "Medians of $REPS runs, $STEPS steps each (-t $THREADS; $(nproc) CPUs); $ncut run(s) cut at $LIMIT s:"
echo
echo "| build | alone: tok/s (wall s) | with 2-thread load: tok/s (wall s) | loaded / alone |"
echo "|---|---|---|---|"
awk -v r="$before_rev" -v a="$bn" -v b="$bl" -v aw="$bnw" -v bw="$blw" \
    'BEGIN { printf "| before (%s) | %s (%s) | %s (%s) | %.2f |\n", r, a, aw, b, bw, b / a }'
awk -v r="$after_rev" -v a="$an" -v b="$al" -v aw="$anw" -v bw="$alw" \
    'BEGIN { printf "| after (%s) | %s (%s) | %s (%s) | %.2f |\n", r, a, aw, b, bw, b / a }'
awk -v a="$an" -v b="$bn" -v c="$al" -v d="$bl" \
    'BEGIN { printf "| after / before | %.2f | %.2f | |\n", a / b, c / d }'
