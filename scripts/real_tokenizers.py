"""real_tokenizers.py — ftune's tokenizer read from a real model's GGUF against
Hugging Face `tokenizers` built from the same GGUF by transformers' GGUF
loader (AutoTokenizer.from_pretrained(dir, gguf_file=name)). Run with
.venv/bin/python by tests/cli_real_tokenizers.sh.

  real_tokenizers.py --helper build/tests/helper_eco --work DIR MODEL.gguf...

The corpus: eco_corpus.py's documents (code, a dozen scripts, emoji, whitespace
runs, numbers, special-token look-alikes), a few more that exercise the
models' own pre-tokenizers (digit runs, CJK next to Latin, contractions after
non-letters, newline runs after punctuation, ChatML text), and every question
and answer of GSM8K's test split ($FTUNE_DATA/text/gsm8k/test.jsonl).

For each document: the ids with special-token text left as text (tokenizers'
encode_special_tokens=True) and with it parsed (its default), both without
the post-processor's additions; the bytes ftune's pieces of the ids decode to
against tokenizers' decode of the same ids, and that they give the document
back (after the tokenizer's normalizer: Qwen2's NFC). Also the vocabulary
size (the file's token list) and that neither side adds BOS by default.

Where transformers 4.46's GGUF converter loses something the file says, the
reference is corrected from the file, not from ftune, and the line says so:
- tokenizer.ggml.pre = "smollm" is llama.cpp's name for SmolLM's pre-tokenizer,
  Digits(individual_digits) before GPT-2's ByteLevel regex (llama.cpp's
  regexes for it: \\p{N}, then GPT-2's). The converter builds a plain
  ByteLevel pre-tokenizer for every llama-architecture "gpt2" file, so it
  would put "123" in one piece where SmolLM2 has three.
- tokenizer.ggml.add_bos_token = false: the converter's LlamaTokenizerFast
  adds BOS whatever the file says, so BOS is checked against the file's key.
- the converter makes added (special) tokens only of Qwen2's three; the file
  marks more tokens control or user-defined (<|fim_prefix|>, <|repo_name|>,
  ...), which ftune parses as special tokens in the parsed mode. The
  reference gets the file's control and user-defined tokens as special added
  tokens, so that both sides parse the same set.
Prints PASS/FAIL lines; exits 1 if any failed.
"""
import argparse
import json
import os
import subprocess
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from eco_corpus import CORPUS  # noqa: E402

EXTRA = [
    "1 22 333 4444 55555 666666 7777777 88888888 999999999 10000000000",
    "Pi is 3.14159265358979, e is 2.71828; 1/3 = 0.333..., 2^10 = 1024, 10**9 = 1000000000.",
    "中文English混合123テスト한국어mixed",
    "(don't) [it's] \"they're\" 'we've' -I'm- _you'll_ *he'd*",
    "end.\n\n\nnext!\r\n\r\nmore?\n \n  \n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y<|fim_middle|>y = x * 2<|endoftext|>",
    "    indented\n\t\ttabbed\n        deeper    trailing   \n",
    "e\u0301 versus \u00e9, A\u030a versus \u00c5, \uff21\uff22\uff23 full-width, \u2460 circled, \ufb01 ligature",
]


def data_dir():
    return os.environ.get("FTUNE_DATA") or os.path.join(HERE, "..", "..", "shared", "data")


