#!/usr/bin/env bash
# `ftune tokenize` and `ftune info` on files that hold only a tokenizer:
# llama.cpp's vocabulary-only ggml-vocab-*.gguf files against llama.cpp's own
# expected ids (.inp/.out), a tokenizer-only directory and a bare
# tokenizer.json against the full model directory, and a clear error when
# such a file is given to a command that runs a model.
set -u
FT=${FTUNE:-build/ftune}
D=${FTUNE_DATA:-../shared/data}
V=$D/vocab-tests
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

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

# 4. a command that runs the model says why it cannot
"$FT" generate -m "$V/ggml-vocab-falcon.gguf" -n 2 > "$tmp/o" 2> "$tmp/e"
rc=$?
if [ $rc -eq 1 ] && grep -q "vocabulary-only" "$tmp/e"; then pass "generate_vocab_only_error"
else fail "generate_vocab_only_error" "exit $rc: $(cat "$tmp/e")"; fi
"$FT" tokenize -m "$tmp/nonexistent" < /dev/null > "$tmp/o" 2> "$tmp/e"
rc=$?
if [ $rc -eq 1 ] && grep -q "nonexistent" "$tmp/e"; then pass "tokenize_missing_file"
else fail "tokenize_missing_file" "exit $rc: $(cat "$tmp/e")"; fi
