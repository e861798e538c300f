"""adam8_ref.py — an independent implementation of bitsandbytes' blockwise
8-bit AdamW, written from its source (bitsandbytes functional.py
create_dynamic_map; backends/default/ops.py quantize_blockwise and
dequantize_blockwise; backends/cpu/ops.py _optimizer_update_8bit_blockwise_cpu;
optim/optimizer.py: min_8bit_size 4096, the "dynamic" map for state1 and
"udynamic" for state2) in torch, for test_optim8. bitsandbytes itself does
not run here (its CPU releases need torch >= 2.2; Debian has 1.13).

Where bitsandbytes leaves the float rounding to torch's kernels (add with
alpha is a fused multiply-add on AVX2, and so on), each operation here is
one rounded float32 tensor op in the order ftune's f32 AdamW computes it
(torch.optim.AdamW's single-tensor order), so the result is bit for bit the
C one, not merely close. The absmax reciprocal multiplies every block (the
CUDA kernel's rule; the CPU path divides its last partial block instead).

usage: adam8_ref.py IN OUT
IN:  int32 n_tensors, int32 steps, int32 block, float64 lr[steps] ... see read()
OUT: the signed and the unsigned map (256 f32 each); the probe codes
     (signed then unsigned, n_probe u8 each); per tensor: the weights after
     the steps (n f32); if 8-bit, codes of m and v (n u8 each) and absmax
     of m and v (nb f32 each), else m and v (n f32 each).
"""
import struct
import sys

import torch

from bnb_maps import create_dynamic_map


def quantize(scaled, code):
    """bitsandbytes' quantize_blockwise after scaling: bucketize over the midpoints"""
    bounds = (code[:-1] + code[1:]) / 2
    return torch.bucketize(torch.clamp(scaled, -1, 1), bounds, out_int32=True).to(torch.uint8)


def f32(x):
    return torch.tensor(x, dtype=torch.float64).to(torch.float32)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    raw = open(src, "rb").read()
    at = 0

    def take(fmt):
        nonlocal at
        v = struct.unpack_from(fmt, raw, at)
        at += struct.calcsize(fmt)
        return v

    n_t, steps, block = take("<iii")
    b1, b2, eps, wd = take("<dddd")
    lrs = take("<%dd" % steps)
    (n_probe,) = take("<i")
    probe = torch.frombuffer(bytearray(raw[at:at + 4 * n_probe]), dtype=torch.float32).clone()
    at += 4 * n_probe
    tensors = []
    for _ in range(n_t):
        n, decay = take("<qi")
        w = torch.frombuffer(bytearray(raw[at:at + 4 * n]), dtype=torch.float32).clone()
        at += 4 * n
        g = torch.frombuffer(bytearray(raw[at:at + 4 * n * steps]), dtype=torch.float32).clone().view(steps, n)
        at += 4 * n * steps
        tensors.append((n, decay, w, g))
    assert at == len(raw)

    smap, umap = create_dynamic_map(True), create_dynamic_map(False)
    out = [smap.numpy().tobytes(), umap.numpy().tobytes(),
           quantize(probe, smap).numpy().tobytes(), quantize(probe, umap).numpy().tobytes()]
    tiny = torch.tensor(1e-38, dtype=torch.float32)
    for n, decay, w, g in tensors:
        eight = n >= 4096
        nb = (n + block - 1) // block
        pad = nb * block - n
        if eight:
            qm = torch.zeros(n, dtype=torch.uint8)  # bitsandbytes' zeroed state: any code times absmax 0
            qv = torch.zeros(n, dtype=torch.uint8)
            am = torch.zeros(nb)
            av = torch.zeros(nb)
        else:
            m = torch.zeros(n)
            v = torch.zeros(n)
        for s in range(steps):
            t = s + 1
            lr = lrs[s]
            bc1 = 1.0 - b1 ** t
            bc2 = 1.0 - b2 ** t
            decay_f = f32(1.0 - lr * wd)
            neg_step, bc2_sqrt = f32(-(lr / bc1)), f32(bc2 ** 0.5)
            if eight:
                m = smap[qm.long()] * am.repeat_interleave(block)[:n]
                v = umap[qv.long()] * av.repeat_interleave(block)[:n]
            x = w * decay_f if (decay and wd != 0) else w
            gk = g[s]
            m = m * f32(b1) + gk * f32(1.0 - b1)
            v = v * f32(b2) + (gk * gk) * f32(1.0 - b2)
            denom = torch.sqrt(v) / bc2_sqrt + f32(eps)
            w = x + (neg_step * m) / denom
            if eight:
                mp = torch.cat([m, torch.zeros(pad)]).view(nb, block)
                vp = torch.cat([v, torch.zeros(pad)]).view(nb, block)
                am = mp.abs().max(dim=1)[0]  # the pad's zeros change no max of |x| >= 0
                av = vp.abs().max(dim=1)[0]
                im = (1.0 / torch.maximum(am, tiny)).repeat_interleave(block)[:n]
                iv = (1.0 / torch.maximum(av, tiny)).repeat_interleave(block)[:n]
                qm = quantize(m * im, smap)
                qv = quantize(v * iv, umap)
        out.append(w.numpy().tobytes())
        if eight:
            out += [qm.numpy().tobytes(), qv.numpy().tobytes(), am.numpy().tobytes(), av.numpy().tobytes()]
        else:
            out += [m.numpy().tobytes(), v.numpy().tobytes()]
    with open(dst, "wb") as f:
        for b in out:
            f.write(b)


if __name__ == "__main__":
    main()
