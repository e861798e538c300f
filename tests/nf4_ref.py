"""nf4_ref.py — an independent implementation of bitsandbytes' NF4 with
double quantization, written from its source (bitsandbytes
backends/default/ops.py quantize_4bit / quantize_blockwise /
dequantize_blockwise and functional.py quantize_4bit, create_dynamic_map;
FORMATS.md §4.2) in torch, for test_nf4. bitsandbytes itself does not run
here: its releases that support CPU 4-bit need torch >= 2.2 (Debian has
1.13), and the older ones raise NotImplementedError on CPU.

usage: nf4_ref.py IN OUT, or nf4_ref.py int8 IN OUT (below)
IN:  int32 count, then per tensor: int64 n, n float32
OUT: per tensor: packed ((n+1)//2 u8), absmax (nb f32), qabsmax (nb u8),
     absmax2 (nb2 f32), offset (f32), dequantized with the nested absmax
     (n f32); then the 256-value dynamic map (f32) once at the end.
The offset is the mean of the absmax summed in float64 and rounded once
(torch's float32 mean may differ by an ulp; see formats/bnb.h).
"""
import struct
import sys

import numpy as np
import torch

from bnb_maps import create_dynamic_map  # noqa: F401 (bnb_write.py uses it from here too)

NF4 = torch.tensor([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                    0.7229568362236023, 1.0], dtype=torch.float32)


def blockwise_scale(a, bs):
    """absmax per block of bs (last partial) and clamp(a * (1/absmax), -1, 1)"""
    n = a.numel()
    nb = (n + bs - 1) // bs
    pad = nb * bs - n
    ap = torch.cat([a, torch.zeros(pad)]) if pad else a
    absmax = ap.view(nb, bs).abs().max(dim=1)[0]
    if pad:  # the partial block's max over its own elements only (zeros change nothing: |x| >= 0)
        absmax[-1] = a[(nb - 1) * bs:].abs().max()
    scaled = torch.clamp(a * (1 / absmax).repeat_interleave(bs)[:n], -1, 1)
    return absmax, scaled


def nearest(scaled, code):
    return torch.argmin(torch.abs(scaled.view(-1, 1) - code.view(1, -1)), dim=-1).to(torch.uint8)


def quantize(a):
    """bitsandbytes' quantize_4bit(nf4, blocksize=64, compress_statistics=True) of a flat f32 tensor:
    packed, absmax, qabsmax, absmax2, offset, the dequantized f32 values"""
    n = a.numel()
    dmap = create_dynamic_map()
    absmax, scaled = blockwise_scale(a, 64)
    q = nearest(scaled, NF4)
    if n % 2:
        q = torch.cat([q, torch.tensor([7], dtype=torch.uint8)])  # 0.0 pads to an even length
    packed = (q[::2] << 4) | q[1::2]
    offset = torch.tensor(absmax.double().sum().item() / absmax.numel(), dtype=torch.float32)
    absmax2, scaled2 = blockwise_scale(absmax - offset, 256)
    qa = nearest(scaled2, dmap)
    nb = absmax.numel()
    deq_absmax = (dmap[qa.long()] * absmax2.repeat_interleave(256)[:nb]) + offset
    qq = torch.stack([packed >> 4, packed & 15], dim=1).reshape(-1)[:n].long()
    deq = NF4[qq] * deq_absmax.repeat_interleave(64)[:n]
    return packed, absmax, qa, absmax2, offset, deq


def int8_rows(a):
    """bitsandbytes' int8_vectorwise_quant (threshold 0) and int8_vectorwise_dequant of a 2-D f32
    tensor: row_stats, q, the dequantized f32 values"""
    row_stats = torch.max(a.abs(), dim=1).values.float()
    q = torch.round(a * (127.0 / row_stats.unsqueeze(-1))).to(torch.int8)
    q[row_stats == 0] = 0  # 0 * (127 / 0) is NaN: ft stores 0 for an all-zero row
    deq = q * row_stats.view(-1, 1) * 7.874015718698502e-3
    return row_stats, q, deq


def main_int8(src, dst):
    """IN: int32 count, then per matrix int64 rows, int64 cols, rows*cols f32.
    OUT: per matrix row_stats (f32), q (int8), dequantized (f32)"""
    with open(src, "rb") as f, open(dst, "wb") as o:
        (count,) = struct.unpack("<i", f.read(4))
        for _ in range(count):
            rows, cols = struct.unpack("<qq", f.read(16))
            a = torch.from_numpy(np.frombuffer(f.read(4 * rows * cols), dtype=np.float32).copy()).view(rows, cols)
            for t in int8_rows(a):
                o.write(t.contiguous().numpy().tobytes())


def main():
    if sys.argv[1] == "int8":
        return main_int8(sys.argv[2], sys.argv[3])
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f, open(dst, "wb") as o:
        (count,) = struct.unpack("<i", f.read(4))
        for _ in range(count):
            (n,) = struct.unpack("<q", f.read(8))
            a = torch.from_numpy(np.frombuffer(f.read(4 * n), dtype=np.float32).copy())
            packed, absmax, qa, absmax2, offset, deq = quantize(a)
            for t in (packed, absmax, qa, absmax2, offset.view(1), deq):
                o.write(t.numpy().tobytes())
        o.write(create_dynamic_map().numpy().tobytes())


if __name__ == "__main__":
    main()
