"""Checks a GGUF that ftune wrote for a llama.cpp file type (tests/cli_kquant.sh).

    gguf_mix_check.py types SRC.gguf OUT.gguf MIX
        every tensor of OUT has the type llama.cpp's llama_tensor_get_type
        (llama-quant.cpp; stated again here, from its source, independently of
        ftune's C) gives it for MIX from SRC's shapes, and general.file_type is
        MIX's LLAMA_FTYPE
    gguf_mix_check.py bytes SRC.gguf OUT.gguf
        every quantized tensor of OUT is byte for byte what gguf-py's
        gguf.quants.quantize makes of SRC's f32 values, for the types gguf-py
        quantizes; prints the types it cannot (its K-quants, in gguf-py 0.17)
    gguf_mix_check.py order LLAMA.gguf OUT.gguf
        OUT (ftune's requantization of LLAMA, a llama.cpp Q4_K_M/Q5_K_M file)
        has LLAMA's type on every tensor, except that llama.cpp chose attn_v's
        and ffn_down's by each layer's place in name order (blk.0, blk.1,
        blk.10, ...) where ftune, as llama.cpp has since it sorts its weights by
        layer number, chooses by the layer number
"""
import re
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

# mix: (LLAMA_FTYPE, default type)
MIXES = {
    "f32": (0, Q.F32), "f16": (1, Q.F16), "bf16": (32, Q.BF16), "q8_0": (7, Q.Q8_0), "q4_0": (2, Q.Q4_0),
    "q4_1": (3, Q.Q4_1), "q5_0": (8, Q.Q5_0), "q5_1": (9, Q.Q5_1), "q6_k": (18, Q.Q6_K),
    "q4_k_s": (14, Q.Q4_K), "q4_k_m": (15, Q.Q4_K), "q5_k_s": (16, Q.Q5_K), "q5_k_m": (17, Q.Q5_K),
    "q4_k": (15, Q.Q4_K), "q5_k": (17, Q.Q5_K),
}
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def block(t):
    return GGML_QUANT_SIZES[t][0]


def arch_of(r):
    return bytes(r.fields["general.architecture"].parts[-1]).decode()


def u32(r, key):
    return int(r.fields[key].parts[-1][0])


def expected(name, ncols, default, ftype, n_layer, tied, arch, n_head, n_head_kv, src_type):
    if not name.endswith(".weight") or "_norm" in name or name == "rope_freqs.weight":
        return src_type
    if block(default) == 1:
        return default
    t = default
    m = re.match(r"blk\.(\d+)\.", name)
    layer = int(m.group(1)) if m else -1
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        if ncols % block(t):
            t = Q.Q8_0
        elif t != Q.Q8_0:
            t = Q.Q6_K
    elif "attn_v.weight" in name:
        if ftype in (15, 17) and more_bits(layer, n_layer):
            t = Q.Q6_K
        elif ftype == 14 and layer < 4:
            t = Q.Q5_K
        if n_layer == 80 and (arch == "qwen2" or n_head != n_head_kv) and t == Q.Q4_K:
            t = Q.Q5_K
    elif "ffn_down" in name:
        if ftype in (15, 17) and more_bits(layer, n_layer):
            t = Q.Q6_K
        elif ftype == 14 and layer < n_layer // 8:
            t = Q.Q5_K
    if ncols % block(t):
        if t not in FALLBACK:  # llama.cpp has no fallback here (it stops); ftune keeps the tensor's type
            return src_type
        t = FALLBACK[t]
        if ncols % block(t):
            t = Q.F16
    return t


def check_types(src, out, mix):
    a, b = gguf.GGUFReader(src), gguf.GGUFReader(out)
    ftype, default = MIXES[mix.lower()]
    arch = arch_of(a)
    n_layer, n_head, n_kv = (u32(a, f"{arch}.{k}") for k in ("block_count", "attention.head_count", "attention.head_count_kv"))
    names = {t.name for t in a.tensors}
    tied = "output.weight" not in names
    got = {t.name: Q(t.tensor_type) for t in b.tensors}
    bad = []
    for t in a.tensors:
        want = expected(t.name, int(t.shape[0]), default, ftype, n_layer, tied, arch, n_head, n_kv, Q(t.tensor_type))
        if got.get(t.name) != want:
            bad.append(f"{t.name}: {got.get(t.name, 'missing').name if t.name in got else 'missing'}, llama.cpp: {want.name}")
    if set(got) != names:
        bad.append(f"tensor names differ: {sorted(set(got) ^ names)[:4]}")
    ft = u32(b, "general.file_type")
    if ft != ftype:
        bad.append(f"general.file_type {ft}, llama.cpp: {ftype}")
    counts = {}
    for t in got.values():
        counts[t.name] = counts.get(t.name, 0) + 1
    if bad:
        print(f"FAIL {out}: " + "; ".join(bad[:6]))
        return False
    print(f"  {mix}: {len(got)} tensors as llama.cpp chooses them ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}), file type {ft}")
    return True


