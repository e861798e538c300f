#!/usr/bin/env bash
# The two real models' tokenizers, read by ftune from their GGUF files,
# against Hugging Face `tokenizers` built from the same files by
# transformers' GGUF loader (scripts/real_tokenizers.py): SmolLM2-135M-Instruct
# (byte-level BPE, the 'smollm' pre-tokenizer) and Qwen2.5-Coder-0.5B-Instruct
# (the 'qwen2' pre-tokenizer and NFC, 151936 ids), on a varied corpus and
# GSM8K's test questions and answers: ids with and without special tokens
# parsed, decoding, vocabulary size, BOS. A missing model is a skip (a
# failure under FTUNE_REQUIRE=all).
cd "$(dirname "$0")/.."
source tests/lib.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1   # never download
BUILD=${BUILD:-build}
HELPER=$BUILD/tests/helper_eco
VPY=.venv/bin/python
[ -x "$VPY" ] || { skip_or_fail real_tokenizers tool ".venv is missing (scripts/setup.sh makes it)"; exit $?; }
[ -x "$HELPER" ] || { fail real_tokenizers "$HELPER missing (run make)"; exit 1; }
for pkg in tokenizers transformers gguf; do
    "$VPY" -c "import $pkg" 2>/dev/null || { skip_or_fail real_tokenizers tool "python package $pkg is missing from .venv (scripts/setup.sh)"; exit $?; }
done
models=() rc=0
if need_model real_tok_smollm2 "$SMOL"; then models+=("$SMOL"); else rc=1; fi
if need_model real_tok_qwen2 "$QWEN"; then models+=("$QWEN"); else rc=1; fi
# a skip alone is status 0 unless FTUNE_REQUIRE=all made it a failure
[ "${FTUNE_REQUIRE:-}" = all ] || rc=0
[ ${#models[@]} -gt 0 ] || exit $rc
"$VPY" scripts/real_tokenizers.py --helper "$HELPER" --work "$tmp" "${models[@]}" || rc=1
exit $rc
