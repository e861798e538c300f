"""eco_tokenizers.py — ftune's tokenization against Hugging Face's `tokenizers`
library, on the varied corpus in eco_corpus.py. Run with .venv/bin/python
(scripts/setup.sh) by tests/cli_eco_tokenizers.sh.

  eco_tokenizers.py --helper build/tests/helper_eco --work DIR

Tokenizers compared (the reference is tokenizers on a tokenizer.json; ftune
reads that file, or the original it was made from):
  stories260K      $FTUNE_DATA/models/stories260K-hf/tokenizer.json (SentencePiece-style BPE,
                   byte fallback)
  gpt2_lib         GPT-2's vocab.json + merges.txt made into a tokenizer.json by the library
                   (ByteLevel pre-tokenizer with its built-in regex)
  gpt2_files       ftune reading vocab.json + merges.txt directly, against gpt2_lib
  gpt2_nfc         gpt2_lib with tokenizers' NFC normalizer (as Qwen2's tokenizer.json)
  gpt2_split       the fixture form make_fixture.py writes (explicit Split regex + ByteLevel)
  trained_bpe      a byte-level BPE trained here with the library (Llama 3's Split regex,
                   ignore_merges as Llama 3's file sets it)
  trained_spm      a SentencePiece-style BPE with byte fallback trained here with the library
  llama2_*         Llama 2's tokenizer.model converted by transformers (with and without the
                   Prepend normalizer); ftune reads the tokenizer.json and the tokenizer.model
  llama3_*         Llama 3's tiktoken file converted by transformers' TikTokenConverter; ftune
                   reads the tokenizer.json and the tiktoken file, which is also compared
                   with tiktoken itself
For each document: ids without special tokens parsed (tokenizers'
encode_special_tokens=True) and with them (its default), the bytes the ids
decode to, and whether BOS is added by default. Also ftune's NFC (helper_eco nfc) against
Python's unicodedata.normalize on every code point that decomposes or combines, alone and
followed by marks, and on random sequences of bases, marks and Hangul jamo.
Prints PASS/FAIL lines; exits 1 if any failed.
"""
import argparse
import base64
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from eco_corpus import CORPUS  # noqa: E402

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, Regex  # noqa: E402
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


def build_gpt2_nfc(out):
    build_gpt2_lib(out)
    tok = Tokenizer.from_file(out)
    tok.normalizer = normalizers.NFC()
    tok.save(out)


def check_nfc(helper, work):
    """ftune's NFC against unicodedata's (the same Unicode version as the
    tables scripts/gen_unicode_nfc.py made, if run by the same Python)."""
    import random
    import unicodedata as ud
    cps = [c for c in range(0x30000) if not 0xD800 <= c < 0xE000 and (ud.decomposition(chr(c)) or ud.combining(chr(c)))]
    docs = []
    for c in cps:
        docs += [chr(c), chr(c) + "\u0301", "a" + chr(c) + "\u0323\u0301"]
    rnd = random.Random(1)
    bases = [c for c in cps if not ud.combining(chr(c))] + [ord(x) for x in "aeiouAEIOUnNcCsSzZ"] + \
        list(range(0x1100, 0x1113)) + list(range(0xAC00, 0xAC40))
    marks = [c for c in cps if ud.combining(chr(c))] + list(range(0x1161, 0x1176)) + list(range(0x11A8, 0x11C3))
    for _ in range(20000):
        docs.append("".join(chr(rnd.choice(bases) if rnd.random() < 0.4 else rnd.choice(marks))
                            for _ in range(rnd.randint(1, 8))))
    src, out = os.path.join(work, "nfc.json"), os.path.join(work, "nfc.out.json")
    with open(src, "w", encoding="utf-8") as f:
        json.dump(docs, f, ensure_ascii=False)
    r = subprocess.run([helper, "nfc", src, out], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL nfc: {r.stderr.strip()}")
        return False
    got = json.load(open(out))
    bad = [i for i, d in enumerate(docs) if bytes.fromhex(got[i]) != ud.normalize("NFC", d).encode("utf-8")]
    for i in bad[:3]:
        print(f"  nfc {[hex(ord(c)) for c in docs[i]]}: unicodedata "
              f"{[hex(ord(c)) for c in ud.normalize('NFC', docs[i])]}, ftune {bytes.fromhex(got[i])!r}")
    if bad:
        print(f"FAIL nfc: {len(bad)} of {len(docs)} strings differ from unicodedata's NFC (Unicode {ud.unidata_version})")
        return False
    print(f"PASS nfc ({len(docs)} strings equal to unicodedata's NFC, Unicode {ud.unidata_version})")
    return True


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
    <unk> <s> </s>, then the 256 byte tokens, then the learned pieces; <s>
    (BOS) added by the post-processor."""
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
    final.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
                                                         special_tokens=[("<s>", 1)])
    final.save(out)


class HF:
    """tokenizers' Tokenizer on a tokenizer.json: the reference."""
    label = "tokenizers"

    def __init__(self, path):
        self.tok = Tokenizer.from_file(path)

    def encode(self, doc, special):
        self.tok.encode_special_tokens = not special
        return self.tok.encode(doc, add_special_tokens=False).ids

    def bos(self):
        """the id the post-processor puts before a text, or None"""
        self.tok.encode_special_tokens = False
        with_special = self.tok.encode("Hello", add_special_tokens=True).ids
        plain = self.tok.encode("Hello", add_special_tokens=False).ids
        if with_special == plain:
            return None
        if with_special[1:] == plain:
            return with_special[0]
        return f"something else: {with_special} for {plain}"

    def piece(self, i):
        return self.tok.id_to_token(i)

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False).encode("utf-8")


