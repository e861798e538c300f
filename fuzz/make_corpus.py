#!/usr/bin/env python3
"""Writes the small seed corpus for the GGUF and safetensors fuzzers into
fuzz/corpus/{gguf,safetensors}/. Every seed is a valid file under 4 KB, so the
fuzzer starts from inputs that reach deep into the parsers."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def gstr(s):
    b = s.encode()
    return struct.pack('<Q', len(b)) + b


def gkv(key, typ, payload):
    return gstr(key) + struct.pack('<I', typ) + payload


def garr(et, items_bytes, n):
    return struct.pack('<IQ', et, n) + items_bytes


def gguf(version, kvs, tensors, align=32):
    """tensors: (name, ne list, ggml type, data bytes)"""
    out = b'GGUF' + struct.pack('<IQQ', version, len(tensors), len(kvs)) + b''.join(kvs)
    off, blobs = 0, []
    for name, ne, typ, data in tensors:
        out += gstr(name) + struct.pack('<I', len(ne)) + b''.join(struct.pack('<Q', x) for x in ne)
        out += struct.pack('<IQ', typ, off)
        pad = (-len(data)) % align
        blobs.append(data + b'\0' * pad)
        off += len(data) + pad
    out += b'\0' * ((-len(out)) % align)
    return out + b''.join(blobs)


def f32(*xs):
    return b''.join(struct.pack('<f', x) for x in xs)


def safetensors(tensors, meta=None):
    """tensors: (name, dtype, shape, data bytes)"""
    hdr, off, buf = {}, 0, b''
    if meta is not None:
        hdr['__metadata__'] = meta
    for name, dt, shape, data in tensors:
        hdr[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + len(data)]}
        off += len(data)
        buf += data
    h = json.dumps(hdr, separators=(',', ':')).encode()
    h += b' ' * ((-(8 + len(h))) % 8)
    return struct.pack('<Q', len(h)) + h + buf


def main():
    seeds = {}
    kvs = [
        gkv('general.architecture', 8, gstr('llama')),
        gkv('llama.block_count', 4, struct.pack('<I', 2)),
        gkv('llama.rope.freq_base', 6, f32(10000.0)),
        gkv('some.flag', 7, b'\x01'),
        gkv('some.i64', 11, struct.pack('<q', -5)),
        gkv('some.f64', 12, struct.pack('<d', 0.5)),
        gkv('some.u16', 2, struct.pack('<H', 7)),
        gkv('tokenizer.ggml.tokens', 9, garr(8, gstr('<s>') + gstr('</s>') + gstr('a'), 3)),
        gkv('tokenizer.ggml.scores', 9, garr(6, f32(0, -1, -2), 3)),
    ]
    q8 = struct.pack('<e', 0.5) + bytes(range(32))
    seeds['gguf/model_v3.gguf'] = gguf(3, kvs, [
        ('tok_embd.weight', [4, 3], 0, f32(*range(12))),
        ('blk.0.attn_q.weight', [32, 1], 8, q8),
        ('blk.0.norm', [4], 1, struct.pack('<4e', 1, 1, 1, 1)),
        ('bf', [2, 1, 1, 2], 30, b'\x80\x3f' * 4),
    ])
    seeds['gguf/vocab_v2.gguf'] = gguf(2, kvs[:1] + kvs[7:], [])
    nested = garr(9, garr(4, struct.pack('<II', 1, 2), 2) + garr(8, gstr('x'), 1), 2)
    seeds['gguf/nested_align64.gguf'] = gguf(3, [gkv('general.alignment', 4, struct.pack('<I', 64)),
                                                 gkv('nested', 9, nested)],
                                             [('a', [16], 0, f32(*range(16))), ('b', [2], 0, f32(1, 2))], align=64)
    seeds['safetensors/model.safetensors'] = safetensors([
        ('model.embed_tokens.weight', 'F32', [3, 2], f32(*range(6))),
        ('model.norm.weight', 'BF16', [2], b'\x80\x3f' * 2),
        ('ids', 'I64', [2], struct.pack('<qq', 1, 2)),
        ('mask', 'BOOL', [3], b'\x01\x00\x01'),
        ('h', 'F16', [1, 1], struct.pack('<e', 2.0)),
    ], {'format': 'pt'})
    seeds['safetensors/empty.safetensors'] = safetensors([])
    seeds['safetensors/scalar_f8.safetensors'] = safetensors([
        ('s', 'F64', [], struct.pack('<d', 1.0)),
        ('f8', 'F8_E4M3', [4], b'\x38\x40\x48\x00'),
        ('z', 'F32', [0, 5], b''),
    ], {'format': 'pt', 'note': 'seed'})
    for rel, data in seeds.items():
        assert len(data) < 4096, rel
        path = os.path.join(HERE, 'corpus', rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'wb') as f:
            f.write(data)


if __name__ == '__main__':
    main()