def gsm8k_docs():
    docs = []
    with open(os.path.join(data_dir(), "text", "gsm8k", "test.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                docs += [r["question"], r["answer"]]
    return docs


def gguf_tokenizer_facts(path):
    """What the file says: pre-tokenizer name, add_bos, token count, and the
    ids and texts of its control (3) and user-defined (4) tokens."""
    import gguf
    r = gguf.GGUFReader(path)

    def val(key, default=None):
        f = r.fields.get(key)
        return f.contents() if f is not None else default
    tokens = val("tokenizer.ggml.tokens")
    types = val("tokenizer.ggml.token_type")
    special = [(i, tokens[i]) for i, t in enumerate(types) if t in (3, 4)]
    return {"pre": val("tokenizer.ggml.pre"), "add_bos": bool(val("tokenizer.ggml.add_bos_token", False)),
            "n_tokens": len(tokens), "special": special}


def hf_reference(path, facts, notes):
    """The transformers-from-GGUF tokenizer's backend (a tokenizers.Tokenizer),
    corrected from the file where the converter drops what it says."""
    from tokenizers import AddedToken, Tokenizer, pre_tokenizers
    from transformers import AutoTokenizer
    from transformers.utils import logging
    logging.set_verbosity_error()  # its "legacy behaviour" notice on every llama tokenizer
    hf = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path))
    tok = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    if facts["pre"] == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        notes.append("pre-tokenizer 'smollm': Digits(individual) + ByteLevel set on the reference "
                     "(transformers' converter builds ByteLevel alone)")
    have = {t.content for t in tok.get_added_tokens_decoder().values()}
    missing = [s for _, s in facts["special"] if s not in have]
    if missing:
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in missing])
        notes.append(f"{len(missing)} control/user-defined tokens of the file added to the reference as special "
                     f"(transformers' converter made {len(have)})")
    return hf, tok


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def check_model(path, helper, work, docs):
    name = os.path.basename(path).split(".")[0].split("-")[0].lower()  # smollm2, qwen2
    facts = gguf_tokenizer_facts(path)
    notes = []
    hf, ref = hf_reference(path, facts, notes)
    for n in notes:
        print(f"  {name}: {n}")
    corpus = os.path.join(work, "corpus.json")
    with open(corpus, "w", encoding="utf-8") as f:
        json.dump(docs, f, ensure_ascii=False)
    out = os.path.join(work, name + ".ftune.json")
    r = subprocess.run([helper, "tokenize", path, corpus, out], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL real_tok_{name}: ftune could not tokenize: {r.stderr.strip()}")
        return False
    with open(out) as f:
        ft = json.load(f)
    ok = True
    n_tok = 0
    for parse_special, key in ((False, "ids"), (True, "ids_special")):
        ref.encode_special_tokens = not parse_special
        want = [e.ids for e in ref.encode_batch(docs, add_special_tokens=False)]
        n_tok += sum(len(w) for w in want)
        bad = [i for i in range(len(docs)) if want[i] != ft[key][i]]
        for i in bad[:3]:
            k = first_diff(want[i], ft[key][i])
            print(f"  {name} ({key}) doc {i} {docs[i][:40]!r}: first difference at token {k}:\n"
                  f"    tokenizers {want[i][max(0, k - 2):k + 4]} {[ref.id_to_token(x) for x in want[i][k:k + 3]]}\n"
                  f"    ftune      {ft[key][i][max(0, k - 2):k + 4]} {[ref.id_to_token(x) for x in ft[key][i][k:k + 3]]}")
        if bad:
            print(f"FAIL real_tok_{name}_{key}: {len(bad)} of {len(docs)} documents differ from tokenizers")
            ok = False
        else:
            print(f"PASS real_tok_{name}_{key} ({len(docs)} documents, {sum(len(w) for w in want)} tokens equal)")
    # decoding: ftune's bytes for its ids are tokenizers' decode of them, and
    # give the document back (as the normalizer leaves it)
    ref_dec = ref.decode_batch(ft["ids"], skip_special_tokens=False)
    got = [bytes.fromhex(h) for h in ft["decoded_hex"]]
    bad = [i for i in range(len(docs)) if got[i] != ref_dec[i].encode("utf-8")]
    for i in bad[:3]:
        print(f"  {name} decode doc {i}: tokenizers {ref_dec[i][:60]!r}\n    ftune      {got[i][:60]!r}")
    nfc = ref.normalizer is not None and "NFC" in ref.normalizer.__class__.__name__
    norm = [unicodedata.normalize("NFC", d) if nfc else d for d in docs]
    lost = [i for i in range(len(docs)) if got[i] != norm[i].encode("utf-8")]
    for i in lost[:3]:
        print(f"  {name} round trip doc {i}: text {norm[i][:60]!r}\n    ftune      {got[i][:60]!r}")
    if bad or lost:
        print(f"FAIL real_tok_{name}_decode: {len(bad)} of {len(docs)} documents decode differently from tokenizers, "
              f"{len(lost)} do not give their text back")
        ok = False
    else:
        changed = sum(n != d for n, d in zip(norm, docs))
        print(f"PASS real_tok_{name}_decode (all {len(docs)} documents decode as tokenizers does and give their "
              f"text back{f'; {changed} of them after NFC, the normalizer' if changed else ''})")
    # the vocabulary and the BOS default
    n_ref = ref.get_vocab_size(with_added_tokens=True)
    if not (ft["n_vocab"] == n_ref == facts["n_tokens"] == len(hf)):
        print(f"FAIL real_tok_{name}_vocab: ftune {ft['n_vocab']} ids, tokenizers {n_ref}, transformers {len(hf)}, "
              f"the file {facts['n_tokens']}")
        ok = False
    else:
        print(f"PASS real_tok_{name}_vocab ({n_ref} ids)")
    if bool(ft["add_bos"]) != facts["add_bos"]:
        print(f"FAIL real_tok_{name}_bos: ftune add_bos={ft['add_bos']}, the file's add_bos_token={facts['add_bos']}")
        ok = False
    else:
        print(f"PASS real_tok_{name}_bos (add_bos={int(facts['add_bos'])} as the file says)")
    print(f"  {name}: {len(docs)} documents, {n_tok} tokens in the two modes")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--helper", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    docs = CORPUS + EXTRA + gsm8k_docs()
    ok = True
    for m in a.models:
        ok &= check_model(m, a.helper, a.work, docs)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
