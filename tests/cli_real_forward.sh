#!/usr/bin/env bash
# The f32 forward pass of the two real models (SmolLM2-135M-Instruct Q4_1,
# Qwen2.5-Coder-0.5B-Instruct Q4_K_M, dequantized inside the products)
# against transformers' logits from its own GGUF loader (float32, oneDNN)
# (scripts/real_forward.py): max relative error of every position's logits
# within 1e-4, 32 greedy tokens identical after each of four short prompts,
# and `ftune generate --temp 0` printing them. A missing model is a skip (a
# failure under FTUNE_REQUIRE=all).
cd "$(dirname "$0")/.."
source tests/lib.sh
run_real_models real_forward real_forward "torch transformers gguf" scripts/real_forward.py --ftune "$FT" --work "$tmp"
