"""ref_llama.py — an independent, plain-PyTorch reference for the Llama family
(Llama 2/3, Mistral, Qwen2, SmolLM, TinyLlama): a safetensors reader/writer,
the config, and the forward pass written from the math.

The weights are plain torch tensors in a dict keyed by Hugging Face names, and
every op is an ordinary differentiable torch op, so the same code serves as the
reference trainer (autograd, LoRA) later. Nothing here depends on the C code.

Shapes: B batch, T time, C hidden, NH query heads, NKV key/value heads,
HS head size, V vocabulary, F MLP hidden size.
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, JSON header, raw data.

_ST_DTYPES = {  # name -> (numpy dtype used to read the bytes, bytes per element)
    "F64": (np.float64, 8), "F32": (np.float32, 4), "F16": (np.float16, 2),
    "BF16": (np.uint16, 2), "I64": (np.int64, 8), "I32": (np.int32, 4),
}


class FormatError(Exception):
    pass


def read_safetensors_header(path):
    """Returns (header dict without __metadata__, metadata, data start offset)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise FormatError(f"{path}: shorter than the 8-byte header length")
        n = struct.unpack("<Q", raw)[0]
        if n > size - 8:
            raise FormatError(f"{path}: header length {n} runs past the end of the file ({size} bytes)")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FormatError(f"{path}: header is not JSON: {e}")
    meta = header.pop("__metadata__", None) or {}
    data_start = 8 + n
    for name, info in header.items():
        dt = info.get("dtype")
        if dt not in _ST_DTYPES:
            raise FormatError(f"{path}: tensor {name}: unsupported dtype {dt}")
        shape = info.get("shape")
        begin, end = info.get("data_offsets", (None, None))
        if not isinstance(shape, list) or any((not isinstance(d, int)) or d < 0 for d in shape):
            raise FormatError(f"{path}: tensor {name}: bad shape {shape}")
        nbytes = math.prod(shape) * _ST_DTYPES[dt][1]
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end
                and end - begin == nbytes and data_start + end <= size):
            raise FormatError(f"{path}: tensor {name}: data_offsets {begin},{end} do not fit "
                              f"shape {shape} {dt} in a file of {size} bytes")
    return header, meta, data_start


def _to_torch(buf, dt, shape):
    npdt = _ST_DTYPES[dt][0]
    a = np.frombuffer(buf, dtype=np.dtype(npdt).newbyteorder("<"))
    if dt == "BF16":  # bf16 is the top half of an f32: widen exactly
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return torch.from_numpy(a.astype(a.dtype.newbyteorder("="), copy=True)).reshape(shape)


def load_safetensors(path):
    """Reads every tensor of one file. Returns {name: (tensor, dtype name)};
    BF16 comes back widened to float32 (exactly), F16 as float16."""
    header, _, data_start = read_safetensors_header(path)
    out = {}
    with open(path, "rb") as f:
        for name, info in header.items():
            begin, end = info["data_offsets"]
            f.seek(data_start + begin)
            buf = f.read(end - begin)
            out[name] = (_to_torch(buf, info["dtype"], info["shape"]), info["dtype"])
    return out


def f32_to_bf16_bits(a):
    """float32 array -> uint16 bf16 bit patterns, rounding to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def tensor_bytes(t, dtype):
    """A float tensor -> (little-endian bytes in safetensors dtype, shape)."""
    a = t.detach().to(torch.float32).contiguous().numpy() if torch.is_tensor(t) else np.asarray(t, np.float32)
    if dtype == "F32":
        b = a.astype("<f4")
    elif dtype == "F16":
        b = a.astype("<f2")
    elif dtype == "BF16":
        b = f32_to_bf16_bits(a).astype("<u2")
    else:
        raise ValueError(f"cannot write dtype {dtype}")
    return b.tobytes(), list(a.shape)


def write_safetensors(path, tensors, metadata=None):
    """tensors: ordered list of (name, dtype, shape, bytes). Written to
    path.tmp, fsynced, renamed. Data in list order; header padded with spaces
    to a multiple of 8 so that the data is aligned, as Hugging Face does."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for name, dt, shape, data in tensors:
        assert len(data) == math.prod(shape) * _ST_DTYPES[dt][1], name
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for _, _, _, data in tensors:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return off


