#!/usr/bin/env python3
"""gguf_py_check.py — checks GGUF files with llama.cpp's own reader/writer
(the `gguf` package, gguf-py) for tests/cli_gguf_py.sh:

  model FILE --file-type N [--tensor NAME=TYPE ...] [--key KEY=VALUE ...]
                                                      a model parses, has the keys llama.cpp needs
  adapter FILE --alpha A                              a LoRA adapter parses, has the adapter keys
  compare OURS REF                                    OURS has REF's tensors (bit for bit) and vocabulary
  to-f16 IN OUT                                       IN with every tensor in F16 (as llama.cpp's LoRA
                                                      converter writes adapters)
  write DIR REF                                       writes, with gguf-py, a random small llama model
                                                      (DIR/rand.gguf; DIR/rand_extra.gguf with one
                                                      more tensor), the same weights as a llama2.c
                                                      checkpoint (DIR/rand.bin) and a vocab-only file
                                                      (DIR/vocab.gguf), the vocabulary taken from REF

Exits non-zero with a message naming the file and what is wrong.
"""
import struct
import sys

try:
    import gguf
    import numpy as np
except ImportError as e:  # the test script turns this into a FAIL naming the package
    sys.exit(f"gguf_py_check: cannot import {e.name}: install it (pip install -r scripts/requirements-test.txt)")


def die(msg):
    sys.exit(f"gguf_py_check: {msg}")


def value(r, key):
    f = r.fields.get(key)
    return None if f is None else value_of_field(f)


def value_of_field(f):
    t = f.types[0]
    if t == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    if t == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    return f.parts[f.data[0]].tolist()[0]


def need(r, path, key, want=None):
    v = value(r, key)
    if v is None:
        die(f"{path}: no {key}")
    if want is not None and v != want:
        die(f"{path}: {key} is {v!r}, expected {want!r}")
    return v


