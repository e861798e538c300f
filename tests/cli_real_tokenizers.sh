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
run_real_models real_tokenizers real_tok "tokenizers transformers gguf" scripts/real_tokenizers.py --work "$tmp"
