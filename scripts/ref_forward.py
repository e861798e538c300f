#!/usr/bin/python3
"""ref_forward.py — reference logits (and losses) of a Hugging Face model
directory for given token sequences, for the C engine's tests to compare with.

  ref_forward.py --model DIR --tokens "1,2,3;1,400,7,9" --out FILE [--dtype float64|float32] [--loss]

FILE (little-endian): int32 n_seqs, then per sequence int32 T, int32 V and
T*V float32 logits (row t = the prediction after tokens[0..t]). Computed in
--dtype (float64 by default) and rounded to float32 on writing.
--loss prints JSON: the mean next-token cross-entropy of each sequence
(null for a sequence of one token) and the token-weighted mean over all.
"""
import argparse
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_llama  # noqa: E402


def parse_tokens(text):
    seqs = []
    for part in text.replace("\n", ";").split(";"):
        part = part.strip()
        if not part:
            continue
        seqs.append([int(x) for x in part.replace(",", " ").split()])
    return seqs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model directory")
    ap.add_argument("--tokens", help='sequences: "1,2,3;1,400,7,9"')
    ap.add_argument("--tokens-file", help="one sequence per line (ids separated by commas or spaces)")
    ap.add_argument("--out", help="binary logits file to write")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--loss", action="store_true", help="print per-sequence mean cross-entropy as JSON")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if not a.out and not a.loss:
        ap.error("nothing to do: give --out and/or --loss")
    torch.set_num_threads(a.threads)

    text = a.tokens or ""
    if a.tokens_file:
        with open(a.tokens_file) as f:
            text += ";" + f.read()
    try:
        seqs = parse_tokens(text)
    except ValueError as e:
        ap.error(f"bad token list: {e}")
    if not seqs:
        ap.error("no token sequences given")

    try:
        model = ref_llama.load_model(a.model, getattr(torch, a.dtype))
    except (ref_llama.FormatError, OSError, KeyError, ValueError) as e:
        sys.exit(f"ref_forward: {e}")
    V = model.cfg.V

    losses, counts, blobs = [], [], [struct.pack("<i", len(seqs))]
    with torch.no_grad():
        for s in seqs:
            try:
                logits = model.forward(torch.tensor([s], dtype=torch.long))[0]   # (T, V)
            except ValueError as e:
                sys.exit(f"ref_forward: sequence {s[:8]}...: {e}")
            if len(s) >= 2:
                ce = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(s[1:]))
                losses.append(float(ce))
                counts.append(len(s) - 1)
            else:
                losses.append(None)
                counts.append(0)
            if a.out:
                blobs.append(struct.pack("<ii", len(s), V))
                blobs.append(logits.to(torch.float32).contiguous().numpy().astype("<f4").tobytes())

    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "wb") as f:
            for b in blobs:
                f.write(b)
        os.replace(tmp, a.out)
    if a.loss:
        n = sum(counts)
        mean = sum(l * c for l, c in zip(losses, counts) if l is not None) / n if n else None
        print(json.dumps({"loss": losses, "n_predicted": counts, "mean_loss": mean, "dtype": a.dtype}))


if __name__ == "__main__":
    main()
