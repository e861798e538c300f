#!/usr/bin/env bash
# `ftune tokenize` and `ftune info` on files that hold only a tokenizer:
# llama.cpp's vocabulary-only ggml-vocab-*.gguf files against llama.cpp's own
# expected ids (.inp/.out), a tokenizer-only directory and a bare
# tokenizer.json against the full model directory, the tokenizers of models
# ftune cannot run, and a clear error when
# such a file is given to a command that runs a model.
set -u
. "$(dirname "$0")/lib.sh"
V=$D/vocab-tests

# 1. every test case of every vocabulary-only GGUF, through the command
for name in llama-spm phi-3 gpt-2 falcon; do
    f=$V/ggml-vocab-$name.gguf
    rm -f "$tmp"/case_*
    # .inp: cases separated by "\n__ggml_vocab_test__\n"; .out: one line of ids per case
    python3 -c '
import sys
cases = open(sys.argv[1], encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
for i, c in enumerate(cases[:-1] if cases[-1] == "" else cases):
    open("%s/case_%03d" % (sys.argv[2], i), "w", encoding="utf-8").write(c)
' "$f.inp" "$tmp" || { fail "tokenize_vocab_$name" "cannot split $f.inp"; continue; }
    n=0 bad=0 first=""
    for c in "$tmp"/case_*; do
        n=$((n + 1))
        want=$(sed -n "${n}p" "$f.out" | sed 's/^ *//; s/ *$//')
        got=$("$FT" tokenize -m "$f" --no-bos < "$c" 2> "$tmp/err") || { bad=$((bad + 1)); first=${first:-"case $n: $(cat "$tmp/err")"}; continue; }
        if [ "$got" != "$want" ]; then bad=$((bad + 1)); first=${first:-"case $n: got '$got' want '$want'"}; fi
    done
    if [ "$n" -gt 0 ] && [ "$bad" -eq 0 ]; then pass "tokenize_vocab_$name ($n cases)"
    else fail "tokenize_vocab_$name" "$bad of $n differ; $first"; fi
done

# 2. a directory with only the tokenizer files, and the bare tokenizer.json,
# give the ids of the full model directory (and of the llama2.c model)
H=$D/models/stories260K-hf
mkdir -p "$tmp/tok"; cp "$H/tokenizer.json" "$H/tokenizer_config.json" "$tmp/tok/"
text="Once upon a time, there was a little girl named Lily."
ref=$(printf '%s' "$text" | "$FT" tokenize -m "$H")
for m in "$tmp/tok" "$tmp/tok/tokenizer.json" "$D/models/stories260K/stories260K.bin"; do
    got=$(printf '%s' "$text" | "$FT" tokenize -m "$m" 2>&1)
    if [ -n "$ref" ] && [ "$got" = "$ref" ]; then pass "tokenize_only_$(basename "$m")"
    else fail "tokenize_only_$(basename "$m")" "got '$got' want '$ref'"; fi
done
got=$(printf '%s' "$text" | "$FT" tokenize --tokenizer "$D/models/stories260K/tok512.bin" 2>&1)
if [ "$got" = "$ref" ]; then pass "tokenize_tokenizer_flag"; else fail "tokenize_tokenizer_flag" "got '$got' want '$ref'"; fi

# 3. info describes them as vocabulary-only files
for m in "$V/ggml-vocab-gpt-2.gguf" "$tmp/tok"; do
    out=$("$FT" info "$m" 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && grep -q "vocabulary only" <<<"$out" && grep -qE "tokenizer: +(bpe|spm), [0-9]+ tokens" <<<"$out"; then
        pass "info_vocab_only_$(basename "$m")"
    else fail "info_vocab_only_$(basename "$m")" "exit $rc: $out"; fi
done
if "$FT" info "$V/ggml-vocab-gpt-2.gguf" | grep -q "tokenizer:      bpe, 50257 tokens"; then pass "info_vocab_count"
else fail "info_vocab_count" "$("$FT" info "$V/ggml-vocab-gpt-2.gguf" 2>&1)"; fi

# 4. models of an architecture ftune cannot run: a GGUF with tensors
# (architecture "gpt2", GPT-2's vocabulary) and a Hugging Face directory with
# model_type "gemma": tokenize works; info is an error saying why, but still
# describes the tokenizer
python3 - "$V/ggml-vocab-gpt-2.gguf" "$tmp/gpt2-arch.gguf" <<'PY' || fail "make_gguf" "python failed"
import struct, sys
# copy the vocabulary GGUF's key/values and add one f32 tensor [2]
d = open(sys.argv[1], "rb").read()
assert d[:4] == b"GGUF"
version, n_t, n_kv = struct.unpack_from("<IQQ", d, 4)
assert n_t == 0
pos = 24
def skip_val(t, p):
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if t == 8: return p + 8 + struct.unpack_from("<Q", d, p)[0]
    if t == 9:
        et, n = struct.unpack_from("<IQ", d, p); p += 12
        for _ in range(n): p = skip_val(et, p)
        return p
    return p + sizes[t]
for _ in range(n_kv):
    p = pos + 8 + struct.unpack_from("<Q", d, pos)[0]
    t = struct.unpack_from("<I", d, p)[0]
    pos = skip_val(t, p + 4)
name = b"token_embd.weight"
out = b"GGUF" + struct.pack("<IQQ", version, 1, n_kv) + d[24:pos]
out += struct.pack("<Q", len(name)) + name + struct.pack("<IQIQ", 1, 2, 0, 0)
out += b"\0" * ((-len(out)) % 32) + struct.pack("<ff", 1.0, 2.0)
open(sys.argv[2], "wb").write(out)
PY
mkdir -p "$tmp/gemma"; cp "$H/tokenizer.json" "$tmp/gemma/"
printf '{"model_type": "gemma", "hidden_size": 64}' > "$tmp/gemma/config.json"
gpt2_ref=$(printf 'Hello world' | "$FT" tokenize -m "$V/ggml-vocab-gpt-2.gguf" --no-bos)
for m in "$tmp/gpt2-arch.gguf" "$tmp/gemma"; do
    want=$gpt2_ref; [ "$m" = "$tmp/gemma" ] && want=$(printf 'Hello world' | "$FT" tokenize -m "$H" --no-bos)
    got=$(printf 'Hello world' | "$FT" tokenize -m "$m" --no-bos 2>&1)
    if [ -n "$want" ] && [ "$got" = "$want" ]; then pass "tokenize_unsupported_$(basename "$m")"
    else fail "tokenize_unsupported_$(basename "$m")" "got '$got' want '$want'"; fi
    "$FT" info "$m" > "$tmp/o" 2> "$tmp/e"
    rc=$?
    if [ $rc -eq 1 ] && grep -q "not supported" "$tmp/e" && grep -qE "tokenizer: +(bpe|spm), [0-9]+ tokens" "$tmp/o"; then
        pass "info_unsupported_$(basename "$m")"
    else fail "info_unsupported_$(basename "$m")" "exit $rc: $(cat "$tmp/o" "$tmp/e")"; fi
done

# 5. a command that runs the model says why it cannot
"$FT" generate -m "$V/ggml-vocab-falcon.gguf" -n 2 > "$tmp/o" 2> "$tmp/e"
rc=$?
if [ $rc -eq 1 ] && grep -q "vocabulary-only" "$tmp/e"; then pass "generate_vocab_only_error"
else fail "generate_vocab_only_error" "exit $rc: $(cat "$tmp/e")"; fi
"$FT" tokenize -m "$tmp/nonexistent" < /dev/null > "$tmp/o" 2> "$tmp/e"
rc=$?
if [ $rc -eq 1 ] && grep -q "nonexistent" "$tmp/e"; then pass "tokenize_missing_file"
else fail "tokenize_missing_file" "exit $rc: $(cat "$tmp/e")"; fi
