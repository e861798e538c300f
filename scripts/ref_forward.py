#!/usr/bin/python3
"""ref_forward.py — reference logits (and losses) of a Hugging Face model
directory for given token sequences, for the C engine's tests to compare with.

  ref_forward.py --model DIR --tokens "1,2,3;1,400,7,9" --out FILE [--dtype float64|float32] [--loss]
                 [--quantize q8_0|q4_0 [--quantize-output q8_0|q4_0]]

FILE (little-endian): int32 n_seqs, then per sequence int32 T, int32 V and
T*V float32 logits (row t = the prediction after tokens[0..t]). Computed in
--dtype (float64 by default) and rounded to float32 on writing.
--loss prints JSON: the mean next-token cross-entropy of each sequence
(null for a sequence of one token) and the token-weighted mean over all.
--quantize first rounds every matrix whose rows are whole 32-element blocks
as ggml's reference quantizer (quantize_row_q8_0_ref / q4_0_ref) would, and
then runs on the rounded values: the output matrix (lm_head, or the tied
embedding) in --quantize-output (default: the same type), the rest in
--quantize; norms and other matrices stay as they are.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
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


def _f16(x):
    """f32 -> f16 (round to nearest even) -> f32, as a block scale is stored."""
    return x.astype(np.float16).astype(np.float32)


def round_q8_0(w):
    """ggml's quantize_row_q8_0_ref then dequantize_row_q8_0, in its float32
    arithmetic: d = amax/127, q = roundf(x * (1/d)), x' = q * f16(d)."""
    b = w.reshape(-1, 32).astype(np.float32)
    d = (np.abs(b).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * idv).astype(np.float64)                 # the f32 product, exactly
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)       # roundf: half away from zero
    return (q.astype(np.float32) * _f16(d)).reshape(w.shape)


def round_q4_0(w):
    """ggml's quantize_row_q4_0_ref then dequantize_row_q4_0: d = max/-8 with
    max the signed value of largest magnitude (the first), q =
    min(15, (int)(x * (1/d) + 8.5)), x' = (q - 8) * f16(d)."""
    b = w.reshape(-1, 32).astype(np.float32)
    mx = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * idv).astype(np.float32) + np.float32(8.5)   # two f32 roundings, as the C
    q = np.minimum(15, np.floor(v))                      # (int) of a value >= 0
    return ((q - 8).astype(np.float32) * _f16(d)).reshape(w.shape)


ROUND = {"q8_0": round_q8_0, "q4_0": round_q4_0}


def quantize_model(model, qtype, out_qtype):
    """Replaces the weights by their rounding (see --quantize)."""
    p = model.params
    out_name = "lm_head.weight" if "lm_head.weight" in p else "model.embed_tokens.weight"
    for name, t in p.items():
        if t.dim() != 2 or t.shape[1] % 32:
            continue
        f = ROUND[out_qtype if name == out_name else qtype]
        # the stored values are f32 (a quantizer reads the f32 weights)
        r = f(t.detach().to(torch.float32).numpy())
        p[name] = torch.from_numpy(r).to(t.dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model directory")
    ap.add_argument("--tokens", help='sequences: "1,2,3;1,400,7,9"')
    ap.add_argument("--tokens-file", help="one sequence per line (ids separated by commas or spaces)")
    ap.add_argument("--out", help="binary logits file to write")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--loss", action="store_true", help="print per-sequence mean cross-entropy as JSON")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quantize", choices=sorted(ROUND), help="round the matrices first (see above)")
    ap.add_argument("--quantize-output", choices=sorted(ROUND), help="the output matrix's type (default --quantize)")
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
    if a.quantize:
        quantize_model(model, a.quantize, a.quantize_output or a.quantize)
    elif a.quantize_output:
        ap.error("--quantize-output needs --quantize")
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
