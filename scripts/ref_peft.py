#!/usr/bin/python3
"""ref_peft.py — reference logits of a Hugging Face model with a PEFT LoRA
adapter applied as PEFT defines it (W + scaling * B @ A, scaling =
lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora), computed in
float64 with ref_llama, for the C adapter tests to compare with.

  ref_peft.py --model DIR --adapter DIR --tokens "1,2,3" --out FILE

FILE has ref_forward.py's layout: int32 n_seqs (1), int32 T, int32 V, T*V
float32 logits.
"""
import argparse
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_llama  # noqa: E402

PREFIX = "base_model.model."


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(2)
    model = ref_llama.load_model(a.model, torch.float64)
    with open(os.path.join(a.adapter, "adapter_config.json")) as f:
        cfg = json.load(f)
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scaling = alpha / (r ** 0.5) if cfg.get("use_rslora") else alpha / r
    tensors = ref_llama.load_safetensors(os.path.join(a.adapter, "adapter_model.safetensors"))
    n = 0
    for key, (A, _) in tensors.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[len(PREFIX):-len(".lora_A.weight")]
        B, _ = tensors[key.replace(".lora_A.", ".lora_B.")]
        W = model.params[module + ".weight"]
        W += scaling * (B.double() @ A.double())
        n += 1
    if n == 0:
        sys.exit("ref_peft: no lora_A/lora_B pairs")
    toks = [int(x) for x in a.tokens.split(",")]
    with torch.no_grad():
        logits = model.forward(torch.tensor([toks], dtype=torch.long))[0]
    with open(a.out + ".tmp", "wb") as f:
        f.write(struct.pack("<iii", 1, len(toks), logits.shape[1]))
        f.write(logits.to(torch.float32).contiguous().numpy().astype("<f4").tobytes())
    os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
