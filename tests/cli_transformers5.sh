#!/usr/bin/env bash
# cli_transformers5.sh — config.json as transformers 5 writes it: RoPE in
# "rope_parameters" ({"rope_type", "rope_theta", "factor", ...}) instead of
# top-level rope_theta/rope_scaling, "dtype" instead of "torch_dtype", the chat
# template in chat_template.jinja. Each spelling of the same model must give the
# same `ftune info` and the same loss (hence logits), and the GGUF written from it
# the same rope.freq_base and rope_freqs (read back with gguf-py); the two
# spellings disagreeing, and a rope_type ftune does not compute (yarn), are
# errors naming config.json and the key. stories260K's weights under each config.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
VPY=.venv/bin/python
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
head -c 2000 "$D/text/tinyshakespeare/input.txt" > "$tmp/t.txt"

# variant NAME PYTHON-STATEMENTS: $tmp/NAME, stories260K-hf with config.json
# edited by the statements (on the dict c) and links to its weights and tokenizer
variant() {
    mkdir -p "$tmp/$1"
    ln -sf "$(cd "$HF" && pwd)/model.safetensors" "$tmp/$1/model.safetensors"
    ln -sf "$(cd "$HF" && pwd)/tokenizer.json" "$tmp/$1/tokenizer.json"
    $PY - "$HF/config.json" "$tmp/$1/config.json" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
}
loss() { "$FT" eval --text "$tmp/t.txt" -t 1 --json -m "$1" 2> "$tmp/eval_err.txt"; }
# logits of 400 positions (llama3 scaling acts past position 64 here), to a file
# named by $2: the same config in either spelling must give the same bytes
IDS=$(seq 1 400 | awk '{ printf "%s%d", (NR > 1 ? "," : ""), ($1 * 37) % 500 + 3 }')
logits() { ${BUILD:-build}/tests/helper_eco logits "$1" - "$IDS" "$tmp/$2.logits" 2> "$tmp/eval_err.txt"; }
info() { "$FT" info "$1" 2> /dev/null | grep -v -e '^file:' -e '^kernels:' -e '^amx:'; }

L3='{"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 256}'
# Llama 3's RoPE (theta 5e5, llama3 scaling) in each spelling
variant l3_old "c['rope_theta'] = 500000.0; c['rope_scaling'] = dict(rope_type='llama3', **$L3)"
variant l3_new "del c['rope_theta']; del c['rope_scaling']; c['rope_parameters'] = dict(rope_type='llama3', rope_theta=500000.0, **$L3)"
variant l3_both "c['rope_theta'] = 500000.0; c['rope_scaling'] = dict(rope_type='llama3', **$L3); c['rope_parameters'] = dict(rope_type='llama3', rope_theta=500000.0, **$L3)"
# Qwen2's 1e6 theta, no scaling; linear scaling
variant q_old "c['rope_theta'] = 1000000.0"
variant q_new "del c['rope_theta']; del c['rope_scaling']; c['rope_parameters'] = {'rope_type': 'default', 'rope_theta': 1000000.0}"
variant lin_old "c['rope_scaling'] = {'type': 'linear', 'factor': 2.0}"
variant lin_new "del c['rope_theta']; del c['rope_scaling']; c['rope_parameters'] = {'rope_type': 'linear', 'factor': 2.0, 'rope_theta': 10000.0}"

logits "$HF" base || fail logits "$(cat "$tmp/eval_err.txt")"
for k in l3 q lin; do
    logits "$tmp/${k}_old" "${k}_old" && logits "$tmp/${k}_new" "${k}_new" \
        && cmp -s "$tmp/${k}_old.logits" "$tmp/${k}_new.logits" && ! cmp -s "$tmp/${k}_old.logits" "$tmp/base.logits" \
        && [ "$(info "$tmp/${k}_old")" = "$(info "$tmp/${k}_new")" ] \
        && pass "rope_parameters_$k" \
        || fail "rope_parameters_$k" "logits differ from the old spelling's, or equal plain RoPE's: $(cat "$tmp/eval_err.txt"); info: $(diff <(info "$tmp/${k}_old") <(info "$tmp/${k}_new"))"
