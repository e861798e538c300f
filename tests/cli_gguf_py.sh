#!/usr/bin/env bash
# cli_gguf_py.sh — every GGUF ftune writes, read by llama.cpp's own reader
# (gguf-py, the `gguf` package in .venv): HF→GGUF and llama2.c→GGUF equal the
# reference GGUF of the same model; merged and quantized files carry the
# general.file_type and tensor types llama.cpp expects; exported adapters the
# adapter keys; and GGUF files written by gguf-py load in ftune with the same
# loss and tokens as the same weights/vocabulary read from a llama2.c file.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
DATA=${FTUNE_DATA:-../shared/data}
S=$DATA/models/stories260K
HF=$DATA/models/stories260K-hf
PY=.venv/bin/python
CHECK="$PY scripts/gguf_py_check.py"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

if ! [ -x "$PY" ] || ! "$PY" -c "import gguf" 2> /dev/null; then
    fail gguf_py "the Python package gguf (llama.cpp's gguf-py, pinned in scripts/requirements-test.txt) is not \
installed in .venv: /usr/bin/python3 -m venv --system-site-packages .venv && \
.venv/bin/pip install -r scripts/requirements-test.txt"
    exit 1
fi
head -c 3000 "$DATA/text/tinyshakespeare/input.txt" > "$tmp/t.txt"
loss() { "$FT" eval --text "$tmp/t.txt" -t 1 "$@" 2> /dev/null | awk '$1 == "loss" { print $2 }'; }
# |a - b| <= 1e-5, for the same weights in the other RoPE layout: attention scores are summed in
# another order, which moves logits by ~1e-6 relative (test_adapter measures it) and so the loss
# (printed to 1e-6) by a few 1e-6; a wrong row order or tokenization moves it by > 1e-2
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 1e-5) }'; }
gen() { "$FT" generate -p "Once upon a time" -n 40 --temp 0 -t 1 --quiet "$@" 2> /dev/null; }  # greedy

# 1. Hugging Face and llama2.c → GGUF: the reference's tensors and vocabulary, the same loss as the source
"$FT" merge -m "$HF" -o "$tmp/hf.gguf" 2> "$tmp/err.txt" \
    && $CHECK model "$tmp/hf.gguf" --file-type 0 --tensor token_embd.weight=F32 >> "$tmp/err.txt" 2>&1 \
    && $CHECK compare "$tmp/hf.gguf" "$S/stories260K.gguf" >> "$tmp/err.txt" 2>&1 \
    && close "$(loss -m "$tmp/hf.gguf")" "$(loss -m "$HF")" \
    && pass hf_to_gguf || fail hf_to_gguf "$(cat "$tmp/err.txt")"
"$FT" merge -m "$S/stories260K.bin" -o "$tmp/bin.gguf" 2> "$tmp/err.txt" \
    && $CHECK model "$tmp/bin.gguf" --file-type 0 >> "$tmp/err.txt" 2>&1 \
    && $CHECK compare "$tmp/bin.gguf" "$S/stories260K.gguf" >> "$tmp/err.txt" 2>&1 \
    && lb=$(loss -m "$tmp/bin.gguf") && [ -n "$lb" ] && [ "$lb" = "$(loss -m "$S/stories260K.bin")" ] \
    && pass llama2c_to_gguf || fail llama2c_to_gguf "$(cat "$tmp/err.txt")"

