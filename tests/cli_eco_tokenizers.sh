#!/usr/bin/env bash
# ftune's tokenizers against Hugging Face's `tokenizers` library: byte-level
# BPE and SentencePiece-style BPE on a varied corpus (scripts/eco_corpus.py),
# on the tokenizer.json files in $FTUNE_DATA, on ones built and trained
# here with the library, and on Llama 2's and Llama 3's tokenizer.model as
# transformers converts them (scripts/eco_tokenizers.py). Needs .venv from
# scripts/setup.sh: a missing package is a FAIL that names it.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export FTUNE_DATA=${FTUNE_DATA:-../shared/data}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1   # never download
PY=.venv/bin/python
HELPER=$BUILD/tests/helper_eco
tmp=${KEEP_TMP:-$(mktemp -d)}; [ -n "${KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT
if [ ! -x "$PY" ]; then echo "FAIL eco_tokenizers: $PY missing (run scripts/setup.sh)"; exit 1; fi
if [ ! -x "$HELPER" ]; then echo "FAIL eco_tokenizers: $HELPER missing (run make)"; exit 1; fi
for pkg in tokenizers transformers sentencepiece google.protobuf tiktoken; do
    err=$("$PY" -c "import $pkg" 2>&1) || { echo "FAIL eco_tokenizers: python package $pkg cannot be imported from $PY (run scripts/setup.sh): ${err##*$'\n'}"; exit 1; }
done
"$PY" scripts/eco_tokenizers.py --helper "$HELPER" --work "$tmp"
