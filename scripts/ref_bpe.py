#!/usr/bin/python3
"""ref_bpe.py — a plain-Python reference for byte-level BPE tokenization
(GPT-2 style) read from a Hugging Face tokenizer.json, written from the
algorithm: split special tokens out, pre-tokenize with the GPT-2 pattern, map
bytes to GPT-2's printable characters, then merge pairs by rank.

  ref_bpe.py --tokenizer DIR/tokenizer.json --text "Hello world"   prints the ids
  ref_bpe.py --tokenizer DIR/tokenizer.json --check-vectors INP    checks INP/.out test
                                                                   vectors (llama.cpp's format)
The pattern is matched by a hand-written scanner equal to
  's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
because Python's re has no \\p{..} classes.
"""
import argparse
import json
import sys
import unicodedata


def bytes_to_unicode():
    """GPT-2's reversible map from the 256 byte values to printable characters:
    printable Latin-1 bytes map to themselves, the rest to U+0100 onwards."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _is_letter(c):
    return unicodedata.category(c).startswith("L")


def _is_number(c):
    return unicodedata.category(c).startswith("N")


def _is_space(c):
    return c.isspace()


def _is_other(c):
    return not (_is_space(c) or _is_letter(c) or _is_number(c))


def pretokenize_gpt2(text):
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        suf = next((s for s in ("re", "ve", "ll", "s", "t", "m", "d")
                    if c == "'" and text.startswith(s, i + 1)), None)
        if suf is not None:
            out.append(text[i:i + 1 + len(suf)])
            i += 1 + len(suf)
            continue
        matched = False
        for cls in (_is_letter, _is_number, _is_other):   # " ?X+"; a space is never X
            j = i + 1 if c == " " and i + 1 < n and cls(text[i + 1]) else i
            if cls(text[j]):
                k = j
                while k < n and cls(text[k]):
                    k += 1
                out.append(text[i:k])
                i = k
                matched = True
                break
        if matched:
            continue
        # whitespace: all of it at the end of the text, else all but the last
        # character (which then starts the next piece), else the single character
        k = i
        while k < n and _is_space(text[k]):
            k += 1
        if k == n or k - i == 1:
            out.append(text[i:k])
            i = k
        else:
            out.append(text[i:k - 1])
            i = k - 1
    return out


class ByteLevelBPE:
    def __init__(self, tokenizer_json):
        with open(tokenizer_json, encoding="utf-8") as f:
            tj = json.load(f)
        model = tj["model"]
        if model.get("type") != "BPE":
            raise ValueError(f"{tokenizer_json}: model type {model.get('type')} is not BPE")
        self.vocab = model["vocab"]
        self.ranks = {}
        for r, m in enumerate(model["merges"]):
            a, b = m.split(" ") if isinstance(m, str) else m
            self.ranks[(a, b)] = r
        self.special = {t["content"]: t["id"] for t in tj.get("added_tokens", [])}
        self.b2u = bytes_to_unicode()

    def _bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            best = min(range(len(parts) - 1),
                       key=lambda i: self.ranks.get((parts[i], parts[i + 1]), float("inf")))
            if (parts[best], parts[best + 1]) not in self.ranks:
                break
            pair = (parts[best], parts[best + 1])
            merged, i = [], 0
            while i < len(parts):   # merge every occurrence of the best pair, left to right
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == pair:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return [self.vocab[p] for p in parts]

    def encode(self, text, parse_special=True):
        ids, rest = [], text
        while rest:
            cut, tok = len(rest), None
            if parse_special:
                for s in self.special:
                    k = rest.find(s)
                    if k != -1 and k < cut:
                        cut, tok = k, s
            for piece in pretokenize_gpt2(rest[:cut]):
                ids += self._bpe("".join(self.b2u[b] for b in piece.encode("utf-8")))
            if tok is None:
                break
            ids.append(self.special[tok])
            rest = rest[cut + len(tok):]
        return ids


def check_vectors(tok, inp):
    with open(inp, encoding="utf-8") as f:
        cases = f.read().split("\n__ggml_vocab_test__\n")
    if cases and cases[-1] == "":
        cases.pop()
    with open(inp[:-4] + ".out" if inp.endswith(".inp") else inp + ".out", encoding="utf-8") as f:
        want = [line.split() for line in f.read().split("\n")]
    bad = 0
    for i, text in enumerate(cases):
        got = [str(x) for x in tok.encode(text, parse_special=False)]
        if got != want[i]:
            bad += 1
            print(f"case {i} {text!r}: got {' '.join(got)}, want {' '.join(want[i])}")
    print(f"{len(cases) - bad}/{len(cases)} test vectors match")
    return bad == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json")
    ap.add_argument("--text")
    ap.add_argument("--check-vectors", help="a .inp file with its .out beside it")
    a = ap.parse_args()
    tok = ByteLevelBPE(a.tokenizer)
    if a.text is not None:
        print(" ".join(str(x) for x in tok.encode(a.text)))
    if a.check_vectors:
        return 0 if check_vectors(tok, a.check_vectors) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