# a Llama with q/k/v biases (attention_bias): the q/k biases are permuted with their rows
mkdir -p "$tmp/hfbias" && cp "$HF"/tokenizer*.json "$HF"/generation_config.json "$tmp/hfbias/"
"$PY" - "$HF" "$tmp/hfbias" > "$tmp/err.txt" 2>&1 <<'PY'
import json, struct, sys
import numpy as np
src, dst = sys.argv[1], sys.argv[2]
raw = open(f"{src}/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
cfg = json.load(open(f"{src}/config.json"))
cfg["attention_bias"] = True
json.dump(cfg, open(f"{dst}/config.json", "w"))
ts = {}
for k, v in head.items():
    if k == "__metadata__":
        continue
    assert v["dtype"] == "F32", k
    a, b = v["data_offsets"]
    ts[k] = np.frombuffer(raw[8 + n + a:8 + n + b], "<f4").reshape(v["shape"])
rng = np.random.default_rng(3)
for l in range(cfg["num_hidden_layers"]):
    for p in ("q", "k", "v"):
        w = ts[f"model.layers.{l}.self_attn.{p}_proj.weight"]
        ts[f"model.layers.{l}.self_attn.{p}_proj.bias"] = (rng.standard_normal(w.shape[0]) * 0.5).astype("<f4")
hdr, off, blobs = {}, 0, []
for k in sorted(ts):
    b = np.ascontiguousarray(ts[k]).tobytes()
    hdr[k] = {"dtype": "F32", "shape": list(ts[k].shape), "data_offsets": [off, off + len(b)]}
    off += len(b)
    blobs.append(b)
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(f"{dst}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
"$FT" merge -m "$tmp/hfbias" -o "$tmp/hfbias.gguf" 2>> "$tmp/err.txt" \
    && $CHECK model "$tmp/hfbias.gguf" --file-type 0 --tensor blk.0.attn_k.bias=F32 >> "$tmp/err.txt" 2>&1 \
    && lb=$(loss -m "$tmp/hfbias") && close "$lb" "$(loss -m "$tmp/hfbias.gguf")" && ! close "$lb" "$(loss -m "$HF")" \
    && pass hf_bias_to_gguf || fail hf_bias_to_gguf "$(cat "$tmp/err.txt") [${lb:-}]"

# 2. each --dtype from the (untied) GGUF base: llama.cpp's file type, the tensor types, and it loads again;
#    ffn_down (172 columns, not whole 32-element blocks) keeps f32 under q8_0/q4_0
for spec in f32:0:F32:F32:F32 f16:1:F16:F16:F16 bf16:32:BF16:BF16:BF16 q8_0:7:Q8_0:Q8_0:Q8_0 q4_0:2:Q4_0:Q8_0:Q4_0; do
    IFS=: read -r dt ftype embd out q <<< "$spec"
    down=$q; case $q in Q*) down=F32 ;; esac
    "$FT" merge -m "$S/stories260K.gguf" -o "$tmp/$dt.gguf" --dtype "$dt" 2> "$tmp/err.txt" \
        && $CHECK model "$tmp/$dt.gguf" --file-type "$ftype" --tensor "token_embd.weight=$embd" \
            --tensor "output.weight=$out" --tensor "blk.0.attn_q.weight=$q" --tensor "blk.4.ffn_down.weight=$down" \
            --tensor "blk.0.attn_norm.weight=F32" >> "$tmp/err.txt" 2>&1 \
        && [ -n "$(loss -m "$tmp/$dt.gguf")" ] \
        && pass "merge_$dt" || fail "merge_$dt" "$(cat "$tmp/err.txt")"
done
# a tied embedding is the output matrix: q4_0 writes it as q8_0, and the summary says so
"$FT" merge -m "$HF" -o "$tmp/hq4.gguf" --dtype q4_0 2> "$tmp/err.txt" \
    && $CHECK model "$tmp/hq4.gguf" --file-type 2 --tensor token_embd.weight=Q8_0 --tensor blk.1.ffn_up.weight=Q4_0 \
        >> "$tmp/err.txt" 2>&1 \
    && grep -q "general.file_type 2; matrices: 5 f32 1 q8_0 30 q4_0 (tied token_embd/output q8_0" "$tmp/err.txt" \
    && pass merge_q4_0_tied || fail merge_q4_0_tied "$(cat "$tmp/err.txt")"

# 3. an adapter exported as GGUF: the adapter keys; read back it gives the PEFT adapter's loss and greedy
#    text; merge takes it
stories_jsonl "$tmp/d.jsonl" 2
"$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 32 -t 1 --quiet --steps 3 --lr 1e-2 --val-split 0 \
    -o "$tmp/a" --export-gguf 2> "$tmp/err.txt" \
    && alpha=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['lora_alpha'])" "$tmp/a/adapter_config.json") \
    && $CHECK adapter "$tmp/a/adapter.gguf" --alpha "$alpha" >> "$tmp/err.txt" 2>&1 \
    && lp=$(loss -m "$HF" --adapter "$tmp/a") && lg=$(loss -m "$HF" --adapter "$tmp/a/adapter.gguf") \
    && [ -n "$lp" ] && [ "$lp" = "$lg" ] && ! close "$lp" "$(loss -m "$HF")" \
    && gp=$(gen -m "$HF" --adapter "$tmp/a") && [ "$gp" = "$(gen -m "$HF" --adapter "$tmp/a/adapter.gguf")" ] \
    && "$FT" merge -m "$S/stories260K.gguf" --adapter "$tmp/a/adapter.gguf" -o "$tmp/ma.gguf" --dtype q8_0 \
        2>> "$tmp/err.txt" \
    && $CHECK model "$tmp/ma.gguf" --file-type 7 >> "$tmp/err.txt" 2>&1 \
    && pass gguf_adapter || fail gguf_adapter "$(cat "$tmp/err.txt") [peft: ${lp:-} gguf: ${lg:-}]"
