#!/usr/bin/python3
"""ref_train.py — an independent PyTorch trainer that replays an `ftune train`
run from the batches it dumped, for the end-to-end training test
(tests/cli_train_ref.sh) to compare losses and final weights with.

  ref_train.py train --model HF_DIR --batches DUMP.jsonl -o OUT_DIR
      (--init-adapter PEFT_DIR | --full) [--lr 2e-4] [--weight-decay 0]
      [--beta1 0.9] [--beta2 0.999] [--adam-eps 1e-8] [--max-grad-norm 1]
      [--schedule cosine|linear|constant] [--warmup 0] [--min-lr 0]
      [--steps N] [--dtype float64|float32] [-t THREADS (default 1)]
  ref_train.py compare --ours FTUNE_OUT --ref REF_OUT [--floor-frac 1e-2]
      [--tensors NAME,...] [--loss-tol T] [--tensor-tol T]

train: the optimizer flags mean what they mean to `ftune train`. The math is
written out here, not taken from the C code:
  - forward: ref_grad.forward_loss_sum (ref_llama's Llama with per-row
    position ids, a document mask for packed rows, and PEFT's LoRA
    y = x Wᵀ + b + s·(x Aᵀ) Bᵀ, s = alpha/r or alpha/√r with rsLoRA; no
    dropout). r, alpha and rsLoRA come from the initial adapter's
    adapter_config.json; the trained modules are the ones it has tensors for.
  - one optimizer step = the micro-batches of DUMP with the same "step", each
    adding the gradient of (its summed cross-entropy) / n_targets_total, so the
    step's gradient is that of the mean loss over all its target tokens;
  - then the Hugging Face Trainer's order: torch.nn.utils.clip_grad_norm_,
    torch.optim.AdamW.step(), LambdaLR.step() with the factor functions of
    transformers' get_{constant,linear,cosine}_schedule_with_warmup (the first
    update uses factor 0 when there is warmup); min_lr lifts the decaying
    factor f to f·(1 - min_lr/lr) + min_lr/lr, as
    get_cosine_with_min_lr_schedule_with_warmup does;
  - weight decay: every LoRA A/B decays; in full mode every matrix decays and
    1-D tensors (RMSNorm weights, biases) do not, as the HF Trainer excludes
    norms and biases (--decay-all decays them too);
  - full mode trains every weight, the embedding included; a tied head stays
    the embedding (one tensor receiving both gradients).
Writes OUT_DIR/metrics.jsonl in ftune's format ({"step", "loss", "lr",
"grad_norm"} per optimizer step; loss is the step's mean loss) and the final
adapter (adapter_config.json + adapter_model.safetensors, F32) or, with
--full, model.safetensors (F32, Hugging Face names) + config.json.

compare: prints one JSON line with the max relative error of the per-step
losses, learning rates and pre-clip gradient norms of ours against the
reference (--loss-tol bounds all three) and, per tensor
present in the reference's output, max_i |a_i - b_i| / max(|b_i|,
floor_frac · max_j |b_j|); exits 1 if a given tolerance is exceeded or a
tensor or step is missing.
"""
import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_grad  # noqa: E402
import ref_llama as R  # noqa: E402


# -------------------------------------------------------------------- batches

def read_batches(path):
    """The dumped micro-batches grouped by optimizer step, in file order:
    [(step, [micro-batch dict with (B, T) int64 tensors, n_targets_total])]."""
    steps = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                B, T = int(d["B"]), int(d["T"])
                mb = {k: torch.tensor(d[k], dtype=torch.long).reshape(B, T)
                      for k in ("tokens", "targets", "pos", "doc")}
                mb["n_targets_total"] = int(d["n_targets_total"])
                mb["micro"] = int(d.get("micro", 0))
                step = int(d["step"])
            except (KeyError, ValueError, TypeError, RuntimeError) as e:
                sys.exit(f"{path}:{lineno}: bad micro-batch record: {e}")
            if not steps or steps[-1][0] != step:
                steps.append((step, []))
            steps[-1][1].append(mb)
    if not steps:
        sys.exit(f"{path}: no micro-batches")
    for step, mbs in steps:
        totals = {mb["n_targets_total"] for mb in mbs}
        counted = sum(int((mb["targets"] != -1).sum()) for mb in mbs)
        if totals != {counted}:
            sys.exit(f"{path}: step {step}: n_targets_total {sorted(totals)} but the micro-batches "
                     f"hold {counted} targets")
    return steps


