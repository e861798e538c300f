#!/usr/bin/env bash
# A Hugging Face directory written from a GGUF or llama2.c base (train --full,
# merge, quantize --type nf4) carries the base's tokenizer as tokenizer.json +
# tokenizer_config.json: ftune loads the directory and tokenizes a varied set
# of texts (and one long text of random pieces of them) to the ids of the
# source model, with and without special tokens parsed, and so do Hugging Face
# tokenizers and transformers' AutoTokenizer (which reads
# tokenizer_config.json) in .venv. The same for llama.cpp's vocabulary-only
# GGUFs (Llama 2's SentencePiece vocabulary, whose runs of "▁" share a score,
# Phi-3's, GPT-2's, Falcon's), written as the model writer writes them. A
# SentencePiece vocabulary with tied scores, which tokenizer.json cannot
# express, is refused before anything is written or trained.
set -u
. "$(dirname "$0")/lib.sh"
S=$D/models/stories260K
vpy=.venv/bin/python

# the texts: one file each, byte for byte (one is not in NFC: "e" + U+0301)
mkdir -p "$tmp/texts"
python3 - "$tmp/texts" <<'EOF'
import sys, random
texts = [
    "Once upon a time, there was a little girl named Lily.",
    "Hello world",
    "  leading and trailing spaces  ",
    "multiple     spaces   between\twords\tand tabs",
    "line one\nline two\n\nline four\r\nwindows line\n",
    "\n",
    " ",
    "a",
    "digits 0123456789 3.14159 2026-12-03 1,000,000 x86_64",
    "unicode: café naïve Ünïcödé façade Straße ñandú, decomposed: cafe\u0301 n\u0303",
    "日本語のテキスト 中文文本 한국어 텍스트 Ελληνικά русский текст עברית العربية",
    "emoji: 😀🎉👍🏽 🇫🇷 ❤️ 🤖 and ZWJ 👩‍💻",
    "punctuation!!! ??? ... --- (brackets) [x] {y} <tag> a+b=c #hash @at $5 100%",
    "contractions: I'm, you'll, we've, she's, they'd, don't, CAN'T",
    "code: def f(x):\n    return x ** 2  # square\n",
    "The little dog ran to the park. He saw a big red ball!",
    "mixed <s> and </s> and <|im_end|> texts",
    # runs of 1 .. 40 spaces between words and as indentation (Llama 2's runs of "▁" share a score)
    "".join("w%d%s" % (k, " " * k) for k in range(1, 41)),
    "".join("\n%sdef f%d():" % (" " * k, k) for k in range(0, 41)),
]
for i, t in enumerate(texts):
    open("%s/%02d.txt" % (sys.argv[1], i), "w", encoding="utf-8", newline="").write(t)
# and one long text of random pieces of them (suffixes, prefixes, words) joined
# by varied whitespace: where a merge order written as tokenizer.json would
# differ from the source's, it shows here
words = "".join(texts).split()
rng = random.Random(1234)
parts = []
for _ in range(3000):
    w = rng.choice(words)
    k = rng.randrange(3)
    if k == 0: w = w[rng.randrange(len(w)):]
    elif k == 1: w = w[:rng.randrange(1, len(w) + 1)]
    parts += [w, rng.choice([" ", " ", " ", "", "  ", "\n", " \t"])]
open(sys.argv[1] + "/../random.txt", "w", encoding="utf-8", newline="").write("".join(parts))
EOF