# the same adapter in F16 (llama.cpp's LoRA converter's default type): f16 rounds each weight by <= 2^-11
# (4.9e-4) relative, so the loss, which the adapter moves by ~0.4 here, moves by well under 1e-3 (measured 4e-5)
if [ -n "${lg:-}" ] && $CHECK to-f16 "$tmp/a/adapter.gguf" "$tmp/a16.gguf" > "$tmp/err.txt" 2>&1 \
    && l16=$(loss -m "$HF" --adapter "$tmp/a16.gguf") \
    && "$PY" -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) >= 1e-3)' \
        "$l16" "$lg"; then pass gguf_adapter_f16; else fail gguf_adapter_f16 "$(cat "$tmp/err.txt") [f16: ${l16:-} f32: ${lg:-}]"; fi
"$FT" eval -m "$HF" --adapter "$S/stories260K.gguf" --text "$tmp/t.txt" 2> "$tmp/err.txt" >/dev/null
[ $? -ne 0 ] && grep -q "stories260K.gguf: no general.type: not a llama.cpp LoRA adapter" "$tmp/err.txt" \
    && pass gguf_adapter_not_lora || fail gguf_adapter_not_lora "$(cat "$tmp/err.txt")"

# 3b. models without GGUF metadata of their own: a full fine-tune's output, and ftune init's (no tokenizer:
#     --tokenizer gives one), reach GGUF with the same loss as the directory
"$FT" train -m "$HF" --full --data "$tmp/d.jsonl" --ctx 32 -t 1 --quiet --steps 2 --val-split 0 -o "$tmp/full" \
    2> "$tmp/err.txt" \
    && "$FT" merge -m "$tmp/full" -o "$tmp/full.gguf" 2>> "$tmp/err.txt" \
    && $CHECK model "$tmp/full.gguf" --file-type 0 >> "$tmp/err.txt" 2>&1 \
    && lf=$(loss -m "$tmp/full") && close "$lf" "$(loss -m "$tmp/full.gguf")" && ! close "$lf" "$(loss -m "$HF")" \
    && pass full_finetune_to_gguf || fail full_finetune_to_gguf "$(cat "$tmp/err.txt")"
"$FT" init --preset stories260K "$tmp/init" > /dev/null 2>&1
"$FT" merge -m "$tmp/init" -o "$tmp/init.gguf" 2> "$tmp/err.txt"
[ $? -ne 0 ] && grep -q "no tokenizer to write into the GGUF (give one: --tokenizer FILE)" "$tmp/err.txt" \
    && pass init_to_gguf_needs_tokenizer || fail init_to_gguf_needs_tokenizer "$(cat "$tmp/err.txt")"