# -------------------------------------------------------------------- schedule

def lr_lambda(kind, warmup, total, min_lr_rate):
    """transformers' schedule factors (optimization.py), with a floor."""
    def f(step):
        if step < warmup:
            return float(step) / float(max(1, warmup))
        if kind == "constant":
            return 1.0
        span = float(max(1, total - warmup))
        if step >= total:
            g = 0.0
        elif kind == "linear":
            g = max(0.0, float(total - step) / span)
        else:
            g = 0.5 * (1.0 + math.cos(math.pi * float(step - warmup) / span))
        return max(0.0, g * (1.0 - min_lr_rate) + min_lr_rate)
    return f


# -------------------------------------------------------------------- train

def load_adapter(adir, dtype):
    with open(os.path.join(adir, "adapter_config.json")) as f:
        acfg = json.load(f)
    r, alpha = int(acfg["r"]), float(acfg["lora_alpha"])
    rslora = bool(acfg.get("use_rslora", False))
    scale = alpha / (math.sqrt(r) if rslora else r)
    raw = R.load_safetensors(os.path.join(adir, "adapter_model.safetensors"))
    lora = {k: v.to(dtype).contiguous().requires_grad_(True) for k, (v, _) in raw.items()}
    for k in lora:
        if ".lora_A." not in k and ".lora_B." not in k:
            sys.exit(f"{adir}: {k} is not a LoRA A/B tensor")
    return acfg, lora, scale


def train(a):
    # one thread: these tensors are tiny, and on a busy machine a second
    # thread costs far more in waiting than it saves (measured 15x slower)
    torch.set_num_threads(a.threads)
    dtype = {"float64": torch.float64, "float32": torch.float32}[a.dtype]
    steps = read_batches(a.batches)
    total = a.steps if a.steps else len(steps)
    if a.steps and len(steps) > a.steps:
        sys.exit(f"{a.batches}: {len(steps)} steps dumped, more than --steps {a.steps}")
    model = R.load_model(a.model, dtype, requires_grad=a.full)
    if a.full:
        acfg, lora, scale = None, {}, 0.0
        named = dict(model.params)
        decay = {n: (a.decay_all or t.dim() >= 2) for n, t in named.items()}
    else:
        if not a.init_adapter:
            sys.exit("train: LoRA mode needs --init-adapter (the adapter ftune started from)")
        acfg, lora, scale = load_adapter(a.init_adapter, dtype)
        named = lora
        decay = {n: True for n in named}
    params = list(named.values())
    groups = [{"params": [named[n] for n in named if decay[n]], "weight_decay": a.weight_decay},
              {"params": [named[n] for n in named if not decay[n]], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.adam_eps,
                            weight_decay=a.weight_decay, foreach=False)
    min_rate = a.min_lr / a.lr if a.lr > 0 else 0.0
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(a.schedule, a.warmup, total, min_rate))

    os.makedirs(a.out, exist_ok=True)
    metrics = []
    for step, mbs in steps:
        opt.zero_grad(set_to_none=False)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        loss_sum = 0.0
        n_total = mbs[0]["n_targets_total"]
        for mb in mbs:
            ls = ref_grad.forward_loss_sum(model, lora, scale, mb["tokens"], mb["targets"],
                                           mb["pos"], mb["doc"])
            (ls / n_total).backward()
            loss_sum += ls.item()
        lr_used = opt.param_groups[0]["lr"]
        if a.max_grad_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, a.max_grad_norm))
        else:
            norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))
        opt.step()
        sched.step()
        metrics.append({"step": step, "loss": loss_sum / n_total, "lr": lr_used, "grad_norm": norm})

    with open(os.path.join(a.out, "metrics.jsonl"), "w") as f:
        for m in metrics:
            f.write(json.dumps(m) + "\n")
    if a.full:
        out = []
        for n in R.expected_weight_names(model.cfg):
            if n in model.params:
                data, shape = R.tensor_bytes(model.params[n], "F32")
                out.append((n, "F32", shape, data))
        R.write_safetensors(os.path.join(a.out, "model.safetensors"), out, {"format": "pt"})
        shutil.copyfile(os.path.join(a.model, "config.json"), os.path.join(a.out, "config.json"))
    else:
        out = []
        for n, t in lora.items():
            data, shape = R.tensor_bytes(t, "F32")
            out.append((n, "F32", shape, data))
        R.write_safetensors(os.path.join(a.out, "adapter_model.safetensors"), out, {"format": "pt"})
        with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
            json.dump(acfg, f, indent=2)