def q5_0_unfused(x):
    """ggml's quantize_row_q5_0_ref on blocks x (n, 32) in f32 throughout, nothing fused."""
    amax = np.take_along_axis(x, np.abs(x).argmax(axis=-1, keepdims=True), axis=-1)
    d = (amax / np.float32(-16)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.minimum(np.trunc((x * inv).astype(np.float32) + np.float32(16.5)).astype(np.int32), 31).astype(np.uint8)
    qs = (q[:, :16] & 0x0F) | (q[:, 16:] << 4)
    qh = np.packbits((q >> 4).reshape(-1, 1, 32), axis=-1, bitorder="little").reshape(-1, 4)
    return np.concatenate([d.astype(np.float16).view(np.uint8), qh, qs], axis=-1)


def check_bytes(src, out):
    a, b = gguf.GGUFReader(src), gguf.GGUFReader(out)
    srcs = {t.name: t for t in a.tensors}
    ok, done, cannot, named = True, {}, set(), False
    for t in b.tensors:
        qt = Q(t.tensor_type)
        if block(qt) == 1:
            continue
        s = srcs[t.name]
        if Q(s.tensor_type) != Q.F32:
            sys.exit(f"{src}: {t.name} is not f32")
        x = np.asarray(s.data, dtype=np.float32).reshape(-1, int(s.shape[0]))
        try:
            ref = gguf.quants.quantize(x, qt)
        except NotImplementedError:
            cannot.add(qt.name)
            continue
        mine = np.asarray(t.data).reshape(-1).view(np.uint8)
        ref = ref.reshape(-1).view(np.uint8)
        if qt == Q.Q5_0 and mine.tobytes() != ref.tobytes():
            # gguf-py rounds x·id + 16.5 as one fused multiply-add (its FIXME: ggml's rounding "depends on
            # FMA"); ggml's reference, as llama-quantize runs it where the compiler fuses nothing (x86-64's
            # baseline), rounds the product first: the blocks that differ must be that rounding's
            nb = mine.size // 22
            differ = np.flatnonzero((mine.reshape(nb, 22) != ref.reshape(nb, 22)).any(axis=1))
            unfused = q5_0_unfused(x.reshape(-1, 32)[differ])
            if unfused.tobytes() == mine.reshape(nb, 22)[differ].tobytes():
                print(f"  {t.name} (Q5_0): {differ.size} of {nb} blocks differ from gguf-py's fused rounding; each is "
                      "ggml's unfused one")
                ref, named = mine, True
        if mine.tobytes() != ref.tobytes():
            d = np.flatnonzero(mine != ref.reshape(-1).view(np.uint8))
            print(f"FAIL {out}: {t.name} ({qt.name}): {d.size} bytes differ from gguf-py's quantize, the first at {d[0]}")
            ok = False
        done[qt.name] = done.get(qt.name, 0) + 1
    for k, v in sorted(done.items()):
        print(f"  {k}: {v} tensor(s) byte for byte gguf-py's quantize" + (", but for the blocks named above" if named else ""))
    if cannot:
        print(f"  not compared with gguf-py (this gguf-py has no quantizer for them): "
              + ", ".join(sorted(cannot)))
    return ok


def check_order(ref, out):
    a, b = gguf.GGUFReader(ref), gguf.GGUFReader(out)
    ta = {t.name: Q(t.tensor_type) for t in a.tensors}
    tb = {t.name: Q(t.tensor_type) for t in b.tensors}
    n_layer = u32(a, f"{arch_of(a)}.block_count")
    rank = {l: k for k, l in enumerate(sorted(range(n_layer), key=str))}
    pat = re.compile(r"blk\.(\d+)\.(attn_v|ffn_down)\.weight$")
    side = {}  # (category, more_bits) -> the types llama.cpp gave
    for n, t in ta.items():
        m = pat.match(n)
        if m:
            side.setdefault((m.group(2), more_bits(rank[int(m.group(1))], n_layer)), set()).add(t)
    if any(len(v) != 1 for v in side.values()):
        print(f"FAIL {ref}: its attn_v/ffn_down types do not follow more_bits in name order: {side}")
        return False
    bad = []
    for n, t in ta.items():
        m = pat.match(n)
        want = next(iter(side[(m.group(2), more_bits(int(m.group(1)), n_layer))])) if m else t
        if tb.get(n) != want:
            bad.append(f"{n}: {tb.get(n)}, expected {want.name}")
    if bad or set(ta) != set(tb):
        print(f"FAIL {out}: " + "; ".join(bad[:6]))
        return False
    moved = sum(1 for n in ta if ta[n] != tb[n])
    print(f"  {len(ta)} tensors as llama.cpp's own file has them; {moved} attn_v/ffn_down differ only by the layer order "
          f"(llama.cpp's then name order, ftune's layer number)")
    return True


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "types" and len(sys.argv) == 5:
        sys.exit(0 if check_types(*sys.argv[2:5]) else 1)
    if cmd == "bytes" and len(sys.argv) == 4:
        sys.exit(0 if check_bytes(*sys.argv[2:4]) else 1)
    if cmd == "order" and len(sys.argv) == 4:
        sys.exit(0 if check_order(*sys.argv[2:4]) else 1)
    sys.exit(__doc__)