# ids of every text from model $1 (extra flags after it) into file $2, one line per text
ids_of() {
    local m=$1 out=$2; shift 2
    : > "$out"
    for f in "$tmp"/texts/*.txt "$tmp/random.txt"; do
        "$FT" tokenize -m "$m" "$@" < "$f" >> "$out" 2>> "$tmp/tok_err.txt" || { echo "ERROR" >> "$out"; }
    done
}

cases=()   # name:source:outdir
TRAIN_TXT=$tmp/train.txt
head -c 4000 "$D/text/tinyshakespeare/input.txt" > "$TRAIN_TXT"
add_case() {  # name source outdir how...
    local name=$1 src=$2 out=$3; shift 3
    if "$@" > "$tmp/$name.log" 2>&1; then
        if [ -f "$out/tokenizer.json" ] && [ -f "$out/tokenizer_config.json" ]; then
            cases+=("$name:$src:$out"); pass "${name}_written"
        else fail "${name}_written" "no tokenizer.json/tokenizer_config.json in $out: $(ls "$out" | tr '\n' ' ')"; fi
    else fail "${name}_written" "$(tail -3 "$tmp/$name.log")"; fi
}
FULL="--full --steps 2 --ctx 32 --batch-size 2 --lr 1e-4 --quiet"
add_case gguf_full "$S/stories260K.gguf" "$tmp/gguf_full" "$FT" train -m "$S/stories260K.gguf" --data "$TRAIN_TXT" -o "$tmp/gguf_full" $FULL
add_case llama2c_full "$S/stories260K.bin" "$tmp/llama2c_full" "$FT" train -m "$S/stories260K.bin" --data "$TRAIN_TXT" -o "$tmp/llama2c_full" $FULL
add_case gguf_merge "$S/stories260K.gguf" "$tmp/gguf_merge" "$FT" merge -m "$S/stories260K.gguf" -o "$tmp/gguf_merge"
add_case llama2c_merge "$S/stories260K.bin" "$tmp/llama2c_merge" "$FT" merge -m "$S/stories260K.bin" -o "$tmp/llama2c_merge" --dtype bf16
add_case gguf_quantize "$S/stories260K.gguf" "$tmp/gguf_quantize" "$FT" quantize --type nf4 "$S/stories260K.gguf" "$tmp/gguf_quantize"
if need_model smollm2_merge "$SMOL"; then
    add_case smollm2_merge "$SMOL" "$tmp/smollm2_merge" "$FT" merge -m "$SMOL" -o "$tmp/smollm2_merge" --dtype bf16
fi
if need_model qwen2_merge "$QWEN"; then  # the qwen2 pre-tokenizer, NFC, 151936 ids
    add_case qwen2_merge "$QWEN" "$tmp/qwen2_merge" "$FT" merge -m "$QWEN" -o "$tmp/qwen2_merge" --dtype bf16
fi

# and the vocabulary-only GGUFs of llama.cpp's tests (Llama 2's and Phi-3's
# SentencePiece vocabularies, GPT-2's and Falcon's byte-level ones), written as
# the model writer writes them
helper=${BUILD:-build}/tests/helper_eco
for v in llama-spm phi-3 gpt-2 falcon; do
    mkdir -p "$tmp/vocab_$v"
    add_case "vocab_$v" "$D/vocab-tests/ggml-vocab-$v.gguf" "$tmp/vocab_$v" "$helper" write-hf \
        "$D/vocab-tests/ggml-vocab-$v.gguf" "$tmp/vocab_$v"
done

# (a) ftune on the written directory = ftune on the source, with and without
# special-token parsing. llama2.c's tokenizer.bin stores BOS and EOS as "\n<s>\n"
# and "\n</s>\n"; they are written as "<s>" and "</s>" (as llama.cpp's converter
# names them in the same model's GGUF), so with special tokens parsed the
# reference is that GGUF, whose ids equal the .bin's on the plain texts
if cmp -s <(ids_of "$S/stories260K.bin" /dev/stdout) <(ids_of "$S/stories260K.gguf" /dev/stdout); then
    pass "llama2c_bin_equals_gguf_plain"
else fail "llama2c_bin_equals_gguf_plain" "stories260K.bin and .gguf tokenize the texts differently"; fi
for c in "${cases[@]}"; do
    IFS=: read -r name src out <<<"$c"
    for mode in plain special; do
        flags=(); [ $mode = special ] && flags=(--parse-special)
        ref=$src; [ $mode = special ] && [ "$src" = "$S/stories260K.bin" ] && ref=$S/stories260K.gguf
        want=$tmp/ref.$(echo "$ref" | md5sum | cut -c1-12).$mode  # one source serves several cases
        [ -f "$want" ] || ids_of "$ref" "$want" "${flags[@]}"
        cp "$want" "$tmp/$name.src.$mode"
        ids_of "$out" "$tmp/$name.out.$mode" "${flags[@]}"
        if grep -q ERROR "$tmp/$name.src.$mode" "$tmp/$name.out.$mode"; then
            fail "${name}_ftune_ids_$mode" "ftune tokenize failed: $(tail -2 "$tmp/tok_err.txt")"
        elif cmp -s "$tmp/$name.src.$mode" "$tmp/$name.out.$mode"; then
            pass "${name}_ftune_ids_$mode ($(wc -l < "$tmp/$name.src.$mode") texts)"
        else
            fail "${name}_ftune_ids_$mode" "$(diff "$tmp/$name.src.$mode" "$tmp/$name.out.$mode" | head -4 | cut -c1-300)"
        fi
    done
done

# (b) Hugging Face tokenizers (and AutoTokenizer) on tokenizer.json = ftune on the
# source with special tokens parsed (Hugging Face always matches added tokens),
# BOS as the model's files say
if [ ! -x "$vpy" ] || ! "$vpy" -c "import tokenizers" 2>/dev/null; then
    skip_or_fail hf_tokenizers tool ".venv with tokenizers is missing (scripts/setup.sh makes it)"
else
    for c in "${cases[@]}"; do
        IFS=: read -r name src out <<<"$c"
        [ -f "$tmp/$name.src.special" ] && echo "$name $out $tmp/$name.src.special"
    done > "$tmp/hf_cases.txt"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$vpy" - "$tmp/texts" "$tmp/random.txt" "$tmp/hf_cases.txt" <<'EOF'
import sys, glob, os
from tokenizers import Tokenizer
tdir, rnd, cases = sys.argv[1:4]
files = sorted(glob.glob(tdir + "/*.txt")) + [rnd]
texts = [open(f, encoding="utf-8", newline="").read() for f in files]
try:
    from transformers import AutoTokenizer
except Exception as e:
    AutoTokenizer, why = None, e
def check(name, encode):
    bad = [i for i, t in enumerate(texts) if encode(t) != want[i]]
    if bad:
        i = bad[0]
        print("FAIL %s: %d of %d texts differ; %s: got %s want %s" % (name, len(bad), len(texts), files[i],
              encode(texts[i])[:20], want[i][:20]))
    else:
        print("PASS %s (%d texts, %d ids)" % (name, len(texts), sum(map(len, want))))
for line in open(cases).read().split("\n"):
    if not line: continue
    name, out, want_path = line.split(" ")
    want = [[int(x) for x in l.split()] for l in open(want_path).read().split("\n")[:len(texts)]]
    tok = Tokenizer.from_file(out + "/tokenizer.json")
    check(name + "_hf_tokenizers", lambda t: tok.encode(t).ids)
    if AutoTokenizer is None:  # a missing package: a failure under FTUNE_REQUIRE=all, as skip_or_fail does
        print("%s %s_autotokenizer: transformers does not import from .venv: %s" %
              ("FAIL" if os.environ.get("FTUNE_REQUIRE") == "all" else "SKIP", name, why)); continue
    at = AutoTokenizer.from_pretrained(out)
    at.model_max_length = 1 << 30  # the long text is no model input: no length warning
    check(name + "_autotokenizer_" + type(at).__name__, lambda t: at(t)["input_ids"])
EOF
    [ $? -eq 0 ] || fail hf_tokenizers "the Python check stopped (its traceback is above)"
fi

# (c) a SentencePiece vocabulary whose scores tie (here: all zero) merges
# leftmost-first, which tokenizer.json's ranked merges cannot express: refused,
# naming the type, before anything is written (merge) or trained (train --full)
if [ -x "$vpy" ] && "$vpy" -c "import gguf" 2>/dev/null; then
    "$vpy" - "$S/stories260K.gguf" "$tmp/tied.gguf" <<'EOF'
import sys, numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType
r = GGUFReader(sys.argv[1])
w = GGUFWriter(sys.argv[2], arch="llama")
for k, f in r.fields.items():
    if k.startswith("GGUF.") or k == "general.architecture": continue
    vt = f.types[0]
    if k == "tokenizer.ggml.scores":
        w.add_array(k, [0.0] * len(f.data)); continue
    if vt == GGUFValueType.ARRAY:
        et = f.types[1]
        if et == GGUFValueType.STRING: v = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        else: v = [f.parts[i].tolist()[0] for i in f.data]
        w.add_array(k, v)
    elif vt == GGUFValueType.STRING: w.add_string(k, bytes(f.parts[f.data[0]]).decode("utf-8"))
    else: w.add_key_value(k, f.parts[f.data[0]].tolist()[0], vt)
for t in r.tensors:
    w.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed([int(x) for x in t.shape])), raw_dtype=t.tensor_type)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
EOF
    if [ -f "$tmp/tied.gguf" ]; then
        expect_error refuse_tied_scores_merge "SentencePiece.*score" "$FT" merge -m "$tmp/tied.gguf" -o "$tmp/tied_out"
        if [ -e "$tmp/tied_out" ]; then fail refuse_tied_scores_nothing_written "$tmp/tied_out exists"
        else pass refuse_tied_scores_nothing_written; fi
        expect_error refuse_tied_scores_train "SentencePiece.*score" "$FT" train -m "$tmp/tied.gguf" --data "$TRAIN_TXT" \
            -o "$tmp/tied_train" $FULL
        if [ -e "$tmp/tied_train" ]; then  # the run had not started: -o was not even made
            fail refuse_tied_scores_before_training "the run started: $(ls "$tmp/tied_train" | tr '\n' ' ')"
        else pass refuse_tied_scores_before_training; fi
    else fail refuse_tied_scores "could not write $tmp/tied.gguf with gguf-py"; fi
else
    skip_or_fail refuse_tied_scores tool ".venv with gguf-py is missing (scripts/setup.sh makes it)"
fi
