#!/usr/bin/env bash
# Decode's integer products on the real models: the perplexity of a held-out
# text read one token at a time (as generation reads it) with the weights
# multiplied by 8-bit activations in integers, against the same with the
# weights widened to f32 (the reference), on SmolLM2-135M-Instruct (Q4_1,
# a Q8_0 head) and Qwen2.5-Coder-0.5B (Q4_K, Q6_K, Q5_0, Q8_0).
# Measured (128 tokens): +1.25% and +1.35%, not the 0.2% the integer path
# was meant to keep to, which is why it is off by default. On SmolLM2 the
# error comes almost all from the products whose input is the 576-wide
# normalised hidden state (with those kept in f32 it is 0.09%), most likely
# its outlier channels: a block scaled to one large value leaves the others
# a few levels of 8 bits. The bound checked is 2%: a regression guard on the integer
# kernels' use in the model (their exactness is test_q8_dot's), not the
# target.
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
    if python3 -c "import sys; sys.exit(0 if float('$rel') <= 2e-2 else 1)"; then
        pass "int_dot_ppl_$name ($out: within the 2% guard; the 0.2% target is not met)"
    else fail "int_dot_ppl_$name" "$out: beyond 2%"; fi
done