class TikToken:
    """tiktoken's Encoding on Llama 3's ranks and special tokens (Meta's own
    tokenizer is this), as a second reference for the tiktoken file."""
    label = "tiktoken"

    def __init__(self, ranks, pattern, specials):
        import tiktoken
        self.enc = tiktoken.Encoding("llama3", pat_str=pattern, mergeable_ranks=ranks,
                                     special_tokens={t: len(ranks) + i for i, t in enumerate(specials)})
        self.bos_id = len(ranks)  # <|begin_of_text|>: Meta's tokenizer adds it (bos=True)

    def encode(self, doc, special):
        if special:
            return self.enc.encode(doc, allowed_special="all")
        return self.enc.encode(doc, disallowed_special=())

    def bos(self):
        return self.bos_id

    def piece(self, i):
        return self.enc.decode_single_token_bytes(i)

    def decode(self, ids):
        return self.enc.decode_bytes(ids)


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(name, ref, ftune_path, helper, work, expect_bos=None):
    """ftune on ftune_path against ref (HF or TikToken); expect_bos: the BOS
    id ref adds by default (its post-processor), or None."""
    corpus = os.path.join(work, "corpus.json")
    out = os.path.join(work, name + ".ftune.json")
    r = subprocess.run([helper, "tokenize", ftune_path, corpus, out], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL tokenizer_{name}: ftune could not tokenize: {r.stderr.strip()}")
        return False
    with open(out) as f:
        ft = json.load(f)
    ok = True
    n_tok = 0
    for mode, key in ((False, "ids"), (True, "ids_special")):
        want = [ref.encode(d, mode) for d in CORPUS]
        bad = [i for i in range(len(CORPUS)) if want[i] != ft[key][i]]
        n_tok += sum(len(w) for w in want)
        for i in bad[:3]:
            k = first_diff(want[i], ft[key][i])
            print(f"  {name} ({key}) doc {i} {CORPUS[i][:40]!r}: first difference at token {k}:\n"
                  f"    {ref.label:10} {want[i][max(0, k - 2):k + 4]} {[ref.piece(x) for x in want[i][k:k + 3]]}\n"
                  f"    ftune      {ft[key][i][max(0, k - 2):k + 4]} {[ref.piece(x) for x in ft[key][i][k:k + 3]]}")
        if bad:
            print(f"FAIL tokenizer_{name}_{key}: {len(bad)} of {len(CORPUS)} documents differ from {ref.label}")
            ok = False
        else:
            print(f"PASS tokenizer_{name}_{key}")
    # decoding: ftune's pieces of the ids, concatenated, are the reference's decode
    bad = [i for i in range(len(CORPUS)) if bytes.fromhex(ft["decoded_hex"][i]) != ref.decode(ft["ids"][i])]
    for i in bad[:3]:
        print(f"  {name} decode doc {i}: {ref.label} {ref.decode(ft['ids'][i])[:60]!r}\n"
              f"    ftune      {bytes.fromhex(ft['decoded_hex'][i])[:60]!r}")
    if bad:
        print(f"FAIL tokenizer_{name}_decode: {len(bad)} of {len(CORPUS)} documents decode differently")
        ok = False
    else:
        n_round = sum(bytes.fromhex(h) == d.encode("utf-8") for h, d in zip(ft["decoded_hex"], CORPUS))
        print(f"PASS tokenizer_{name}_decode ({n_round} of {len(CORPUS)} documents decode to their text)")
    # the default: what the reference adds before a text, ftune's add_bos
    ref_bos = ref.bos()
    ft_bos = ft["bos"] if ft["add_bos"] else None
    if ref_bos != ft_bos or ref_bos != expect_bos:
        print(f"FAIL tokenizer_{name}_bos: {ref.label} adds BOS {ref_bos}, ftune {ft_bos} "
              f"(add_bos={ft['add_bos']} bos={ft['bos']}); expected {expect_bos}")
        ok = False
    else:
        print(f"PASS tokenizer_{name}_bos")
    print(f"  {name}: {len(CORPUS)} documents, {n_tok} tokens in the two modes")
    return ok


def build_llama2(out_dir, add_prefix_space):
    """Llama 2's SentencePiece tokenizer.model made into a Hugging Face
    tokenizer directory by transformers (LlamaTokenizerFast from the slow one,
    legacy mode as the Hub's Llama 2 files). add_prefix_space=False gives the
    variant without the Prepend("▁") normalizer."""
    from transformers import LlamaTokenizerFast
    model = os.path.join(data_dir(), "tokenizers", "llama2", "tokenizer.model")
    fast = LlamaTokenizerFast(vocab_file=model, legacy=True, from_slow=True, add_prefix_space=add_prefix_space)
    fast.save_pretrained(out_dir)
    return os.path.join(out_dir, "tokenizer.json")


def llama3_parts():
    """Llama 3's tiktoken file as ranks (the format: base64 token, rank per
    line, as tiktoken.load reads it), its split pattern and special tokens."""
    d = os.path.join(data_dir(), "tokenizers", "llama3")
    with open(os.path.join(d, "tokenizer.model"), "rb") as f:
        ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in f.read().splitlines() if line)}
    with open(os.path.join(d, "test_vectors.json")) as f:
        v = json.load(f)
    named = [t for t in v["special_tokens"] if t != "reserved"]  # in id order from 128000
    specials = named + ["<|reserved_special_token_%d|>" % (2 + i) for i in range(256 - len(named))]
    return ranks, v["pat_str"], specials