mkdir -p "$tmp/init_tok" && cp "$tmp/init"/* "$HF"/tokenizer*.json "$tmp/init_tok/"
"$FT" merge -m "$tmp/init" --tokenizer "$S/tok512.bin" -o "$tmp/init.gguf" 2> "$tmp/err.txt" \
    && $CHECK model "$tmp/init.gguf" --file-type 0 >> "$tmp/err.txt" 2>&1 \
    && close "$(loss -m "$tmp/init.gguf")" "$(loss -m "$tmp/init_tok")" \
    && pass init_to_gguf || fail init_to_gguf "$(cat "$tmp/err.txt")"

# an embedding with more rows than the tokenizer has tokens: the rest are [PAD<i>] of type UNUSED, as
# llama.cpp's converter pads them, and the file still loads
sed 's/"vocab_size": 512/"vocab_size": 520/' "$HF/config.json" > "$tmp/cfg520.json"
"$FT" init --config "$tmp/cfg520.json" "$tmp/init520" > /dev/null 2>&1 \
    && "$FT" merge -m "$tmp/init520" --tokenizer "$S/tok512.bin" -o "$tmp/pad.gguf" 2> "$tmp/err.txt" \
    && $CHECK model "$tmp/pad.gguf" --file-type 0 >> "$tmp/err.txt" 2>&1 \
    && "$PY" -c '
import sys, gguf
sys.path.insert(0, "scripts")
from gguf_py_check import value
r = gguf.GGUFReader(sys.argv[1])
toks, types = value(r, "tokenizer.ggml.tokens"), value(r, "tokenizer.ggml.token_type")
assert len(toks) == 520 and toks[512] == "[PAD512]" and toks[519] == "[PAD519]", toks[510:]
assert types[512:] == [5] * 8 and types[511] == 1, types[510:]
' "$tmp/pad.gguf" >> "$tmp/err.txt" 2>&1 \
    && [ -n "$(loss -m "$tmp/pad.gguf")" ] \
    && pass gguf_vocab_padded || fail gguf_vocab_padded "$(cat "$tmp/err.txt")"

# 4. files written by gguf-py: a random model (awkward sizes, GQA, untied) gives the loss and greedy text of
#    the same weights as a llama2.c file, and ftune writes it back tensor for tensor (a file with a tensor the
#    metadata does not use is refused naming it, as llama.cpp refuses it); a vocab-only file
#    tokenizes as the llama2.c tokenizer
if $CHECK write "$tmp" "$S/stories260K.gguf" > "$tmp/err.txt" 2>&1; then
    lg=$(loss -m "$tmp/rand.gguf"); lb=$(loss -m "$tmp/rand.bin" --tokenizer "$S/tok512.bin")
    g1=$(gen -m "$tmp/rand.gguf"); g2=$(gen -m "$tmp/rand.bin" --tokenizer "$S/tok512.bin")
    [ -n "$lg" ] && [ "$lg" = "$lb" ] && [ -n "$g1" ] && [ "$g1" = "$g2" ] \
        && "$FT" merge -m "$tmp/rand.bin" --tokenizer "$S/tok512.bin" -o "$tmp/rand_ft.gguf" 2>> "$tmp/err.txt" \
        && $CHECK compare "$tmp/rand_ft.gguf" "$tmp/rand.gguf" >> "$tmp/err.txt" 2>&1 \
        && ! "$FT" merge -m "$tmp/rand_extra.gguf" -o "$tmp/rand_extra_ft.gguf" 2> "$tmp/extra.txt" \
        && grep -q '"blk.0.attn_extra.weight"' "$tmp/extra.txt" && [ ! -e "$tmp/rand_extra_ft.gguf" ] \
        && pass gguf_py_model || fail gguf_py_model "$(cat "$tmp/err.txt") [gguf: $lg bin: $lb]"
    text="Once upon a time, Lily and Tom found a big red ball in the park."
    a=$(echo "$text" | "$FT" tokenize --tokenizer "$tmp/vocab.gguf" 2>&1)
    b=$(echo "$text" | "$FT" tokenize --tokenizer "$S/tok512.bin" 2>&1)
    [ "$(echo "$a" | wc -w)" -gt 10 ] && [ "$a" = "$b" ] \
        && pass gguf_py_vocab || fail gguf_py_vocab "vocab.gguf: $a; tok512.bin: $b"
else
    fail gguf_py_write "$(cat "$tmp/err.txt")"
fi

# 5. byte-level BPE models from Hugging Face (random weights, GPT-2's vocabulary; made by make_fixture.py):
#    Qwen2 (bf16, q/k/v biases, rotate-half RoPE kept) and Llama 3 (f16, rope_freqs for its scaling):
#    the keys llama.cpp needs, and the same loss (so the same tokens and logits) as the directory
text="Hello world! It's 2024, we'll see 12345 cats.
  New   lines\tand tabs."
for spec in qwen2:32:qwen2 llama3:1:llama; do
    IFS=: read -r kind ftype arch <<< "$spec"
    extra=(--tensor blk.0.attn_q.bias=F32); [ "$kind" = llama3 ] && extra=(--tensor rope_freqs.weight=F32)
    if /usr/bin/python3 scripts/make_fixture.py --kind "$kind" --out "$tmp/$kind" > "$tmp/err.txt" 2>&1 \
        && "$FT" merge -m "$tmp/$kind" -o "$tmp/$kind.gguf" 2>> "$tmp/err.txt" \
        && $CHECK model "$tmp/$kind.gguf" --file-type "$ftype" --key general.architecture="$arch" \
            --key tokenizer.ggml.model=gpt2 --key tokenizer.ggml.pre=gpt-2 "${extra[@]}" >> "$tmp/err.txt" 2>&1; then
        lh=$(loss -m "$tmp/$kind"); lg=$(loss -m "$tmp/$kind.gguf")
        a=$(printf '%s' "$text" | "$FT" tokenize -m "$tmp/$kind" 2>&1)
        b=$(printf '%s' "$text" | "$FT" tokenize -m "$tmp/$kind.gguf" 2>&1)
        close "$lh" "$lg" && [ "$a" = "$b" ] && [ "$(echo "$a" | wc -w)" -gt 10 ] \
            && pass "hf_bpe_to_gguf_$kind" || fail "hf_bpe_to_gguf_$kind" "loss $lh vs $lg; ids $a vs $b"
    else
        fail "hf_bpe_to_gguf_$kind" "$(cat "$tmp/err.txt")"
    fi
done
# a pre-tokenizer llama.cpp has no name for is refused, not written under a wrong name
if [ -d "$tmp/qwen2" ]; then
    mkdir -p "$tmp/qwen2_re" && cp "$tmp/qwen2"/*.json "$tmp/qwen2"/*.safetensors* "$tmp/qwen2_re/" 2> /dev/null
    /usr/bin/python3 - "$tmp/qwen2_re/tokenizer.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "\\s+|\\S+"}, "behavior": "Isolated", "invert": False}
json.dump(j, open(sys.argv[1], "w"))
PY
    "$FT" merge -m "$tmp/qwen2_re" -o "$tmp/qwen2_re.gguf" 2> "$tmp/err.txt"
    [ $? -ne 0 ] && grep -q "tokenizer.json: the pre_tokenizer is not one llama.cpp names" "$tmp/err.txt" \
        && [ ! -e "$tmp/qwen2_re.gguf" ] && pass hf_bpe_unknown_pre || fail hf_bpe_unknown_pre "$(cat "$tmp/err.txt")"
fi

# 6. Llama 3's tiktoken tokenizer.model (no merge list) for a model without a tokenizer: the merges are made
#    as llama.cpp's converter gets them, and the GGUF tokenizes as the tiktoken file does
L3=$DATA/tokenizers/llama3/tokenizer.model
sed 's/"vocab_size": 512/"vocab_size": 128256/' "$HF/config.json" > "$tmp/cfg_l3.json"
if "$FT" init --config "$tmp/cfg_l3.json" "$tmp/init_l3" > /dev/null 2>&1 \
    && "$FT" merge -m "$tmp/init_l3" --tokenizer "$L3" -o "$tmp/l3.gguf" 2> "$tmp/err.txt" \
    && $CHECK model "$tmp/l3.gguf" --file-type 0 --key tokenizer.ggml.model=gpt2 --key tokenizer.ggml.pre=llama-bpe \
        >> "$tmp/err.txt" 2>&1; then
    ok=1
    for t in "Hello world! It's 2024, we'll see 12345 cats." $'  New   lines\n\n\tand tabs.  ' \
             "Ünïcödé 日本語 русский 🤗 ((x))=>{y}" "<|start_header_id|>user<|end_header_id|> hi<|eot_id|>"; do
        for sp in "" --parse-special; do
            a=$(printf '%s' "$t" | "$FT" tokenize --tokenizer "$L3" $sp 2>&1)
            b=$(printf '%s' "$t" | "$FT" tokenize -m "$tmp/l3.gguf" $sp 2>&1)
            [ -n "$a" ] && [ "$a" = "$b" ] || { ok=0; echo "  '$t' $sp: $a / $b" >> "$tmp/err.txt"; }
        done
    done
    [ $ok = 1 ] && pass tiktoken_to_gguf || fail tiktoken_to_gguf "$(cat "$tmp/err.txt")"
else
    fail tiktoken_to_gguf "$(cat "$tmp/err.txt")"
fi