done
logits "$tmp/l3_both" l3_both && cmp -s "$tmp/l3_both.logits" "$tmp/l3_old.logits" && pass both_spellings_agree \
    || fail both_spellings_agree "$(cat "$tmp/eval_err.txt")"
info "$tmp/l3_new" | grep -q '^rope theta: *500000$' && info "$tmp/l3_new" | grep -q '^rope scaling: *llama3, factor 8,' \
    && pass info_rope_parameters || fail info_rope_parameters "$(info "$tmp/l3_new")"

# disagreement, and types ftune does not compute: errors naming the file and the key
variant theta_disagree "c['rope_theta'] = 10000.0; c['rope_parameters'] = {'rope_type': 'default', 'rope_theta': 500000.0}"
variant scaling_disagree "c['rope_scaling'] = {'rope_type': 'linear', 'factor': 2.0}; c['rope_parameters'] = {'rope_type': 'linear', 'factor': 4.0}"
variant scaling_vs_none "c['rope_scaling'] = {'rope_type': 'linear', 'factor': 2.0}; c['rope_parameters'] = {'rope_type': 'default'}"
YARN="{'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 128, 'rope_theta': 10000.0}"
variant yarn_new "del c['rope_scaling']; c['rope_parameters'] = $YARN"
variant yarn_old "c['rope_scaling'] = $YARN"
variant per_layer "c['rope_parameters'] = {'full_attention': {'rope_type': 'default', 'rope_theta': 10000.0}}"
variant partial "c['rope_parameters'] = {'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': 0.5}"
variant no_type "c['rope_parameters'] = {'rope_theta': 10000.0}"
variant dtype_disagree "c['torch_dtype'] = 'float32'; c['dtype'] = 'bfloat16'"
expect_error theta_disagree 'config.json: "rope_theta" 10000 and "rope_parameters"."rope_theta" 500000 disagree' \
    "$FT" info "$tmp/theta_disagree"
expect_error scaling_disagree 'config.json: "rope_scaling" (linear, factor 2) and "rope_parameters" (linear, factor 4) disagree' \
    "$FT" info "$tmp/scaling_disagree"
expect_error scaling_vs_none '"rope_parameters" (none) disagree' "$FT" info "$tmp/scaling_vs_none"
expect_error yarn_rope_parameters 'config.json: "rope_parameters" type "yarn" is not supported' \
    "$FT" eval --text "$tmp/t.txt" -m "$tmp/yarn_new"
expect_error yarn_rope_scaling 'config.json: "rope_scaling" type "yarn" is not supported' "$FT" info "$tmp/yarn_old"
expect_error rope_per_layer_type 'config.json: "rope_parameters" per layer type ("full_attention", ...) is not supported' \
    "$FT" info "$tmp/per_layer"
expect_error partial_rotary '"rope_parameters"."partial_rotary_factor" other than 1 is not supported' "$FT" info "$tmp/partial"
expect_error rope_parameters_no_type 'config.json: "rope_parameters" has no "rope_type"' "$FT" info "$tmp/no_type"
expect_error dtype_disagree 'config.json: "torch_dtype" "float32" and "dtype" "bfloat16" disagree' "$FT" info "$tmp/dtype_disagree"

# the GGUF written from the rope_parameters model: llama.cpp's keys for it, as from the old spelling
if [ -x "$VPY" ] && "$VPY" -c "import gguf" 2> /dev/null; then
    for k in l3_old l3_new q_new lin_new; do
        "$FT" merge -m "$tmp/$k" -o "$tmp/$k.gguf" > /dev/null 2> "$tmp/merge_err.txt" || fail "gguf_$k" "$(cat "$tmp/merge_err.txt")"
    done
    "$VPY" - "$tmp" > "$tmp/py.txt" 2>&1 <<'PY' && pass gguf_rope_parameters || fail gguf_rope_parameters "$(cat "$tmp/py.txt")"
import sys
import numpy as np
from gguf import GGUFReader
d = sys.argv[1]
def kv(r, key):
    f = r.fields[key]
    return f.parts[f.data[0]].tolist()
def freqs(r):
    t = [t for t in r.tensors if t.name == "rope_freqs.weight"]
    return np.array(t[0].data) if t else None
