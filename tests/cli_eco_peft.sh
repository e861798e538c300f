#!/usr/bin/env bash
# ftune's models and adapters in the ecosystem's own readers, by their logits
# (scripts/eco_peft.py): transformers loads stories260K and the Qwen2- and
# Llama 3-shaped fixtures, ftune's full fine-tunes and merged models; PEFT
# loads ftune's rsLoRA adapters (a subset of targets); ftune loads adapters
# PEFT wrote (random non-zero B). Needs .venv from scripts/setup.sh: a missing
# package is a FAIL that names it.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export FTUNE_DATA=${FTUNE_DATA:-../shared/data}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1   # never download
export PYTHONWARNINGS=ignore   # PEFT warns about the adapters made on purpose to be refused
# one thread each: the models are tiny, and the machine is shared
export OMP_NUM_THREADS=1
PY=.venv/bin/python
FT=${FTUNE:-$BUILD/ftune}
HELPER=$BUILD/tests/helper_eco
tmp=${KEEP_TMP:-$(mktemp -d)}; [ -n "${KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT
if [ ! -x "$PY" ]; then echo "FAIL eco_peft: $PY missing (run scripts/setup.sh)"; exit 1; fi
for f in "$FT" "$HELPER"; do
    [ -x "$f" ] || { echo "FAIL eco_peft: $f missing (run make)"; exit 1; }
done
for pkg in torch transformers peft accelerate safetensors jinja2; do
    err=$("$PY" -c "import $pkg" 2>&1) || { echo "FAIL eco_peft: python package $pkg cannot be imported from $PY (run scripts/setup.sh): ${err##*$'\n'}"; exit 1; }
done
"$PY" scripts/eco_peft.py --ftune "$FT" --helper "$HELPER" --work "$tmp"
