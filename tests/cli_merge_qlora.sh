#!/usr/bin/env bash
# Merging after QLoRA (issue #8 item 6), as practitioners recommend: the
# quantized base is dequantized, the adapter merged into it in f32, and the
# result written in f32 (or bf16/f16), never merged into 4-bit; it is
# quantized again only when --dtype asks. On stories260K: `ftune eval` of the
# f32 merge equals the adapter on the dequantized base, for a base quantized
# on load (--quant nf4) and for a bitsandbytes 4-bit checkpoint.
set -u
. "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
head -c 8000 "$D/text/tinyshakespeare/input.txt" > "$tmp/d.txt"
loss() { "$FT" eval "$@" --text "$tmp/d.txt" --json -t 1 2>/dev/null | sed -n 's/.*"loss":\([0-9.]*\).*/\1/p'; }
# dtypes of a safetensors file's tensors, counted: "F32:47"
dtypes() {
    $PY - "$1/model.safetensors" <<'PYEOF'
import collections, json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
print(" ".join("%s:%d" % kv for kv in sorted(collections.Counter(v["dtype"] for k, v in h.items() if k != "__metadata__").items())))
PYEOF
}
# Tolerance: the merge rounds deq(W) + s·B·A to f32 once per element, the
# adapter path sums x·deq(W)ᵀ and s·(x·Aᵀ)·Bᵀ apart: f32 rounding, ~1e-7 of
# the logits, averaged over 4860 tokens. eval prints 6 decimals (3e-7 of a
# loss of 3.5). 1e-5 relative is well above both and far below what merging
# into the wrong base moves it (the unquantized base: 0.9% here).
same() { $PY -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(a) else 1)" "$1" "$2"; }
differ() { $PY -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) > 1e-3 * abs(a) else 1)" "$1" "$2"; }

OPT="--data $tmp/d.txt --steps 6 --lr 3e-3 -t 1 --seed 3 --quiet"
# 1. a base quantized on load: train, then merge with the same --quant
"$FT" train -m "$HF" --quant nf4 -o "$tmp/qa" $OPT || { fail qlora_train "exit $?"; exit 1; }
la=$(loss -m "$HF" --quant nf4 --adapter "$tmp/qa")
"$FT" merge -m "$HF" --quant nf4 --adapter "$tmp/qa" -o "$tmp/m1" 2> "$tmp/m1.log" || { fail merge_quant "$(cat "$tmp/m1.log")"; exit 1; }
lm=$(loss -m "$tmp/m1")
lw=$(loss -m "$HF" --adapter "$tmp/qa")
echo "  eval loss: adapter on the NF4-dequantized base $la, f32 merge $lm; adapter on the unquantized base $lw"
if same "$la" "$lm" && differ "$la" "$lw"; then pass merge_quant_equals_adapter
else fail merge_quant_equals_adapter "adapter $la, merged $lm, unquantized base $lw"; fi
dt=$(dtypes "$tmp/m1")
if [ "$dt" = "F32:47" ] && ! grep -q quantization_config "$tmp/m1/config.json"; then pass merge_quant_writes_f32
else fail merge_quant_writes_f32 "dtypes $dt; $(grep -c quantization_config "$tmp/m1/config.json") quantization_config"; fi

# 2. a bitsandbytes 4-bit checkpoint: read quantized, trained on, merged dequantized
"$FT" quantize --type nf4 "$HF" "$tmp/bnb" > /dev/null 2>&1 && cp "$HF"/tokenizer*.json "$tmp/bnb/" ||
    { fail bnb_base "ftune quantize failed"; exit 1; }
"$FT" train -m "$tmp/bnb" -o "$tmp/qb" $OPT || { fail bnb_train "exit $?"; exit 1; }
lb=$(loss -m "$tmp/bnb" --adapter "$tmp/qb")
"$FT" merge -m "$tmp/bnb" --adapter "$tmp/qb" -o "$tmp/m2" 2> "$tmp/m2.log" || { fail merge_bnb "$(cat "$tmp/m2.log")"; exit 1; }
lm2=$(loss -m "$tmp/m2")
echo "  eval loss: adapter on the bnb-4bit base $lb, f32 merge $lm2"
dt=$(dtypes "$tmp/m2")
# the base's quantization_config must not survive: transformers would quantize the merge again on load
if same "$lb" "$lm2" && [ "$dt" = "F32:47" ] && ! grep -q quantization_config "$tmp/m2/config.json"; then
    pass merge_bnb_equals_adapter
else fail merge_bnb_equals_adapter "adapter $lb, merged $lm2, dtypes $dt"; fi

# 3. 16-bit output, and quantizing again only when asked
"$FT" merge -m "$HF" --quant nf4 --adapter "$tmp/qa" --dtype bf16 -o "$tmp/mb" 2> /dev/null
dt=$(dtypes "$tmp/mb")
if [ "$dt" = "BF16:47" ]; then pass merge_quant_bf16; else fail merge_quant_bf16 "dtypes $dt"; fi
"$FT" merge -m "$HF" --quant nf4 --adapter "$tmp/qa" --dtype nf4 -o "$tmp/mq" 2> "$tmp/mq.log"
lq=$(loss -m "$tmp/mq")
echo "  eval loss: the f32 merge quantized again to NF4 $lq (the adapter's small update is mostly lost in NF4's steps)"
if grep -q '"bnb_4bit_quant_type"' "$tmp/mq/config.json" && [ -n "$lq" ] && differ "$lm" "$lq" && ! ls -d "$tmp"/mq.tmp.* "$tmp"/mq.merged-f32* > /dev/null 2>&1; then
    pass merge_requantize_nf4
else fail merge_requantize_nf4 "loss $lq; $(cat "$tmp/mq.log")"; fi
# transformers accepts the quantization_config of both bitsandbytes outputs of merge
"$FT" merge -m "$HF" --quant nf4 --adapter "$tmp/qa" --dtype int8 -o "$tmp/mi8" 2> "$tmp/mi8.log"
o1=$(.venv/bin/python tests/bnb_config_check.py nf4 "$tmp/mq" 2>&1); r1=$?
o2=$(.venv/bin/python tests/bnb_config_check.py int8 "$tmp/mi8" 2>&1); r2=$?
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ]; then printf '%s\n%s\n' "$o1" "$o2"; pass merge_bnb_transformers_config
else fail merge_bnb_transformers_config "$o1 $o2 $(cat "$tmp/mi8.log")"; fi

# 4. errors
if "$FT" merge -m "$tmp/bnb" --quant nf4 --adapter "$tmp/qb" -o "$tmp/e1" 2> "$tmp/e1.log"; then fail merge_quant_twice "accepted"
elif grep -q "already quantized" "$tmp/e1.log"; then pass merge_quant_twice
else fail merge_quant_twice "$(cat "$tmp/e1.log")"; fi
"$FT" merge -m "$HF" --adapter "$tmp/qa" --dtype nf4 -o "$tmp/e2.gguf" 2> "$tmp/e2.log"; rc=$?
if [ $rc -eq 1 ] && grep -q 'dtype "nf4" is a bitsandbytes type, written as a Hugging Face directory' "$tmp/e2.log" \
    && [ ! -e "$tmp/e2.gguf" ]; then pass merge_nf4_gguf_refused
else fail merge_nf4_gguf_refused "rc $rc: $(cat "$tmp/e2.log")"; fi