old, new = GGUFReader(f"{d}/l3_old.gguf"), GGUFReader(f"{d}/l3_new.gguf")
assert kv(new, "llama.rope.freq_base") == [500000.0], kv(new, "llama.rope.freq_base")
assert freqs(new) is not None and np.array_equal(freqs(new), freqs(old)), (freqs(new), freqs(old))
assert not np.all(freqs(new) == 1), freqs(new)
q = GGUFReader(f"{d}/q_new.gguf")
assert kv(q, "llama.rope.freq_base") == [1000000.0], kv(q, "llama.rope.freq_base")
assert freqs(q) is None
lin = GGUFReader(f"{d}/lin_new.gguf")
assert bytes(lin.fields["llama.rope.scaling.type"].parts[-1]).decode() == "linear"
assert kv(lin, "llama.rope.scaling.factor") == [2.0], kv(lin, "llama.rope.scaling.factor")
PY
    a=$(loss "$tmp/l3_new.gguf") && [ -n "$a" ] && awk -v a="$a" -v b="$(loss "$tmp/l3_new")" \
        'BEGIN { split(a, x, /[:,]/); split(b, y, /[:,]/); d = x[2] - y[2]; if (d < 0) d = -d; exit !(d <= 1e-5) }' \
        && pass gguf_rope_parameters_loss || fail gguf_rope_parameters_loss "gguf $a, hf $(loss "$tmp/l3_new")"
else
    skip_or_fail gguf_rope_parameters tool "gguf-py (the gguf package) is missing from .venv (scripts/setup.sh)"
fi

# merge into a Hugging Face directory: rope_parameters copied through and read back
# the same; a transformers 5 "dtype" follows the merged weights' dtype (as
# torch_dtype does), and chat_template.jinja is copied beside the tokenizer
variant t5 "del c['rope_theta']; del c['rope_scaling']; del c['torch_dtype']; c['dtype'] = 'float32'; c['rope_parameters'] = dict(rope_type='llama3', rope_theta=500000.0, **$L3)"
printf '%s' "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}" > "$tmp/t5/chat_template.jinja"
if "$FT" merge -m "$tmp/t5" -o "$tmp/t5_merged" --dtype bf16 > /dev/null 2> "$tmp/merge_err.txt"; then
    $PY - "$tmp/t5_merged/config.json" > "$tmp/py.txt" 2>&1 <<'PY' && pass merge_dtype_key || fail merge_dtype_key "$(cat "$tmp/py.txt")"
import json, sys
c = json.load(open(sys.argv[1]))
assert c.get("dtype") == "bfloat16" and c.get("torch_dtype") in (None, "bfloat16"), c
assert c["rope_parameters"]["rope_type"] == "llama3" and "rope_theta" not in c, c
PY
    [ "$(info "$tmp/t5_merged" | grep '^rope')" = "$(info "$tmp/t5" | grep '^rope')" ] && pass merge_rope_parameters \
        || fail merge_rope_parameters "$(info "$tmp/t5_merged" | grep '^rope')"
    cmp -s "$tmp/t5/chat_template.jinja" "$tmp/t5_merged/chat_template.jinja" && pass merge_chat_template_jinja \
        || fail merge_chat_template_jinja "chat_template.jinja not copied: $(ls "$tmp/t5_merged")"
else
    fail merge_t5 "$(cat "$tmp/merge_err.txt")"
fi
if [ -x "$VPY" ] && "$VPY" -c "import gguf" 2> /dev/null; then
    "$FT" merge -m "$tmp/t5" -o "$tmp/t5.gguf" > /dev/null 2> "$tmp/merge_err.txt" \
        && "$VPY" - "$tmp/t5.gguf" "$tmp/t5/chat_template.jinja" > "$tmp/py.txt" 2>&1 <<'PY' \
        && pass gguf_chat_template_jinja || fail gguf_chat_template_jinja "$(cat "$tmp/merge_err.txt" "$tmp/py.txt")"
import sys
from gguf import GGUFReader
f = GGUFReader(sys.argv[1]).fields["tokenizer.chat_template"]
assert bytes(f.parts[-1]).decode() == open(sys.argv[2]).read()
PY
fi
