"""eco_peft.py — ftune's models and adapters in transformers + PEFT, and PEFT's
adapters in ftune, compared by their logits. Run with .venv/bin/python
(scripts/setup.sh) by tests/cli_eco_peft.sh.

  eco_peft.py --ftune build/ftune --helper build/tests/helper_eco --work DIR

The ftune side is helper_eco (the library's session forward, fp32, all
positions' logits); the reference side is transformers' model classes
(AutoModelForCausalLM: the config.json must name the architecture)
computing in float64, with PEFT's PeftModel for adapters. Models: stories260K
(Llama, tied head), the Qwen2-shaped fixture (q/k/v biases, untied head, BF16
shards) and the Llama 3-shaped one (llama3 RoPE scaling, F16), both written by
make_fixture.py. PEFT's other adapter options (regex or all-linear targets,
layers_to_transform, bfloat16) load with PEFT's logits; the ones ftune does
not implement (rank/alpha patterns, biases, DoRA, modules_to_save, lm_head)
are refused with a message naming them. Prints PASS/FAIL lines with the max relative error; exits 1
if any failed.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import numpy as np
import torch

from transformers import AutoModelForCausalLM  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.disable_progress_bar()

HERE = os.path.dirname(os.path.abspath(__file__))

# Max |ftune - reference| / max |reference| over all logits of all sequences:
# ftune computes in float32 and transformers here in float64, so this is
# float32 rounding through the layers, as for scripts/ref_llama.py in
# tests/test_forward.c (1e-4 there, measured 1e-5..6e-5).
TOL = 1e-4
# An adapter must move the logits by far more than TOL, or the comparison
# would not show that it was applied: relative to max |logit|.
MIN_MOVED = 100 * TOL

failed = []


def report(name, ok, msg):
    print(("PASS " if ok else "FAIL ") + name + ": " + msg)
    if not ok:
        failed.append(name)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
    return r.stdout


def read_logits(path):
    b = open(path, "rb").read()
    n, = struct.unpack_from("<i", b, 0)
    off, out = 4, []
    for _ in range(n):
        T, V = struct.unpack_from("<ii", b, off)
        off += 8
        out.append(np.frombuffer(b, dtype="<f4", count=T * V, offset=off).reshape(T, V))
        off += 4 * T * V
    return out


class Eco:
    def __init__(self, ftune, helper, work):
        self.ftune, self.helper, self.work = ftune, helper, work
        self.n = 0

    def ftune_logits(self, model, adapter, seqs):
        self.n += 1
        out = os.path.join(self.work, f"logits{self.n}.bin")
        run([self.helper, "logits", model, adapter or "-", ";".join(",".join(map(str, s)) for s in seqs), out])
        return read_logits(out)


def hf_model(path):
    m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float64, attn_implementation="eager",
                                             local_files_only=True)
    return m.eval()


def hf_logits(model, seqs):
    with torch.no_grad():
        return [model(torch.tensor([s])).logits[0].double().numpy() for s in seqs]


def rel_err(a, b):
    mx = max(np.abs(y).max() for y in b)
    return max(np.abs(x.astype(np.float64) - y).max() for x, y in zip(a, b)) / mx


def compare(name, got, want, base=None, what="the adapter"):
    """got (ftune) against want (reference); base: the reference without the
    adapter (or before training), to show that it matters."""
    try:
        e = rel_err(got, want)
        msg = f"max rel err {e:.3g} (tolerance {TOL:g})"
        ok = e <= TOL
        if base is not None:
            moved = rel_err(want, base)
            msg += f"; {what} moves the logits by {moved:.3g}"
            ok = ok and moved >= MIN_MOVED
        report(name, ok, msg)
    except Exception as ex:  # shapes differ, ...
        report(name, False, f"{type(ex).__name__}: {ex}")


def check(name, fn):
    """Runs one comparison; an exception (a file transformers or PEFT rejects,
    an ftune error) is that comparison's FAIL with the message."""
    try:
        fn()
    except Exception as ex:
        report(name, False, f"{type(ex).__name__}: {str(ex)[-2000:]}")


