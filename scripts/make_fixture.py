#!/usr/bin/python3
"""make_fixture.py — writes small Hugging Face-layout model directories for tests
and benchmarks, deterministically from a seed.

  make_fixture.py --kind qwen2        --out DIR [--seed S]  random Qwen2 shape: GQA, q/k/v biases,
                                                            untied lm_head, BF16, 2 shards + index
  make_fixture.py --kind llama3       --out DIR [--seed S]  random Llama 3 shape: llama3 rope_scaling,
                                                            tied embeddings, F16, one file
  make_fixture.py --kind stories-bf16 --out DIR             $FTUNE_DATA/models/stories260K-hf in BF16

The random kinds get a byte-level BPE tokenizer.json built from GPT-2's
vocab.json + merges.txt ($FTUNE_DATA/tokenizers/gpt2), so vocab_size = 50257.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_llama  # noqa: E402

# The GPT-2 pre-tokenization regex, as Hugging Face writes it in tokenizer.json
# files that spell it out (Split pre-tokenizer).
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

SHAPE = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def data_dir():
    return os.environ.get("FTUNE_DATA") or os.path.join(HERE, "..", "..", "shared", "data")


def write_text(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------
# Tokenizer (GPT-2 byte-level BPE in tokenizer.json form)

def gpt2_tokenizer_json(pretok):
    tdir = os.path.join(data_dir(), "tokenizers", "gpt2")
    with open(os.path.join(tdir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    vocab = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    if list(vocab.values()) != list(range(len(vocab))) or vocab.get("<|endoftext|>") != 50256:
        sys.exit(f"make_fixture: {tdir}/vocab.json is not GPT-2's 50257-token vocabulary")
    merges = []
    with open(os.path.join(tdir, "merges.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#version"):
                continue
            if len(line.split(" ")) != 2:
                sys.exit(f"make_fixture: {tdir}/merges.txt: bad line {line!r}")
            merges.append(line)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if pretok == "split":  # the explicit form Qwen2 and Llama 3 files use
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": GPT2_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    else:                  # the form GPT-2's own tokenizer.json uses: the regex is implied
        pre = byte_level
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": pre,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": merges},
    }


def write_gpt2_tokenizer(out, pretok, tokenizer_class):
    write_json(os.path.join(out, "tokenizer.json"), gpt2_tokenizer_json(pretok))
    write_json(os.path.join(out, "tokenizer_config.json"), {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {"50256": {"content": "<|endoftext|>", "lstrip": False, "normalized": False,
                                           "rstrip": False, "single_word": False, "special": True}},
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 256,
        "tokenizer_class": tokenizer_class,
    })
    write_json(os.path.join(out, "generation_config.json"), {"bos_token_id": 50256, "eos_token_id": 50256})


# --------------------------------------------------------------------------
# Random weights

def random_params(cfg, rng):
    """{name: float32 array} in HF names: matrices N(0, 0.02), norm weights
    1 + 0.1 N(0, 1), biases N(0, 0.1). Drawn in expected_weight_names order."""
    shapes = ref_llama.expected_shapes(cfg)
    out = {}
    for name in ref_llama.expected_weight_names(cfg):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.1 * rng.standard_normal(shape)
        else:
            a = 0.02 * rng.standard_normal(shape)
        out[name] = a.astype(np.float32)
    return out


def entries(params, names, dtype):
    res = []
    for n in names:
        data, shape = ref_llama.tensor_bytes(params[n], dtype)
        res.append((n, dtype, shape, data))
    return res


def make_qwen2(out, seed, pretok):
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **SHAPE,
        "vocab_size": 50257,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 2,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }
    cfg = ref_llama.Config(config)
    params = random_params(cfg, np.random.default_rng(seed))
    names = ref_llama.expected_weight_names(cfg)
    # shard 1: embedding + layer 0; shard 2: the rest (layer 1, final norm, lm_head)
    first = [n for n in names if n == "model.embed_tokens.weight" or n.startswith("model.layers.0.")]
    second = [n for n in names if n not in first]
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map, total = {}, 0
    for fname, group in zip(files, (first, second)):
        total += ref_llama.write_safetensors(os.path.join(out, fname), entries(params, group, "BF16"),
                                             {"format": "pt"})
        for n in group:
            weight_map[n] = fname
    write_json(os.path.join(out, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    write_json(os.path.join(out, "config.json"), config)
    write_gpt2_tokenizer(out, pretok, "Qwen2Tokenizer")


def make_llama3(out, seed, pretok):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **SHAPE,
        "vocab_size": 50257,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        # With head_dim 16 and theta 5e5 the pair wavelengths are 6.3, 32, 167, ...:
        # below 64/4 (kept), between 64/4 and 64/1 (interpolated), above (slowed 8x).
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
        "torch_dtype": "float16",
        "use_cache": True,
    }
    cfg = ref_llama.Config(config)
    params = random_params(cfg, np.random.default_rng(seed))
    names = ref_llama.expected_weight_names(cfg)
    ref_llama.write_safetensors(os.path.join(out, "model.safetensors"), entries(params, names, "F16"),
                                {"format": "pt"})
    write_json(os.path.join(out, "config.json"), config)
    write_gpt2_tokenizer(out, pretok, "PreTrainedTokenizerFast")


def make_stories_bf16(out):
    src = os.path.join(data_dir(), "models", "stories260K-hf")
    raw = ref_llama.load_safetensors(os.path.join(src, "model.safetensors"))
    ents = []
    for name in sorted(raw):
        t, _ = raw[name]
        data, shape = ref_llama.tensor_bytes(t, "BF16")
        ents.append((name, "BF16", shape, data))
    ref_llama.write_safetensors(os.path.join(out, "model.safetensors"), ents, {"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["torch_dtype"] = "bfloat16"
    write_json(os.path.join(out, "config.json"), config)
    for fname in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(os.path.join(src, fname), os.path.join(out, fname))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", required=True, choices=["qwen2", "llama3", "stories-bf16"])
    ap.add_argument("--out", required=True, help="directory to write (created if missing)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--pretok", choices=["bytelevel", "split"], default="bytelevel",
                    help="tokenizer.json pre_tokenizer: ByteLevel with its implied GPT-2 regex (as GPT-2's "
                         "file), or Sequence[Split(GPT-2 regex), ByteLevel] (as Qwen2/Llama 3 files)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.kind == "qwen2":
        make_qwen2(a.out, a.seed, a.pretok)
    elif a.kind == "llama3":
        make_llama3(a.out, a.seed, a.pretok)
    else:
        make_stories_bf16(a.out)


if __name__ == "__main__":
    main()