def build_llama3(out_dir, ranks, pattern, specials):
    """The tiktoken file made into a tokenizer.json by transformers'
    TikTokenConverter, with the BOS template of the Hub's Llama 3 files."""
    import tiktoken.load
    from transformers.convert_slow_tokenizer import TikTokenConverter
    # tiktoken 0.8 reads even a local file through blobfile (not installed);
    # the converter only needs the ranks, which llama3_parts read
    tiktoken.load.load_tiktoken_bpe = lambda path, expected_hash=None: ranks
    model = os.path.join(data_dir(), "tokenizers", "llama3", "tokenizer.model")
    tok = TikTokenConverter(vocab_file=model, pattern=pattern, additional_special_tokens=specials).converted()
    bos = specials[0]
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                      special_tokens=[(bos, len(ranks))])])
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    return path


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
    helper = a.helper
    stories = os.path.join(d, "models", "stories260K-hf", "tokenizer.json")
    ok &= compare("stories260K", HF(stories), stories, helper, w, expect_bos=1)
    gpt2 = tokenizer_path(w, "gpt2-lib")
    build_gpt2_lib(gpt2)
    ok &= compare("gpt2_lib", HF(gpt2), gpt2, helper, w)
    ok &= compare("gpt2_files", HF(gpt2), os.path.join(d, "tokenizers", "gpt2"), helper, w)
    gpt2_nfc = tokenizer_path(w, "gpt2-nfc")
    build_gpt2_nfc(gpt2_nfc)
    ok &= compare("gpt2_nfc", HF(gpt2_nfc), gpt2_nfc, helper, w)
    ok &= check_nfc(helper, w)
    split = build_gpt2_split(os.path.join(w, "gpt2-split"))
    ok &= compare("gpt2_split", HF(split), split, helper, w)
    bpe = tokenizer_path(w, "trained-bpe")
    build_trained_bpe(bpe)
    ok &= compare("trained_bpe", HF(bpe), bpe, helper, w)
    spm = tokenizer_path(w, "trained-spm")
    build_trained_spm(spm)
    ok &= compare("trained_spm", HF(spm), spm, helper, w, expect_bos=1)
    llama2 = build_llama2(os.path.join(w, "llama2"), True)
    ok &= compare("llama2_json", HF(llama2), os.path.dirname(llama2), helper, w, expect_bos=1)
    ok &= compare("llama2_model", HF(llama2), os.path.join(d, "tokenizers", "llama2", "tokenizer.model"),
                  helper, w, expect_bos=1)
    llama2_np = build_llama2(os.path.join(w, "llama2-noprefix"), False)
    ok &= compare("llama2_noprefix_json", HF(llama2_np), os.path.dirname(llama2_np), helper, w, expect_bos=1)
    ranks, pattern, specials = llama3_parts()
    llama3 = build_llama3(os.path.join(w, "llama3"), ranks, pattern, specials)
    llama3_model = os.path.join(d, "tokenizers", "llama3", "tokenizer.model")
    ok &= compare("llama3_json", HF(llama3), os.path.dirname(llama3), helper, w, expect_bos=len(ranks))
    ok &= compare("llama3_model", HF(llama3), llama3_model, helper, w, expect_bos=len(ranks))
    ok &= compare("llama3_model_tiktoken", TikToken(ranks, pattern, specials), llama3_model, helper, w,
                  expect_bos=len(ranks))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
