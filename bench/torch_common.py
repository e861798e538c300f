"""torch_common.py — what bench/torch_bench.py (inference) and
bench/torch_train_bench.py (training) share: the preset shapes, the thread
settings that must be in the environment before torch starts its pools, and
the RoPE tables (rotate-half layout). Import it before torch.
"""
import os

# The shapes of `ftune init --preset` (classifier shared with the embedding, as in
# llama2.c's stories models); ctx is how many positions the RoPE tables hold.
PRESETS = {
    # llama2.c's stories110M shape
    "llama-110m": dict(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, hidden=2048, vocab=32000, ctx=1024),
    "stories260K": dict(dim=64, n_layers=5, n_heads=8, n_kv_heads=4, hidden=172, vocab=512, ctx=512),
    # rope theta 500000 (its llama3 frequency scaling changes no shape or FLOP)
    "llama-3.2-1b": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, hidden=8192, vocab=128256, ctx=4096,
                         theta=500000.0),
}


def set_thread_env(threads, omp_wait):
    """Thread counts must be in the environment before the libraries start their pools."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    os.environ["OMP_WAIT_POLICY"] = omp_wait.upper()


def rope_tables(p, dtype):
    """cos and sin (ctx, HS) of preset p, computed in float64 and rounded to dtype."""
    import torch
    HS = p["dim"] // p["n_heads"]
    inv = 1.0 / p.get("theta", 10000.0) ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS)
    ang = torch.arange(p["ctx"], dtype=torch.float64)[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)
