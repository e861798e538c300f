#!/usr/bin/python3
"""ref_optim.py — reference trajectories of torch.optim.AdamW with
torch.nn.utils.clip_grad_norm_ and a warmup learning-rate schedule, for the C
optimizer's test to replay.

  ref_optim.py --out FILE [--seed N]

Each scenario runs the Hugging Face Trainer's order on random tensors:
clip_grad_norm_, optimizer.step(), scheduler.step(). The schedules are
LambdaLR with the factor functions of transformers' get_constant/linear/
cosine_schedule_with_warmup (transformers/optimization.py), written out here
because transformers is not installed; the cosine one takes a min_lr_rate as
get_cosine_with_min_lr_schedule_with_warmup does.

FILE (little-endian): b"FTOPT001", int32 n_scenarios, then per scenario:
int32 kind (0 constant, 1 linear, 2 cosine), warmup, total, n_steps, n_params;
float64 lr, min_lr, beta1, beta2, eps, weight_decay, max_norm; per parameter
int32 numel, int32 decay, float32[numel] initial values; per step float64
lr used, float64 pre-clip grad norm, then per parameter float32[numel] grad
(before clipping) and float32[numel] value after the step.
"""
import argparse
import math
import struct

import torch


def lr_lambda(kind, warmup, total, min_lr_rate):
    def f(step):
        if step < warmup:
            return float(step) / float(max(1, warmup))
        if kind == 0:
            return 1.0
        if kind == 1:
            return max(0.0, float(total - step) / float(max(1, total - warmup)))
        progress = float(step - warmup) / float(max(1, total - warmup))
        factor = 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress))
        factor = factor * (1 - min_lr_rate) + min_lr_rate
        return max(0.0, factor)
    return f


def scenario(out, gen, kind, warmup, total, n_steps, lr, min_lr, betas, eps, wd, max_norm, shapes):
    params = []
    for shape, decay in shapes:
        params.append((torch.randn(*shape, generator=gen, dtype=torch.float32).requires_grad_(True), decay))
    out.append(struct.pack("<5i", kind, warmup, total, n_steps, len(params)))
    out.append(struct.pack("<7d", lr, min_lr, betas[0], betas[1], eps, wd, max_norm))
    for p, decay in params:
        out.append(struct.pack("<2i", p.numel(), int(decay)))
        out.append(p.detach().numpy().astype("<f4").tobytes())
    groups = [{"params": [p for p, d in params if d], "weight_decay": wd},
              {"params": [p for p, d in params if not d], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    opt = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(kind, warmup, total, min_lr / lr))
    for step in range(n_steps):
        # alternate large and small gradients so that some steps clip and some do not
        scale = 3.0 if step % 3 != 2 else 0.01
        grads = [torch.randn(p.shape, generator=gen, dtype=torch.float32) * scale for p, _ in params]
        for (p, _), g in zip(params, grads):
            p.grad = g.clone()
        used_lr = opt.param_groups[0]["lr"]
        if max_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_([p for p, _ in params], max_norm)
        else:  # measure only (clip_grad_norm_ with 0 would zero the grads)
            norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
        opt.step()
        sched.step()
        out.append(struct.pack("<2d", used_lr, float(norm)))
        for (p, _), g in zip(params, grads):
            out.append(g.numpy().astype("<f4").tobytes())
            out.append(p.detach().numpy().astype("<f4").tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(args.seed)
    shapes = [((4, 37), True), ((37,), False), ((8, 5), True)]
    out = [b"FTOPT001", struct.pack("<i", 3)]
    # cosine with warmup and a floor, clipping, decoupled decay on two of three tensors
    scenario(out, gen, 2, 3, 10, 10, 1e-2, 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0, shapes)
    # linear decay reaching 0 before the last steps
    scenario(out, gen, 1, 2, 8, 10, 3e-3, 0.0, (0.9, 0.999), 1e-8, 0.01, 2.0, shapes)
    # constant after warmup, no decay, no clipping
    scenario(out, gen, 0, 1, 10, 6, 5e-3, 0.0, (0.8, 0.99), 1e-6, 0.0, 0.0, shapes)
    with open(args.out, "wb") as f:
        f.write(b"".join(out))


if __name__ == "__main__":
    main()
