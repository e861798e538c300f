"""eco_tokenizers.py — ftune's tokenization against Hugging Face's `tokenizers`
library, on the varied corpus in eco_corpus.py. Run with .venv/bin/python
(scripts/setup.sh) by tests/cli_eco_tokenizers.sh.

  eco_tokenizers.py --helper build/tests/helper_eco --work DIR

Tokenizers compared (each as a tokenizer.json that both sides load):
  stories260K      $FTUNE_DATA/models/stories260K-hf/tokenizer.json (SentencePiece-style BPE,
                   byte fallback)
  gpt2-lib         GPT-2's vocab.json + merges.txt made into a tokenizer.json by the library
                   (ByteLevel pre-tokenizer with its built-in regex)
  gpt2-files       ftune reading vocab.json + merges.txt directly, against gpt2-lib
  gpt2-split       the fixture form make_fixture.py writes (explicit Split regex + ByteLevel)
  trained-bpe      a byte-level BPE trained here with the library, Llama 3's Split regex,
                   ignore_merges
  trained-spm      a SentencePiece-style BPE with byte fallback trained here with the library
For each document: ids without special tokens parsed (tokenizers'
encode_special_tokens=True) and with them (its default), and whether BOS is
added by default. Prints PASS/FAIL lines; exits 1 if any failed.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from eco_corpus import CORPUS  # noqa: E402

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, Regex  # noqa: E402
from tokenizers.models import BPE  # noqa: E402
from tokenizers.trainers import BpeTrainer  # noqa: E402

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def data_dir():
    return os.environ.get("FTUNE_DATA") or os.path.join(HERE, "..", "..", "shared", "data")


def training_text(ascii_only=False):
    """Shakespeare (a slice) plus the corpus, so the trained vocabularies have
    merges for the corpus's words. ascii_only keeps only the corpus's ASCII
    documents, so that every other character takes the byte-fallback path
    (tokenizers' limit_alphabet would do that too, but picks among equally
    frequent characters differently from run to run)."""
    with open(os.path.join(data_dir(), "text", "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
        text = f.read(200_000)
    return text.split("\n") + [d for d in CORPUS if not ascii_only or d.isascii()]


def build_gpt2_lib(out):
    g = os.path.join(data_dir(), "tokenizers", "gpt2")
    tok = Tokenizer(BPE.from_file(os.path.join(g, "vocab.json"), os.path.join(g, "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(out)


def build_gpt2_split(out_dir):
    import make_fixture  # the fixture's own tokenizer.json writer
    os.makedirs(out_dir, exist_ok=True)
    make_fixture.write_gpt2_tokenizer(out_dir, "split", "Qwen2Tokenizer")
    return os.path.join(out_dir, "tokenizer.json")


def build_trained_bpe(out):
    tok = Tokenizer(BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=1500, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    tok.save(out)


def build_trained_spm(out):
    """SentencePiece-style BPE the way Llama 2's tokenizer.json is laid out:
    <unk> <s> </s>, then the 256 byte tokens, then the learned pieces."""
    norm = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok = Tokenizer(BPE())
    tok.normalizer = norm
    trainer = BpeTrainer(vocab_size=900, show_progress=False)
    tok.train_from_iterator(training_text(ascii_only=True), trainer)
    learned = json.loads(tok.to_str())["model"]
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + ["<0x%02X>" % b for b in range(256)])}
    for piece, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    final = Tokenizer(BPE(vocab=vocab, merges=[tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                                               for m in learned["merges"]],
                          unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    final.normalizer = norm
    final.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                       decoders.Strip(" ", 1, 0)])
    final.add_special_tokens(specials)
    final.save(out)


def hf_ids(tok, special):
    tok.encode_special_tokens = not special
    return [tok.encode(d, add_special_tokens=False).ids for d in CORPUS]


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(name, hf_path, ftune_path, helper, work, expect_bos=None):
    """expect_bos: the BOS id the tokenizer's post-processor adds, or None."""
    corpus = os.path.join(work, "corpus.json")
    out = os.path.join(work, name + ".ftune.json")
    r = subprocess.run([helper, "tokenize", ftune_path, corpus, out], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL tokenizer_{name}: ftune could not tokenize: {r.stderr.strip()}")
        return False
    with open(out) as f:
        ft = json.load(f)
    tok = Tokenizer.from_file(hf_path)
    ok = True
    n_tok = 0
    for mode, key in ((False, "ids"), (True, "ids_special")):
        want = hf_ids(tok, mode)
        bad = [i for i in range(len(CORPUS)) if want[i] != ft[key][i]]
        n_tok += sum(len(w) for w in want)
        for i in bad[:3]:
            k = first_diff(want[i], ft[key][i])
            print(f"  {name} ({key}) doc {i} {CORPUS[i][:40]!r}: first difference at token {k}:\n"
                  f"    tokenizers {want[i][max(0, k - 2):k + 4]} {[tok.id_to_token(x) for x in want[i][k:k + 3]]}\n"
                  f"    ftune      {ft[key][i][max(0, k - 2):k + 4]} {[tok.id_to_token(x) for x in ft[key][i][k:k + 3]]}")
        if bad:
            print(f"FAIL tokenizer_{name}_{key}: {len(bad)} of {len(CORPUS)} documents differ")
            ok = False
        else:
            print(f"PASS tokenizer_{name}_{key}")
    # the default: what tokenizers' post-processor adds, ftune's add_bos
    tok.encode_special_tokens = False
    with_special = tok.encode("Hello", add_special_tokens=True).ids
    plain = tok.encode("Hello", add_special_tokens=False).ids
    hf_bos = with_special[0] if len(with_special) == len(plain) + 1 and with_special[1:] == plain else None
    ft_bos = ft["bos"] if ft["add_bos"] else None
    if with_special not in (plain, [hf_bos] + plain) or hf_bos != ft_bos or hf_bos != expect_bos:
        print(f"FAIL tokenizer_{name}_bos: tokenizers adds {with_special} to {plain}; "
              f"ftune add_bos={ft['add_bos']} bos={ft['bos']}; expected BOS {expect_bos}")
        ok = False
    else:
        print(f"PASS tokenizer_{name}_bos")
    print(f"  {name}: {len(CORPUS)} documents, {n_tok} tokens in the two modes")
    return ok


def tokenizer_path(work, name):
    """work/name/tokenizer.json (ftune finds a tokenizer.json by that name)"""
    os.makedirs(os.path.join(work, name), exist_ok=True)
    return os.path.join(work, name, "tokenizer.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--helper", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    w = a.work
    with open(os.path.join(w, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump(CORPUS, f, ensure_ascii=False)
    d = data_dir()
    ok = True
    stories = os.path.join(d, "models", "stories260K-hf", "tokenizer.json")
    ok &= compare("stories260K", stories, stories, a.helper, w, expect_bos=1)
    gpt2 = tokenizer_path(w, "gpt2-lib")
    build_gpt2_lib(gpt2)
    ok &= compare("gpt2_lib", gpt2, gpt2, a.helper, w)
    ok &= compare("gpt2_files", gpt2, os.path.join(d, "tokenizers", "gpt2"), a.helper, w)
    split = build_gpt2_split(os.path.join(w, "gpt2-split"))
    ok &= compare("gpt2_split", split, split, a.helper, w)
    bpe = tokenizer_path(w, "trained-bpe")
    build_trained_bpe(bpe)
    ok &= compare("trained_bpe", bpe, bpe, a.helper, w)
    spm = tokenizer_path(w, "trained-spm")
    build_trained_spm(spm)
    ok &= compare("trained_spm", spm, spm, a.helper, w)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