def load_hf_weights(model_dir):
    """All tensors of a Hugging Face directory: model.safetensors, or the shards
    named in model.safetensors.index.json. Returns {name: (tensor, dtype)}."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise FormatError(f"{index}: no weight_map")
        out = {}
        for shard in sorted(set(weight_map.values())):
            if os.path.basename(shard) != shard:
                raise FormatError(f"{index}: shard name {shard!r} is not a plain file name")
            out.update(load_safetensors(os.path.join(model_dir, shard)))
        for name, shard in weight_map.items():
            if name not in out:
                raise FormatError(f"{index}: {name} is not in {shard}")
        return out
    if os.path.exists(single):
        return load_safetensors(single)
    raise FormatError(f"{model_dir}: neither model.safetensors nor model.safetensors.index.json")


# --------------------------------------------------------------------------
# Config

class Config:
    """The fields of config.json that the forward pass needs."""

    def __init__(self, d):
        self.raw = d
        self.model_type = d.get("model_type", "llama")
        self.C = int(d["hidden_size"])
        self.F = int(d["intermediate_size"])
        self.L = int(d["num_hidden_layers"])
        self.NH = int(d["num_attention_heads"])
        self.NKV = int(d.get("num_key_value_heads") or self.NH)
        self.HS = int(d.get("head_dim") or self.C // self.NH)
        self.V = int(d["vocab_size"])
        self.eps = float(d.get("rms_norm_eps", 1e-6))
        self.rope_theta = float(d.get("rope_theta", 10000.0))
        self.rope_scaling = d.get("rope_scaling")
        self.tie = bool(d.get("tie_word_embeddings", False))
        self.qkv_bias = bool(d.get("attention_bias", False)) or self.model_type == "qwen2"
        self.o_bias = bool(d.get("attention_bias", False)) and self.model_type != "qwen2"
        self.mlp_bias = bool(d.get("mlp_bias", False))
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise FormatError(f"config.json: hidden_act {act!r} is not supported (silu only)")
        if self.NH % self.NKV:
            raise FormatError(f"config.json: {self.NH} heads is not a multiple of {self.NKV} kv heads")

    @classmethod
    def from_dir(cls, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            return cls(json.load(f))


# --------------------------------------------------------------------------
# Layers

def rmsnorm(x, w, eps):
    """x (..., C) scaled to unit root-mean-square, then by w (C)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_inv_freq(cfg, dtype=torch.float64):
    """Angular frequency of each rotated pair, (HS/2), with rope_scaling applied."""
    HS = cfg.HS
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS)
    rs = cfg.rope_scaling
    kind = (rs or {}).get("rope_type", (rs or {}).get("type", "default"))
    if kind == "default":
        pass
    elif kind == "linear":
        inv_freq = inv_freq / float(rs["factor"])
    elif kind == "llama3":
        # Long wavelengths are slowed down by `factor`, short ones kept, and the
        # band between is interpolated linearly in (context / wavelength).
        factor = float(rs["factor"])
        low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        ctx = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        smooth = (ctx / wavelen - low) / (high - low)
        mid = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > ctx / low, inv_freq / factor,
                               torch.where(wavelen < ctx / high, inv_freq, mid))
    else:
        raise FormatError(f"config.json: rope_scaling type {kind!r} is not supported")
    return inv_freq.to(dtype)


def rope_cos_sin(cfg, pos, dtype):
    """cos, sin of shape (T, HS) for positions pos (T), in the rotate-half layout:
    dimension i and i + HS/2 form one rotated pair."""
    ang = pos.to(torch.float64)[:, None] * rope_inv_freq(cfg)[None, :]   # (T, HS/2)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    """x (B, heads, T, HS)."""
    return x * cos + rotate_half(x) * sin


