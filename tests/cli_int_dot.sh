#!/usr/bin/env bash
# Decode's integer products on the real models: the perplexity of a held-out
# text read one token at a time (as generation reads it) with the weights
# multiplied by 16-bit integer activations in integers, against the same with the
# weights widened to f32 (the reference), on SmolLM2-135M-Instruct (Q4_1,
# a Q8_0 head) and Qwen2.5-Coder-0.5B (Q4_K, Q6_K, Q5_0, Q8_0).
# The bound is the 0.2% of the perplexity the integer path must keep to
# (measured, 128 tokens: 0.003% and 0.005%): 16-bit activations are
# rounded by 2^-16 of each block's largest value. ggml's 8-bit activations
# (q8_0, q8_1, q8_K) measured 1.25% and 1.35% here (0.56% with f32 scales),
# which is why ftune does not use them (dtype_dot.c).
cd "$(dirname "$0")/.."
source tests/lib.sh
BUILD=${BUILD:-build}
HELPER=$BUILD/tests/helper_decode_ppl
N=${INT_DOT_TOKENS:-128}
# held-out text: GSM8K test answers (the demo trains on the train split)
python3 -c '
import json, sys
out = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    out.append(r["question"] + "\n" + r["answer"] + "\n")
    if sum(map(len, out)) > 4000: break
open(sys.argv[2], "w").write("".join(out))
' "$D/text/gsm8k/test.jsonl" "$tmp/heldout.txt"
for m in "$SMOL" "$QWEN"; do
    name=$(basename "$m" .gguf)
    need_model "int_dot_ppl_$name" "$m" || continue
    if ! out=$("$HELPER" "$m" "$tmp/heldout.txt" "$N" 2 2> "$tmp/err"); then
        fail "int_dot_ppl_$name" "$(cat "$tmp/err")"; continue
    fi
    rel=$(echo "$out" | sed -n 's/.* rel \([^ ]*\)$/\1/p')
    if python3 -c "import sys; sys.exit(0 if float('$rel') <= 2e-3 else 1)"; then
        pass "int_dot_ppl_$name ($out: within 0.2%)"
    else fail "int_dot_ppl_$name" "$out: beyond 0.2%"; fi
done