def check_model(path, file_type, tensor_types, keys):
    r = gguf.GGUFReader(path)
    arch = need(r, path, "general.architecture")
    if arch not in ("llama", "qwen2"):
        die(f"{path}: general.architecture {arch!r}")
    need(r, path, "general.file_type", file_type)
    if file_type not in [int(x) for x in gguf.LlamaFileType]:
        die(f"{path}: general.file_type {file_type} is not one of gguf-py's LlamaFileType")
    for k in ("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
              "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "rope.dimension_count"):
        need(r, path, f"{arch}.{k}")
    toks = need(r, path, "tokenizer.ggml.tokens")
    tm = need(r, path, "tokenizer.ggml.model")
    for k in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type") if tm == "llama" else ("tokenizer.ggml.token_type",):
        if len(need(r, path, k)) != len(toks):
            die(f"{path}: {k} has another length than tokenizer.ggml.tokens")
    if tm == "gpt2":
        merges = need(r, path, "tokenizer.ggml.merges")
        if not merges or any(len(m.split(" ")) != 2 for m in merges):
            die(f"{path}: tokenizer.ggml.merges is not a list of \"a b\" pairs")
        need(r, path, "tokenizer.ggml.pre")
    for spec in keys:
        k, want = spec.split("=", 1)
        if str(need(r, path, k)) != want:
            die(f"{path}: {k} is {value(r, k)!r}, expected {want}")
    t = {x.name: x for x in r.tensors}
    emb = t.get("token_embd.weight")
    if emb is None:
        die(f"{path}: no token_embd.weight")
    C = need(r, path, f"{arch}.embedding_length")
    # gguf-py's shape is ggml's ne: (C, V)
    if list(emb.shape) != [C, len(toks)]:
        die(f"{path}: token_embd.weight shape {list(emb.shape)} but {C} embedding_length and {len(toks)} tokens")
    for i in range(need(r, path, f"{arch}.block_count")):
        for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_norm", "ffn_norm"):
            if f"blk.{i}.{n}.weight" not in t:
                die(f"{path}: no blk.{i}.{n}.weight")
    for spec in tensor_types:
        name, typ = spec.split("=")
        if name not in t:
            die(f"{path}: no tensor {name}")
        if t[name].tensor_type.name != typ:
            die(f"{path}: {name} is {t[name].tensor_type.name}, expected {typ}")
    for x in r.tensors:  # every tensor's data lies in the file
        if x.data.nbytes != x.n_bytes:
            die(f"{path}: {x.name}: {x.data.nbytes} bytes read, {x.n_bytes} expected")
    print(f"{path}: {arch}, file type {gguf.LlamaFileType(file_type).name}, {len(r.tensors)} tensors, "
          f"{len(toks)} tokens: OK")


def check_adapter(path, alpha):
    r = gguf.GGUFReader(path)
    need(r, path, "general.type", "adapter")
    need(r, path, "adapter.type", "lora")
    need(r, path, "general.architecture")
    a = need(r, path, "adapter.lora.alpha")
    if abs(a - alpha) > 1e-6 * abs(alpha):
        die(f"{path}: adapter.lora.alpha {a}, expected {alpha}")
    names = {x.name: x for x in r.tensors}
    if not names:
        die(f"{path}: no tensors")
    for n, x in names.items():
        if not (n.endswith(".lora_a") or n.endswith(".lora_b")):
            die(f"{path}: tensor {n} is not a lora_a/lora_b")
        other = n[:-1] + ("b" if n.endswith("a") else "a")
        if other not in names:
            die(f"{path}: {n} has no {other}")
        if n.endswith(".lora_a") and x.shape[1] != names[other].shape[0]:
            die(f"{path}: {n} and {other} disagree on the rank")
    print(f"{path}: LoRA adapter, alpha {a}, {len(names)} tensors: OK")


def compare(ours, ref):
    a, b = gguf.GGUFReader(ours), gguf.GGUFReader(ref)
    ta, tb = {x.name: x for x in a.tensors}, {x.name: x for x in b.tensors}
    tied = "output.weight" not in ta
    for n, y in tb.items():
        x = ta.get("token_embd.weight" if (n == "output.weight" and tied) else n)
        if x is None:
            die(f"{ours}: no {n} (the reference {ref} has it)")
        if x.tensor_type != y.tensor_type or list(x.shape) != list(y.shape) or not np.array_equal(x.data, y.data):
            die(f"{ours}: {n} differs from the reference's")
    for k in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
              "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
              "general.architecture", "llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
              "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.dimension_count",
              "llama.attention.layer_norm_rms_epsilon"):
        if value(a, k) != value(b, k):
            die(f"{ours}: {k} differs from the reference's")
    print(f"{ours}: the {len(tb)} tensors and the vocabulary of {ref}: OK")


