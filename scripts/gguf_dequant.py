"""ftune's dequantization of every GGUF weight type against gguf-py's own
(gguf.quants.dequantize), value for value (tests/cli_gguf_dequant.sh).

    gguf_dequant.py synth OUT.gguf      writes synthetic blocks of every type
                                        gguf-py dequantizes (see SYNTH below)
    gguf_dequant.py check HELPER FILE.gguf [--types T,T]
                                        streams HELPER's f32 (helper_dequant)
                                        and compares every tensor with gguf-py

Equality is of the f32 bits, except that any NaN equals any NaN (a NaN's
payload is not a value; numpy and C may quiet a signalling one differently).
Prints one PASS line per type (and per file) or a FAIL line naming the tensor,
the first differing index and both values.
"""
import subprocess
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

# The weight types ftune reads from GGUF and gguf-py dequantizes, with the
# byte offsets of each block's f16 fields (scales and mins), where the
# synthetic blocks put extreme, subnormal and non-finite values.
F16_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
    Q.IQ4_NL: [0], Q.IQ4_XS: [0],
    Q.F16: [], Q.BF16: [], Q.F32: [],
}
# f16 bit patterns: the largest finite, the smallest normal, the smallest and
# largest subnormals, negative ones, one, zero, -0, inf, -inf, NaN
SPECIAL_F16 = [0x7BFF, 0x0400, 0x0001, 0x03FF, 0x8001, 0x83FF, 0xFBFF, 0x3C00, 0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00]


def synth_blocks(t, rng):
    bs, ts = GGML_QUANT_SIZES[t]
    if t in (Q.F32, Q.F16, Q.BF16):
        # every bit pattern of the 16-bit types once; f32: random bits and the specials
        if t == Q.F32:
            raw = rng.integers(0, 256, size=(256, 4 * 64), dtype=np.uint8)
        else:
            raw = np.arange(65536, dtype=np.uint16).view(np.uint8).reshape(256, 512)
        return raw
    blocks = [rng.integers(0, 256, size=(4096, ts), dtype=np.uint8)]  # every code value, many times
    blocks.append(np.zeros((8, ts), dtype=np.uint8))                    # zero blocks
    for fill in (0xFF, 0x55, 0xAA, 0x0F, 0xF0, 0x80, 0x7F):             # every bit set / patterns
        blocks.append(np.full((4, ts), fill, dtype=np.uint8))
    for off in F16_FIELDS[t]:                                           # extreme and subnormal scales
        b = rng.integers(0, 256, size=(len(SPECIAL_F16) * 4, ts), dtype=np.uint8)
        for i, h in enumerate(SPECIAL_F16 * 4):
            b[i, off:off + 2] = np.array([h], dtype=np.uint16).view(np.uint8)
        blocks.append(b)
    raw = np.concatenate(blocks)
    n = raw.shape[0]
    per_row = 4 if bs == 32 else 1
    n -= n % per_row
    return raw[:n].reshape(n // per_row, per_row * ts)


def synth(path):
    rng = np.random.default_rng(1234)
    w = gguf.GGUFWriter(path, "synthetic")
    for t in F16_FIELDS:
        raw = synth_blocks(t, rng)
        w.add_tensor("synth." + t.name, raw, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def same(a, b):
    """(equal, first differing index): f32 bits equal, or both NaN."""
    ai, bi = a.view(np.uint32), b.view(np.uint32)
    bad = (ai != bi) & ~(np.isnan(a) & np.isnan(b))
    if not bad.any():
        return True, -1
    return False, int(np.argmax(bad))


@np.errstate(all="ignore")
def check(helper, path, types_wanted):
    r = gguf.GGUFReader(path)
    proc = subprocess.Popen([helper, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ok = True
    seen = {}
    skipped = []
    for t in r.tensors:
        qt = Q(t.tensor_type)
        n = int(np.prod(t.shape))
        computed = qt in F16_FIELDS
        if not computed:
            skipped.append(f"{t.name} ({qt.name})")
            continue
        got = np.frombuffer(proc.stdout.read(4 * n), dtype=np.float32)
        if got.size != n:
            print(f"FAIL {path}: tensor {t.name}: helper gave {got.size} of {n} values")
            ok = False
            break
        if qt in (Q.F32,):
            want = np.asarray(t.data, dtype=np.float32).reshape(-1)
        elif qt == Q.F16:
            want = np.asarray(t.data).reshape(-1).astype(np.float32)
        else:
            want = gguf.quants.dequantize(t.data, qt).reshape(-1).astype(np.float32, copy=False)
        eq, i = same(got, want)
        if not eq:
            print(f"FAIL {path}: tensor {t.name} ({qt.name}): value {i}: ftune {got[i]!r} "
                  f"(0x{got.view(np.uint32)[i]:08x}), gguf-py {want[i]!r} (0x{want.view(np.uint32)[i]:08x})")
            ok = False
        seen.setdefault(qt.name, [0, 0])
        seen[qt.name][0] += 1
        seen[qt.name][1] += n
    rest = proc.stdout.read()
    err = proc.stderr.read().decode()
    rc = proc.wait()
    if rc != 0 or rest:
        print(f"FAIL {path}: helper_dequant exit {rc}, {len(rest)} bytes left over: {err[-500:]}")
        ok = False
    # the helper's own list must agree on which tensors ftune computes with
    mine = {l.split()[0]: l.split()[2] for l in err.splitlines() if len(l.split()) == 3}
    for t in r.tensors:
        want = "computed" if Q(t.tensor_type) in F16_FIELDS else "skipped"
        if mine.get(t.name) != want:
            print(f"FAIL {path}: tensor {t.name} ({Q(t.tensor_type).name}): ftune says {mine.get(t.name)}, expected {want}")
            ok = False
    if types_wanted:
        for tn in types_wanted:
            if tn not in seen:
                print(f"FAIL {path}: no tensor of type {tn} was compared")
                ok = False
    for tn, (k, n) in sorted(seen.items()):
        if ok:
            print(f"PASS {path.split('/')[-1]}: {tn}: {k} tensor(s), {n} values equal to gguf-py's")
    if skipped:
        print(f"# not compared (types ftune does not compute with): {', '.join(skipped[:5])}")
    return ok


if __name__ == "__main__":
    if sys.argv[1] == "synth":
        synth(sys.argv[2])
    elif sys.argv[1] == "check":
        types = []
        if len(sys.argv) > 4 and sys.argv[4] == "--types":
            types = sys.argv[5].split(",")
        sys.exit(0 if check(sys.argv[2], sys.argv[3], types) else 1)
    else:
        sys.exit("usage: gguf_dequant.py synth OUT | check HELPER FILE [--types T,...]")
