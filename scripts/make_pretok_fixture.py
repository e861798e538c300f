#!/usr/bin/env python3
"""Expected token ids for the pre-tokenizers ftune knows by their GGUF name
(tokenizer.ggml.pre) but that no file in the shared data uses.

For each name, builds a tokenizer.json from the GPT-2 vocabulary and merges in
the shared data with that pre-tokenizer written as Hugging Face's own model
files write it (a Sequence of Isolated Splits, then ByteLevel without its
regex), runs the Hugging Face `tokenizers` library on a small corpus (the
llama.cpp vocab-test strings plus lines aimed at each regex) and writes the
ids to tests/fixtures/pretok/gpt2_pretok.json. test_tokenizer.c rebuilds the
same tokenizer from ggml-vocab-gpt-2.gguf with tokenizer.ggml.pre set to the
name and checks it gives these ids.

Run from the repository root with a Python that has `tokenizers`:
    python3 scripts/make_pretok_fixture.py [DATA_DIR]      (DATA_DIR: ../shared/data)
"""
import json
import os
import sys

from tokenizers import Tokenizer
import tokenizers

DATA = sys.argv[1] if len(sys.argv) > 1 else os.path.join("..", "shared", "data")
OUT = os.path.join("tests", "fixtures", "pretok", "gpt2_pretok.json")

# The regexes as the models' tokenizer.json files spell them (DeepSeek LLM /
# Coder, Mistral Nemo "tekken", Viking, Seed-Coder), in order.
# Code points are written as \x{...}: several of these letters (U+1F7D,
# U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A) have canonical singleton
# decompositions, so a copy that went through Unicode normalization would
# silently become other characters (and empty ranges).
DEEPSEEK_LETTERS = ("\\s?["
    r"A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-"
    r"\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-"
    r"\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-"
    r"\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}"
    r"\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-"
    r"\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}"
    r"\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-"
    r"\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}"
    r"\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}"
    r"\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}"
    r"\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-"
    r"\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}"
    r"\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}"
    r"\x{1E900}-\x{1E943}"
    "]+")
PRE = {
    "deepseek-llm": ["[\r\n]", DEEPSEEK_LETTERS, r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+", "\\s+$", r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+", "\\p{N}+"],
    "deepseek-coder": ["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+", "\\p{N}"],
    "tekken": ["[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
               "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}|"
               " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
    "viking": [r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+", "\\p{N}"],
    "seed-coder": ["(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\r\n]+|"
                   "\\s*[\r\n]+|\\s+(?!\\S)|\\s+"],
}
IGNORE_MERGES = {"tekken"}

EXTRA = [
    "DeepSeek LLM: 深度求索，你好世界！한국어 텍스트와 日本語 カタカナ.",
    "def fooBar(x):\n    return x**2 + 12345.678  # comment\r\n\tend   ",
    "HTTPServer getHTTPResponseCode XMLHttpRequest camelCaseWord ÀÉÎõü ΑΒΓαβγ",
    "Numbers: 1, 22, 333, 4444, 55555 and ١٢٣ and ⅣⅫ.",
    "Punctuation!!! ... ??? (a|b) [c] {d} <e> \"quoted\" 'single' — dash – en…",
    "trailing spaces   \n\n\n  leading and\u3000ideographic space.",
    "I'm you're we've they'll she'd IT'S DON'T",
    "path/to//file\n/x ab//\r\n/cd  x/ a+/b",
    "McDonald's iPhone XMLParser \u00c9T\u00c9\u00e9t\u00e9 \u01c5ungla",
]


def cases():
    text = open(os.path.join(DATA, "vocab-tests", "ggml-vocab-gpt-2.gguf.inp"), encoding="utf-8").read()
    inp = text.split("\n__ggml_vocab_test__\n")
    if inp and inp[-1] == "":
        inp.pop()
    return [t for t in inp if t] + EXTRA


def tokenizer_json(name):
    vocab = json.load(open(os.path.join(DATA, "tokenizers", "gpt2", "vocab.json"), encoding="utf-8"))
    merges = [l for l in open(os.path.join(DATA, "tokenizers", "gpt2", "merges.txt"), encoding="utf-8").read().split("\n")
              if l and not l.startswith("#version")]
    splits = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in PRE[name]]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": splits + [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": name in IGNORE_MERGES, "vocab": vocab, "merges": merges},
    }


def main():
    texts = cases()
    out = {"source": "scripts/make_pretok_fixture.py", "tokenizers_version": tokenizers.__version__,
           "vocab": "GPT-2 (vocab-tests/ggml-vocab-gpt-2.gguf = tokenizers/gpt2)", "texts": texts, "ids": {}}
    for name in PRE:
        tok = Tokenizer.from_str(json.dumps(tokenizer_json(name)))
        out["ids"][name] = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    tmp = OUT + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, OUT)
    print("wrote %s: %d texts x %d pre-tokenizers" % (OUT, len(texts), len(PRE)))


if __name__ == "__main__":
    main()