# -------------------------------------------------------------------- compare

def read_metrics(path):
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out[int(d["step"])] = d
    return out


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def weights_file(d):
    for name in ("adapter_model.safetensors", "model.safetensors"):
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    sys.exit(f"{d}: neither adapter_model.safetensors nor model.safetensors")


def compare(a):
    ours, ref = read_metrics(os.path.join(a.ours, "metrics.jsonl")), read_metrics(os.path.join(a.ref, "metrics.jsonl"))
    res = {"steps": len(ref), "loss_max_rel": 0.0, "lr_max_rel": 0.0, "grad_norm_max_rel": 0.0,
           "first_loss": None, "last_loss": None, "missing": []}
    for s, r in sorted(ref.items()):
        o = ours.get(s)
        if o is None:
            res["missing"].append(f"step {s}")
            continue
        res["loss_max_rel"] = max(res["loss_max_rel"], rel(o["loss"], r["loss"]))
        res["lr_max_rel"] = max(res["lr_max_rel"], abs(o["lr"] - r["lr"]) / max(abs(r["lr"]), 1e-12))
        res["grad_norm_max_rel"] = max(res["grad_norm_max_rel"], rel(o["grad_norm"], r["grad_norm"]))
    if ref:
        res["first_loss"], res["last_loss"] = ref[min(ref)]["loss"], ref[max(ref)]["loss"]
    ot = {k: v for k, (v, _) in R.load_safetensors(weights_file(a.ours)).items()}
    rt = {k: v for k, (v, _) in R.load_safetensors(weights_file(a.ref)).items()}
    names = a.tensors.split(",") if a.tensors else list(rt)
    worst, worst_name = 0.0, None
    for n in names:
        if n not in rt or n not in ot or list(ot[n].shape) != list(rt[n].shape):
            res["missing"].append(n)
            continue
        o, r = ot[n].double(), rt[n].double()
        floor = max(a.floor_frac * float(r.abs().max()), 1e-30)
        e = float(((o - r).abs() / r.abs().clamp(min=floor)).max())
        if math.isnan(e) or e > worst:
            worst, worst_name = (math.inf if math.isnan(e) else e), n
    res["tensors"] = len(names)
    res["tensor_max_rel"], res["worst_tensor"] = worst, worst_name
    if a.init:  # how far training moved the tensors, relative to their size
        it = {k: v for k, (v, _) in R.load_safetensors(weights_file(a.init)).items()}
        res["moved_max_rel"] = max(float((rt[n].double() - it[n].double()).abs().max()) /
                                   max(float(rt[n].double().abs().max()), 1e-30) for n in names if n in it)
    print(json.dumps(res))
    ok = not res["missing"]
    if a.loss_tol is not None:
        ok = ok and max(res["loss_max_rel"], res["lr_max_rel"], res["grad_norm_max_rel"]) <= a.loss_tol
    if a.tensor_tol is not None:
        ok = ok and res["tensor_max_rel"] <= a.tensor_tol
    sys.exit(0 if ok else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--model", "-m", required=True)
    t.add_argument("--batches", required=True)
    t.add_argument("--out", "-o", required=True)
    t.add_argument("--init-adapter")
    t.add_argument("--full", action="store_true")
    t.add_argument("--decay-all", action="store_true")
    t.add_argument("--lr", type=float, default=2e-4)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--beta1", type=float, default=0.9)
    t.add_argument("--beta2", type=float, default=0.999)
    t.add_argument("--adam-eps", type=float, default=1e-8)
    t.add_argument("--max-grad-norm", type=float, default=1.0)
    t.add_argument("--schedule", choices=("cosine", "linear", "constant"), default="cosine")
    t.add_argument("--warmup", type=int, default=0)
    t.add_argument("--min-lr", type=float, default=0.0)
    t.add_argument("--steps", type=int, default=0)
    t.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    t.add_argument("--threads", "-t", type=int, default=1)
    c = sub.add_parser("compare")
    c.add_argument("--ours", required=True)
    c.add_argument("--ref", required=True)
    c.add_argument("--init", help="initial weights dir, to report how far training moved them")
    c.add_argument("--tensors")
    c.add_argument("--floor-frac", type=float, default=1e-2)
    c.add_argument("--loss-tol", type=float)
    c.add_argument("--tensor-tol", type=float)
    a = ap.parse_args()
    train(a) if a.cmd == "train" else compare(a)


if __name__ == "__main__":
    main()
