"""bnb_write.py — writes a Hugging Face `*-bnb-4bit` checkpoint as
transformers saves one (FORMATS.md §4.2: each Linear of the decoder layers
as packed U8 "weight" with "weight.absmax" (U8, double-quantized),
"weight.quant_map", "weight.nested_absmax", "weight.nested_quant_map" and
"weight.quant_state.bitsandbytes__nf4" (JSON bytes); embedding, norms and
LM head as they were; "quantization_config" in config.json), built with
nf4_ref.py's implementation of bitsandbytes' algorithm, because
transformers + bitsandbytes cannot quantize on this CPU with torch 1.13.
Also writes the same model with those Linears dequantized to f32 (the
reference). For test_bnb.

usage: bnb_write.py SRC_HF_DIR OUT_BNB_DIR OUT_F32_DIR [--break WHAT]
WHAT (one Linear only, to test the errors): fp4, blocksize, no_nested_absmax, shape, nested_blocksize
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nf4_ref  # noqa: E402

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def main():
    src, out_bnb, out_f32 = sys.argv[1:4]
    brk = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--break" else None
    w = load_file(os.path.join(src, "model.safetensors"))
    bnb, f32 = {}, {}
    broken = False
    for name, t in w.items():
        if not (name.endswith(".weight") and any("." + l + "." in name for l in LINEARS)):
            bnb[name] = t.contiguous()
            f32[name] = t.float().contiguous()
            continue
        packed, absmax, qa, absmax2, offset, deq = nf4_ref.quantize(t.float().reshape(-1).contiguous())
        state = {"quant_type": "nf4", "blocksize": 64, "dtype": str(t.dtype).replace("torch.", ""),
                 "shape": list(t.shape), "nested_blocksize": 256, "nested_dtype": "float32",
                 "nested_offset": offset.item()}
        key = "quant_state.bitsandbytes__nf4"
        parts = {"": packed.view(-1, 1), ".absmax": qa, ".quant_map": nf4_ref.NF4.clone(),
                 ".nested_absmax": absmax2, ".nested_quant_map": nf4_ref.create_dynamic_map()}
        this = False
        if brk and not broken and "layers.1.self_attn.k_proj" in name:
            broken = this = True
            if brk == "fp4":
                state["quant_type"] = "fp4"
                key = "quant_state.bitsandbytes__fp4"
            elif brk == "blocksize":
                state["blocksize"] = 128
            elif brk == "no_nested_absmax":
                del parts[".nested_absmax"]
            elif brk == "shape":
                state["shape"] = [t.shape[0], t.shape[1] + 1]
            elif brk == "nested_blocksize":
                state["nested_blocksize"] = 128
            elif brk not in ("trailing", "leading_zero"):
                sys.exit(f"bnb_write.py: unknown --break {brk}")
        text = json.dumps(state)
        if this and brk == "trailing":
            text += "x"                                   # bytes after the JSON object
        elif this and brk == "leading_zero":
            text = text.replace('"blocksize": 64', '"blocksize": 064')  # not JSON (a leading zero)
        parts["." + key] = torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)
        for sfx, p in parts.items():
            bnb[name + sfx] = p.contiguous()
        f32[name] = deq.view(t.shape).contiguous()
    for d, tensors in ((out_bnb, bnb), (out_f32, f32)):
        os.makedirs(d, exist_ok=True)
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(src, f)):
                shutil.copy(os.path.join(src, f), d)
    cfg = json.load(open(os.path.join(src, "config.json")))
    json.dump(cfg, open(os.path.join(out_f32, "config.json"), "w"), indent=2)
    cfg["quantization_config"] = {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
        "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16",
        "bnb_4bit_quant_storage": "uint8", "llm_int8_skip_modules": None, "llm_int8_threshold": 6.0,
        "llm_int8_has_fp16_weight": False, "llm_int8_enable_fp32_cpu_offload": False,
    }
    json.dump(cfg, open(os.path.join(out_bnb, "config.json"), "w"), indent=2)


if __name__ == "__main__":
    main()
