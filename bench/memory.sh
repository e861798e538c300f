#!/usr/bin/env bash
# Memory benchmark (issue #8, "the numbers"): what training a model costs in
# resident memory, measured beside what the trainer's memory table planned.
#   bash bench/memory.sh [7b|1b|all]   (default all)
#   env: THREADS (2), FT (build/ftune), FTUNE_DATA (../shared/data),
#        MODEL_DIR (where the random 7B is made and removed; default a new
#        directory under ${TMPDIR:-/tmp}), CTX7B ("512"; "512 2048" for both),
#        STEPS1B (3), TORCH_WARMUP (1: PyTorch's untimed steps first),
#        ROWS1B (which rows of the 1b table, from 1; default all)
# 7b: `ftune init --preset llama-2-7b --dtype bf16` (13.5 GB on disk), then
#     LoRA r 16 on all seven Linears, --quant nf4 --dtype bf16
#     --grad-checkpoint 1, B 1, 2 steps, on tinyshakespeare with
#     stories260K's tokenizer (the benchmark needs token ids, not words; a
#     Hugging Face directory needs a tokenizer.json). Peak RSS of the whole run (VmHWM), the largest RSS
#     sampled every 0.2 s while the model loads (before the data is read:
#     the bf16 file must be streamed into NF4, never held), seconds per step
#     (the median after the first), and the plan.
# 1b: the cumulative table on llama-3.2-1b (B 1, T 512): fp32 LoRA, bf16,
#     + --grad-checkpoint 1, + --quant nf4, then + 8-bit and + paged AdamW
#     when `ftune train --help` lists those flags; beside it PyTorch 1.13
#     fp32 and bf16 (autocast) LoRA with and without torch.utils.checkpoint
#     (bench/torch_train_bench.py). PyTorch has no NF4 on CPU.
# A benchmark, not a test: the machine's other load changes the times.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-all}
THREADS=${THREADS:-2}
DATA=${FTUNE_DATA:-../shared/data}
FT=${FT:-build/ftune}
CTX7B=${CTX7B:-512}
STEPS1B=${STEPS1B:-3}
TORCH_WARMUP=${TORCH_WARMUP:-1}
ROWS1B=${ROWS1B:-}
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 400000 "$DATA/text/tinyshakespeare/input.txt" >"$tmp/text.txt"

# train_measured OUT ARGS...: runs `ftune train` with RSS sampled, prints
# "peak_rss_mib load_peak_mib s_per_step tok_s planned_mib wall_s"
train_measured() {
    local out=$1; shift
    local t0 pid
    t0=$(date +%s.%N)
    "$FT" train "$@" -o "$out" --overwrite -t "$THREADS" --val-split 0 --seed 1 >"$tmp/stdout.txt" 2>"$tmp/err.txt" &
    pid=$!
    : >"$tmp/rss.txt"
    : >"$tmp/steps.txt"
    local n_last=0 n
    while kill -0 "$pid" 2>/dev/null; do
        # RSS now, and whether the model is loaded yet (the data is read after it)
        r=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
        s=0; grep -q '^data:' "$tmp/err.txt" && s=1
        [ -n "$r" ] && echo "$r $s" >>"$tmp/rss.txt"
        # when each optimizer step's metrics line appears (metrics' tokens_per_s has one decimal)
        n=0; [ -f "$out/metrics.jsonl" ] && n=$(wc -l <"$out/metrics.jsonl")
        [ "$n" -gt "$n_last" ] && { echo "$(date +%s.%N) $n" >>"$tmp/steps.txt"; n_last=$n; }
        sleep 0.2
    done
    wait "$pid" || { cat "$tmp/err.txt" >&2; return 1; }
    local wall
    wall=$($PY -c "import time; print(round(time.time() - $t0, 1))")
    $PY - "$out/metrics.jsonl" "$tmp/err.txt" "$tmp/rss.txt" "$wall" "$tmp/steps.txt" <<'EOF'
import json, re, statistics, sys
m = [json.loads(l) for l in open(sys.argv[1])]
err = open(sys.argv[2]).read()
steps = re.search(r"micro-batch (\d+) x (\d+) tokens", err)
tokens = int(steps.group(1)) * int(steps.group(2))
tok = [x["tokens_per_s"] for x in m]
tok_s = statistics.median(tok[1:] if len(tok) > 1 else tok)
rss = re.search(r"^peak RSS ([\d.]+) MiB", err, re.M).group(1)
plan = re.search(r"^total\s+([\d.]+)", err, re.M).group(1)
load = [int(a) for a, s in (l.split() for l in open(sys.argv[3])) if s == "0"]
at = [float(l.split()[0]) for l in open(sys.argv[5])]
# seconds per step: between the metrics lines of steps after the first (to 0.2 s), else from tokens_per_s
gaps = [b - a for a, b in zip(at, at[1:])]
sps = statistics.median(gaps) if gaps and len(at) == len(m) else tokens / tok_s
print(rss, round(max(load) / 1024, 1) if load else "-", round(sps, 1), round(tokens / sps, 2), plan, sys.argv[4])
EOF
}