def linear(x, p, name):
    """x @ W^T (+ b): W = p[name.weight] (out, in), b optional."""
    y = x @ p[name + ".weight"].t()
    b = p.get(name + ".bias")
    return y + b if b is not None else y


def attention(x, p, pre, cfg, cos, sin, cache=None):
    """Causal grouped-query self-attention. x (B, T, C) -> (B, T, C).
    cache, if given, is a dict holding the keys/values of earlier positions;
    it is extended in place (for decoding one token at a time)."""
    B, T, _ = x.shape
    NH, NKV, HS = cfg.NH, cfg.NKV, cfg.HS
    q = linear(x, p, pre + "q_proj").view(B, T, NH, HS).transpose(1, 2)    # (B, NH, T, HS)
    k = linear(x, p, pre + "k_proj").view(B, T, NKV, HS).transpose(1, 2)   # (B, NKV, T, HS)
    v = linear(x, p, pre + "v_proj").view(B, T, NKV, HS).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    past = 0
    if cache is not None:
        if "k" in cache:
            past = cache["k"].shape[2]
            k = torch.cat([cache["k"], k], dim=2)
            v = torch.cat([cache["v"], v], dim=2)
        cache["k"], cache["v"] = k, v
    S = k.shape[2]
    rep = NH // NKV   # query head h reads key/value head h // rep
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)                          # (B, NH, T, S)
    qpos = torch.arange(past, past + T)[:, None]
    kpos = torch.arange(S)[None, :]
    att = att.masked_fill(kpos > qpos, float("-inf"))
    y = att.softmax(dim=-1) @ v                                              # (B, NH, T, HS)
    y = y.transpose(1, 2).reshape(B, T, NH * HS)
    return linear(y, p, pre + "o_proj")


def mlp(x, p, pre):
    """SwiGLU: down(silu(gate(x)) * up(x))."""
    return linear(F.silu(linear(x, p, pre + "gate_proj")) * linear(x, p, pre + "up_proj"),
                  p, pre + "down_proj")


# --------------------------------------------------------------------------
# Model

class Llama:
    """cfg + params {HF name: tensor}. The lm_head is params["lm_head.weight"]
    when untied; when tied it is the embedding itself (one tensor, so a
    gradient reaches it from both uses)."""

    def __init__(self, cfg, params):
        self.cfg = cfg
        self.params = params

    @property
    def lm_head(self):
        if self.cfg.tie:
            return self.params["model.embed_tokens.weight"]
        return self.params["lm_head.weight"]

    def parameters(self):
        return list(self.params.values())

    def requires_grad_(self, flag=True):
        for t in self.params.values():
            t.requires_grad_(flag)
        return self

    def forward(self, tokens, start_pos=0, caches=None, last_only=False):
        """tokens (B, T) int64 -> logits (B, T, V) (or (B, 1, V) if last_only).
        start_pos/caches: decode with a KV cache (caches: list of L dicts)."""
        cfg, p = self.cfg, self.params
        if not torch.is_tensor(tokens):
            tokens = torch.tensor(tokens, dtype=torch.long)
        if tokens.dim() == 1:
            tokens = tokens[None]
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= cfg.V):
            raise ValueError(f"token id out of range [0, {cfg.V})")
        x = p["model.embed_tokens.weight"][tokens]                       # (B, T, C)
        pos = torch.arange(start_pos, start_pos + tokens.shape[1])
        cos, sin = rope_cos_sin(cfg, pos, x.dtype)
        for l in range(cfg.L):
            pre = f"model.layers.{l}."
            h = rmsnorm(x, p[pre + "input_layernorm.weight"], cfg.eps)
            x = x + attention(h, p, pre + "self_attn.", cfg, cos, sin,
                              None if caches is None else caches[l])
            h = rmsnorm(x, p[pre + "post_attention_layernorm.weight"], cfg.eps)
            x = x + mlp(h, p, pre + "mlp.")
        if last_only:
            x = x[:, -1:]
        x = rmsnorm(x, p["model.norm.weight"], cfg.eps)
        return x @ self.lm_head.t()

    __call__ = forward

    def loss(self, tokens):
        """Mean next-token cross-entropy of one sequence (T >= 2): predicts
        tokens[1:] from tokens[:-1]."""
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(1, -1)
        logits = self.forward(tokens[:, :-1])
        return F.cross_entropy(logits[0], tokens[0, 1:])

    @torch.no_grad()
    def generate_greedy(self, prompt, n):
        """Appends n argmax tokens to prompt (list of ids), using a KV cache."""
        out = list(prompt)
        caches = [{} for _ in range(self.cfg.L)]
        logits = self.forward(out, 0, caches, last_only=True)
        for _ in range(n):
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
            logits = self.forward([nxt], len(out) - 1, caches, last_only=True)
        return out


