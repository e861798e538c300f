#!/usr/bin/env bash
# The two real models' chat templates (the Jinja each GGUF carries) as
# ftune renders them, against transformers' apply_chat_template on the
# tokenizer its GGUF loader builds (scripts/real_chat.py): text and ids of
# conversations with and without a system message (the templates' default
# system messages), and `ftune generate --chat` stopping at <|im_end|>. A
# missing model is a skip (a failure under FTUNE_REQUIRE=all).
cd "$(dirname "$0")/.."
source tests/lib.sh
run_real_models real_chat real_chat "transformers jinja2 gguf" scripts/real_chat.py --ftune "$FT" --work "$tmp"