bench_7b() {
    local dir=${MODEL_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ftune-7b.XXXXXX")}
    [ -f "$dir/model.safetensors" ] || "$FT" init --preset llama-2-7b --dtype bf16 "$dir" >/dev/null
    cp "$DATA/models/stories260K-hf/tokenizer.json" "$DATA/models/stories260K-hf/tokenizer_config.json" "$dir/"
    echo "| llama-2-7b, LoRA r 16 (all 7), nf4 + bf16 + --grad-checkpoint 1, B 1, $THREADS threads | peak RSS MiB | RSS while loading MiB | planned MiB | s/step | tok/s | wall s |"
    echo "|---|---|---|---|---|---|---|"
    for T in $CTX7B; do
        read -r rss load sps tok plan wall < <(train_measured "$tmp/out7b" -m "$dir" --data "$tmp/text.txt" --ctx "$T" \
            --batch-size 1 --steps 2 --lora-r 16 --lora-alpha 32 --lora-targets all --quant nf4 --dtype bf16 \
            --grad-checkpoint 1)
        echo "| T=$T | $rss | $load | $plan | $sps | $tok | $wall |"
        sed -n '/^memory (MiB)/,/^peak RSS/p' "$tmp/err.txt" >&2
    done
    [ -n "${MODEL_DIR:-}" ] || rm -rf "$dir"
}

bench_1b() {
    "$FT" init --preset llama-3.2-1b --dtype bf16 "$tmp/l1b" >/dev/null
    cp "$DATA/models/stories260K-hf/tokenizer.json" "$DATA/models/stories260K-hf/tokenizer_config.json" "$tmp/l1b/"
    local help rows
    help=$("$FT" train --help 2>&1)
    # name|ftune flags (each row adds to the one before)
    rows=("fp32 LoRA|"
          "bf16|--dtype bf16"
          "+ grad checkpointing|--dtype bf16 --grad-checkpoint 1"
          "+ NF4 base|--dtype bf16 --grad-checkpoint 1 --quant nf4")
    local opt8=() paged=()
    if grep -q -- "--optim" <<<"$help" && grep -q "adamw8bit\|adamw_8bit" <<<"$help"; then
        opt8=(--optim "$(grep -o 'adamw_\?8bit' <<<"$help" | head -1)")
        rows+=("+ 8-bit AdamW|--dtype bf16 --grad-checkpoint 1 --quant nf4 ${opt8[*]}")
        if grep -q -- "--paged-optim" <<<"$help"; then
            paged=("${opt8[@]}" --paged-optim)
            rows+=("+ paged AdamW|--dtype bf16 --grad-checkpoint 1 --quant nf4 ${paged[*]}")
        fi
    fi
    echo "| llama-3.2-1b LoRA r 16 (all 7), B 1 x T 512, $THREADS threads | ftune peak RSS MiB | planned MiB | tok/s | PyTorch 1.13 peak RSS MiB | PyTorch tok/s |"
    echo "|---|---|---|---|---|---|"
    rows+=("(PyTorch fp32 + torch.utils.checkpoint)|")
    local i=0
    for row in "${rows[@]}"; do
        i=$((i + 1))
        [ -z "$ROWS1B" ] || [[ " $ROWS1B " == *" $i "* ]] || continue
        IFS='|' read -r name flags <<<"$row"
        if [ "$name" = "(PyTorch fp32 + torch.utils.checkpoint)" ]; then
            # PyTorch fp32 with checkpointing, on the same shape (ftune's checkpointing row is bf16)
            read -r pt prss < <($PY bench/torch_train_bench.py --preset llama-3.2-1b --batch 1 --ctx 512 --steps "$STEPS1B" \
                --warmup "$TORCH_WARMUP" --threads "$THREADS" --dtype float32 --grad-checkpoint --json \
                | $PY -c 'import json, sys; j = json.loads(sys.stdin.read()); print(j["tok_s"], j["peak_rss_mb"])')
            echo "| $name | | | | $prss | $pt |"
            continue
        fi
        # shellcheck disable=SC2086
        read -r rss load sps tok plan wall < <(train_measured "$tmp/out1b" -m "$tmp/l1b" --data "$tmp/text.txt" --ctx 512 \
            --batch-size 1 --steps "$STEPS1B" --lora-r 16 --lora-alpha 16 --lora-targets all --lora-dropout 0 $flags)
        local targs=() pt="-" prss="-"
        case "$name" in
            "fp32 LoRA") targs=(--dtype float32) ;;
            "bf16") targs=(--dtype bfloat16) ;;
            "+ grad checkpointing") targs=(--dtype bfloat16 --grad-checkpoint) ;;
        esac
        if [ ${#targs[@]} -gt 0 ]; then
            read -r pt prss < <($PY bench/torch_train_bench.py --preset llama-3.2-1b --batch 1 --ctx 512 --steps "$STEPS1B" \
                --warmup "$TORCH_WARMUP" --threads "$THREADS" "${targs[@]}" --json | $PY -c 'import json, sys; j = json.loads(sys.stdin.read()); print(j["tok_s"], j["peak_rss_mb"])')
        elif [[ "$name" == *NF4* ]]; then
            pt="no NF4 on CPU"
        fi
        echo "| $name | $rss | $plan | $tok | $prss | $pt |"
    done
    if [ ${#opt8[@]} -eq 0 ]; then
        echo "| + 8-bit AdamW, + paged AdamW | pending: \`ftune train --help\` lists no 8-bit optimizer yet | | | | |"
    fi
}

case "$WHAT" in
    7b) bench_7b ;;
    1b) bench_1b ;;
    all) bench_7b; bench_1b ;;
    *) echo "usage: bash bench/memory.sh [7b|1b|all]" >&2; exit 2 ;;
esac