def expected_weight_names(cfg):
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not cfg.tie:
        names.append("lm_head.weight")
    for l in range(cfg.L):
        pre = f"model.layers.{l}."
        names += [pre + "input_layernorm.weight", pre + "post_attention_layernorm.weight"]
        for m in ("q", "k", "v", "o"):
            names.append(f"{pre}self_attn.{m}_proj.weight")
        if cfg.qkv_bias:
            names += [f"{pre}self_attn.{m}_proj.bias" for m in ("q", "k", "v")]
        if cfg.o_bias:
            names.append(pre + "self_attn.o_proj.bias")
        for m in ("gate", "up", "down"):
            names.append(f"{pre}mlp.{m}_proj.weight")
            if cfg.mlp_bias:
                names.append(f"{pre}mlp.{m}_proj.bias")
    return names


def expected_shapes(cfg):
    C, F_, NH, NKV, HS, V = cfg.C, cfg.F, cfg.NH, cfg.NKV, cfg.HS, cfg.V
    s = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C], "lm_head.weight": [V, C]}
    per = {"input_layernorm.weight": [C], "post_attention_layernorm.weight": [C],
           "self_attn.q_proj.weight": [NH * HS, C], "self_attn.k_proj.weight": [NKV * HS, C],
           "self_attn.v_proj.weight": [NKV * HS, C], "self_attn.o_proj.weight": [C, NH * HS],
           "self_attn.q_proj.bias": [NH * HS], "self_attn.k_proj.bias": [NKV * HS],
           "self_attn.v_proj.bias": [NKV * HS], "self_attn.o_proj.bias": [C],
           "mlp.gate_proj.weight": [F_, C], "mlp.up_proj.weight": [F_, C], "mlp.down_proj.weight": [C, F_],
           "mlp.gate_proj.bias": [F_], "mlp.up_proj.bias": [F_], "mlp.down_proj.bias": [C]}
    for l in range(cfg.L):
        for k, v in per.items():
            s[f"model.layers.{l}.{k}"] = v
    return s


def load_model(model_dir, dtype=torch.float64, requires_grad=False):
    """Loads a Hugging Face directory into a Llama computing in `dtype`.
    Stored F16/BF16 values are widened exactly before any arithmetic."""
    cfg = Config.from_dir(model_dir)
    raw = load_hf_weights(model_dir)
    if "lm_head.weight" not in raw:
        cfg.tie = True   # absent lm_head means it shares the embedding
    shapes = expected_shapes(cfg)
    params = {}
    for name in expected_weight_names(cfg):
        if name not in raw:
            raise FormatError(f"{model_dir}: missing tensor {name}")
        t, _ = raw[name]
        if list(t.shape) != shapes[name]:
            raise FormatError(f"{model_dir}: tensor {name} has shape {list(t.shape)}, "
                              f"config says {shapes[name]}")
        params[name] = t.to(dtype).contiguous().requires_grad_(requires_grad)
    return Llama(cfg, params)


def stored_dtypes(model_dir):
    """{tensor name: safetensors dtype} (for reporting)."""
    return {k: dt for k, (_, dt) in load_hf_weights(model_dir).items()}