def peft_adapter(base_dir, out, targets, r, alpha, rslora, seed, dtype=torch.float32, **extra):
    """An adapter written by PEFT itself on a float32 base (as users make them:
    float32 tensors; dtype bfloat16 gives bfloat16 ones), with PEFT's random
    init for both A and B (init_lora_weights=False: B is not zero, so the
    adapter changes the output). extra: more LoraConfig fields."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=dtype, local_files_only=True)
    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, use_rslora=rslora,
                     init_lora_weights=False, lora_dropout=0.0, task_type="CAUSAL_LM", **extra)
    pm = get_peft_model(model, cfg)
    for n, p in pm.named_parameters():  # trainable biases and module copies: make them matter too
        if p.requires_grad and (n.endswith(".bias") or "modules_to_save" in n):
            torch.nn.init.normal_(p, std=0.1)
    pm.save_pretrained(out)


def seqs_for(vocab, bos, seed):
    rng = np.random.default_rng(seed)
    return [[bos] + rng.integers(3, vocab, size=n).tolist() for n in (11, 6)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ftune", required=True)
    ap.add_argument("--helper", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    w = a.work
    eco = Eco(a.ftune, a.helper, w)
    data = os.environ.get("FTUNE_DATA") or os.path.join(HERE, "..", "..", "shared", "data")
    stories = os.path.join(data, "models", "stories260K-hf")
    text = os.path.join(w, "train.txt")
    with open(os.path.join(data, "text", "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
        open(text, "w", encoding="utf-8").write(f.read(20000))
    fixtures = {}
    for kind in ("qwen2", "llama3"):
        fixtures[kind] = os.path.join(w, kind)
        run(["/usr/bin/python3", os.path.join(HERE, "make_fixture.py"), "--kind", kind, "--out", fixtures[kind]])
    models = {"stories260K": (stories, 512, 1), "qwen2": (fixtures["qwen2"], 50257, 50256),
              "llama3": (fixtures["llama3"], 50257, 50256)}

    # 1. each base model: transformers' logits = ftune's
    ref = {}
    for name, (path, vocab, bos) in models.items():
        def base(name=name, path=path, vocab=vocab, bos=bos):
            seqs = seqs_for(vocab, bos, 1)
            ref[name] = (hf_model(path), seqs)
            ref[name] = ref[name] + (hf_logits(ref[name][0], seqs),)
            compare(f"transformers_{name}_base", eco.ftune_logits(path, None, seqs), ref[name][2])
        check(f"transformers_{name}_base", base)

    # 2. adapters ftune trained (rsLoRA, a subset of targets; trained, so B != 0) in PEFT
    trained = {"stories260K": ("q,v,down", 8), "qwen2": ("k,o,gate", 4)}
    for name, (targets, r) in trained.items():
        def lora(name=name, targets=targets, r=r):
            path = models[name][0]
            out = os.path.join(w, f"lora-{name}")
            run([a.ftune, "train", "-m", path, "--data", text, "-o", out, "--ctx", "32", "--steps", "6",
                 "--lr", "2e-2", "--lora-r", str(r), "--lora-alpha", "16", "--rslora", "--lora-targets", targets,
                 "--val-split", "0", "--lora-dropout", "0", "-t", "1", "--quiet", "--seed", "3"])
            model, seqs, base_logits = ref[name]
            pm = PeftModel.from_pretrained(model, out).double().eval()
            want = hf_logits(pm, seqs)
            compare(f"peft_loads_ftune_lora_{name}", eco.ftune_logits(path, out, seqs), want, base_logits)
            pm.unload()  # leaves the base model without LoRA layers for the next user
        check(f"peft_loads_ftune_lora_{name}", lora)

    # 3. a merged model (ftune merge) in transformers. Merged in f32, its logits
    # are base + adapter's; merged in the base's dtype (BF16 for qwen2), the
    # weights are rounded, so transformers and ftune are compared on that file.
    for name in trained:
        def merged(name=name):
            path, lora = models[name][0], os.path.join(w, f"lora-{name}")
            out = os.path.join(w, f"merged-{name}")
            run([a.ftune, "merge", "-m", path, "--adapter", lora, "-o", out, "--dtype", "f32"])
            seqs = ref[name][1]
            want = hf_logits(hf_model(out), seqs)
            compare(f"transformers_ftune_merged_{name}", eco.ftune_logits(path, lora, seqs), want, ref[name][2])
        check(f"transformers_ftune_merged_{name}", merged)

    def merged_bf16():
        path, lora = models["qwen2"][0], os.path.join(w, "lora-qwen2")
        out = os.path.join(w, "merged-qwen2-bf16")
        run([a.ftune, "merge", "-m", path, "--adapter", lora, "-o", out])
        seqs = ref["qwen2"][1]
        model = hf_model(out)
        dtypes = {str(p.dtype) for p in AutoModelForCausalLM.from_pretrained(out, torch_dtype="auto", local_files_only=True).parameters()}
        if dtypes != {"torch.bfloat16"}:
            raise RuntimeError(f"ftune merge of a BF16 base wrote {dtypes}, expected BF16")
        compare("transformers_ftune_merged_qwen2_bf16", eco.ftune_logits(out, None, seqs), hf_logits(model, seqs))
    check("transformers_ftune_merged_qwen2_bf16", merged_bf16)

    # 4. a full fine-tune (ftune train --full) in transformers
    for name in ("stories260K", "qwen2"):
        def full(name=name):
            path = models[name][0]
            out = os.path.join(w, f"full-{name}")
            run([a.ftune, "train", "-m", path, "--data", text, "-o", out, "--ctx", "32", "--steps", "3",
                 "--lr", "1e-2", "--full", "--val-split", "0", "-t", "1", "--quiet", "--seed", "3"])
            seqs = ref[name][1]
            want = hf_logits(hf_model(out), seqs)
            compare(f"transformers_ftune_full_{name}", eco.ftune_logits(out, None, seqs), want, ref[name][2],
                    what="training")
        check(f"transformers_ftune_full_{name}", full)

    # 5. adapters PEFT wrote (random init, rsLoRA or not, subsets of targets) in ftune
    peft_cases = [
        ("stories260K", ["q_proj", "k_proj", "up_proj"], 4, 8, True),
        ("qwen2", ["q_proj", "v_proj", "o_proj", "down_proj"], 8, 16, True),
        ("llama3", ["k_proj", "gate_proj", "up_proj", "down_proj"], 2, 4, False),
    ]
    for name, targets, r, alpha, rslora in peft_cases:
        def from_peft(name=name, targets=targets, r=r, alpha=alpha, rslora=rslora):
            path = models[name][0]
            out = os.path.join(w, f"peft-{name}")
            peft_adapter(path, out, targets, r, alpha, rslora, seed=7)
            model, seqs, base_logits = ref[name]
            pm = PeftModel.from_pretrained(model, out).double().eval()
            want = hf_logits(pm, seqs)
            compare(f"ftune_loads_peft_lora_{name}", eco.ftune_logits(path, out, seqs), want, base_logits)
            pm.unload()
        check(f"ftune_loads_peft_lora_{name}", from_peft)

    # 6. more of PEFT's ways to write an adapter, on stories260K: each gives PEFT's logits
    variants = {
        "regex_targets": dict(targets=r".*\.(q_proj|down_proj)"),
        "all_linear": dict(targets="all-linear"),
        "layers_to_transform": dict(targets=["q_proj", "v_proj"], layers_to_transform=[0, 2]),
        "bf16": dict(targets=["q_proj", "o_proj"], dtype=torch.bfloat16),
    }
    for vname, kw in variants.items():
        def variant(vname=vname, kw=kw):
            out = os.path.join(w, f"peft-{vname}")
            peft_adapter(stories, out, r=4, alpha=8, rslora=False, seed=11, **kw)
            model, seqs, base_logits = ref["stories260K"]
            pm = PeftModel.from_pretrained(model, out).double().eval()
            want = hf_logits(pm, seqs)
            compare(f"ftune_loads_peft_{vname}", eco.ftune_logits(stories, out, seqs), want, base_logits)
            pm.unload()
        check(f"ftune_loads_peft_{vname}", variant)

    # 7. what ftune does not implement is refused by `ftune eval --adapter` with a
    # message naming the setting, never applied wrongly
    refused = {
        "rank_pattern": (dict(targets=["q_proj", "v_proj"], rank_pattern={"v_proj": 2}), "rank_pattern"),
        "alpha_pattern": (dict(targets=["q_proj", "v_proj"], alpha_pattern={"v_proj": 3.0}), "alpha_pattern"),
        "bias": (dict(targets=["q_proj", "v_proj"], bias="lora_only"), "bias"),
        "dora": (dict(targets=["q_proj", "v_proj"], use_dora=True), "use_dora"),
        "modules_to_save": (dict(targets=["q_proj"], modules_to_save=["lm_head"]), "modules_to_save"),
        "lm_head_target": (dict(targets=["q_proj", "lm_head"]), "lm_head"),
    }
    for vname, (kw, word) in refused.items():
        def refuse(vname=vname, kw=kw, word=word):
            out = os.path.join(w, f"peft-refused-{vname}")
            peft_adapter(stories, out, r=4, alpha=8, rslora=False, seed=11, **kw)
            r = subprocess.run([a.ftune, "eval", "-m", stories, "--adapter", out, "--text", text, "-t", "1"],
                               capture_output=True, text=True)
            msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
            report(f"ftune_refuses_peft_{vname}", r.returncode != 0 and word in msg and "adapter_config.json" in msg,
                   f"exit {r.returncode}: {msg}")
        check(f"ftune_refuses_peft_{vname}", refuse)

    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