def write(d, ref):
    rng = np.random.default_rng(7)
    r = gguf.GGUFReader(ref)
    toks = value(r, "tokenizer.ggml.tokens")
    scores, types = value(r, "tokenizer.ggml.scores"), value(r, "tokenizer.ggml.token_type")
    C, F, L, NH, NKV, V, T = 48, 100, 2, 6, 2, len(toks), 64  # awkward sizes: F not a multiple of 32, GQA 3:1
    HS = C // NH

    def rnd(*shape, s=0.2):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    w = {"tok": rnd(V, C, s=1.0), "out": rnd(V, C), "norm": 1 + rnd(C, s=0.1)}
    for l in range(L):
        w[l] = dict(an=1 + rnd(C, s=0.1), q=rnd(C, C), k=rnd(NKV * HS, C), v=rnd(NKV * HS, C), o=rnd(C, C),
                    fn=1 + rnd(C, s=0.1), gate=rnd(F, C), down=rnd(C, F), up=rnd(F, C))

    def add_vocab(g):
        g.add_tokenizer_model("llama")
        g.add_token_list(toks)
        g.add_token_scores(scores)
        g.add_token_types(types)
        g.add_bos_token_id(1)
        g.add_eos_token_id(2)
        g.add_unk_token_id(0)

    g = gguf.GGUFWriter(f"{d}/rand.gguf", "llama")
    g.add_context_length(T)
    g.add_embedding_length(C)
    g.add_block_count(L)
    g.add_feed_forward_length(F)
    g.add_head_count(NH)
    g.add_head_count_kv(NKV)
    g.add_rope_dimension_count(HS)
    g.add_layer_norm_rms_eps(1e-5)
    g.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_vocab(g)
    # llama2.c and llama-arch GGUF both keep Meta's interleaved q/k rows: the same arrays go to both
    g.add_tensor("token_embd.weight", w["tok"])
    g.add_tensor("output_norm.weight", w["norm"])
    g.add_tensor("output.weight", w["out"])
    for l in range(L):
        x = w[l]
        for n, k in (("attn_norm", "an"), ("attn_q", "q"), ("attn_k", "k"), ("attn_v", "v"), ("attn_output", "o"),
                     ("ffn_norm", "fn"), ("ffn_gate", "gate"), ("ffn_down", "down"), ("ffn_up", "up")):
            g.add_tensor(f"blk.{l}.{n}.weight", x[k])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()

    # the same model with a tensor ftune does not use: a merge must carry it over, not drop it
    e = gguf.GGUFWriter(f"{d}/rand_extra.gguf", "llama")
    for f in gguf.GGUFReader(f"{d}/rand.gguf").fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        v = value_of_field(f)
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            e.add_array(f.name, v)
        else:
            e.add_key_value(f.name, v, t)
    for x in gguf.GGUFReader(f"{d}/rand.gguf").tensors:
        e.add_tensor(x.name, np.array(x.data))
    e.add_tensor("blk.0.attn_extra.weight", rnd(4, C))
    e.write_header_to_file()
    e.write_kv_data_to_file()
    e.write_tensors_to_file()
    e.close()

    v = gguf.GGUFWriter(f"{d}/vocab.gguf", "llama")
    add_vocab(v)
    v.write_header_to_file()
    v.write_kv_data_to_file()
    v.write_tensors_to_file()
    v.close()

    # llama2.c legacy checkpoint: 7 int32 (negative vocab: untied), then f32 in its fixed order
    with open(f"{d}/rand.bin", "wb") as f:
        f.write(struct.pack("7i", C, F, L, NH, NKV, -V, T))
        parts = [w["tok"]] + [w[l]["an"] for l in range(L)]
        for k in ("q", "k", "v", "o"):
            parts += [w[l][k] for l in range(L)]
        parts += [w[l]["fn"] for l in range(L)]
        for k in ("gate", "down", "up"):  # w1, w2, w3
            parts += [w[l][k] for l in range(L)]
        parts += [w["norm"], np.zeros(T * HS, np.float32), w["out"]]  # unused freq_cis tables, then wcls
        for p in parts:
            f.write(np.ascontiguousarray(p, dtype="<f4").tobytes())
    print(f"{d}: rand.gguf, rand.bin, vocab.gguf written with gguf-py {C=} {F=} {L=} {NH=} {NKV=} {V=}")


def to_f16(src, dst):
    """Rewrites a GGUF with every tensor in float16, as llama.cpp's convert_lora_to_gguf.py writes adapters."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, value_of_field(r.fields["general.architecture"]))
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(f.name, value_of_field(f))
        else:
            w.add_key_value(f.name, value_of_field(f), f.types[0])
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{dst}: {len(r.tensors)} tensors in F16")


def main(argv):
    if len(argv) < 3:
        die(__doc__)
    cmd, path = argv[1], argv[2]
    if cmd == "model":
        ft = int(argv[argv.index("--file-type") + 1])
        check_model(path, ft, [argv[i + 1] for i, a in enumerate(argv) if a == "--tensor"],
                    [argv[i + 1] for i, a in enumerate(argv) if a == "--key"])
    elif cmd == "adapter":
        check_adapter(path, float(argv[argv.index("--alpha") + 1]))
    elif cmd == "compare":
        compare(path, argv[3])
    elif cmd == "to-f16":
        to_f16(path, argv[3])
    elif cmd == "write":
        write(path, argv[3])
    else:
        die(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv)
