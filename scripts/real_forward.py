"""real_forward.py — ftune's f32 forward pass on a real quantized GGUF model
against transformers' own GGUF loader (AutoModelForCausalLM.from_pretrained(
dir, gguf_file=name), which dequantizes every tensor with gguf-py), in
float32 with its Linear layers on oneDNN (torch.utils.mkldnn): this torch's
BLAS is the generic one, at ~1 GFLOP/s on a shared core in float64 (Qwen2.5
took minutes), oneDNN ~4x that; the float32 reference is within 4e-6 of the
float64 one by the measure below (measured on SmolLM2, 42 positions).
Run with .venv/bin/python by tests/cli_real_forward.sh.

  real_forward.py --helper build/tests/helper_eco --ftune build/ftune --work DIR MODEL.gguf...

Both sides compute with the same dequantized weights (ftune widens each block
to f32 inside its products; cli_gguf_dequant checks that its values are
gguf-py's), so what is left is rounding. On four short prompts (plain text,
code, the shortest GSM8K test question, a conversation through the file's
chat template) it checks:
- greedy: ftune's 32 greedy tokens after each prompt (helper_eco greedy: the
  prompt in one pass, then one token at a time with the KV cache, as `ftune
  generate`; not stopping at an end token) are transformers' greedy tokens.
  transformers runs once over prompt + ftune's 32 tokens, and at every
  position its argmax must be ftune's next token: by induction that is
  exactly what its own greedy decoding would produce, in one pass instead
  of 32;
- logits: ftune's (helper_eco logits, one batched pass) over the same
  prompt + continuation, every position, by the max relative error below;
- `ftune generate --temp 0 -n 32` prints each plain prompt and the greedy
  continuation up to its first end-of-generation token.
Prints PASS/FAIL lines with the measured errors; exits 1 if any failed.

transformers' generate() is not used: on Debian's torch 1.13 with Python
3.11 it raises ValueError (its is_fsdp_managed_module imports
torch.distributed.fsdp, whose torch.distributed._shard declares a dataclass
field with a mutable default, which 3.11 refuses), and the check above is
equivalent. The model's forward imports nothing of torch.distributed.
A file without output.weight (SmolLM2 ties the LM head to the embedding)
loads with lm_head missing and randomly initialised unless the config says
the embeddings are tied (transformers' GGUF config sets it false for llama);
the loader's missing keys say so, and lm_head is then tied to the embedding
as the file means.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np
import torch
from torch.utils import mkldnn

import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

HERE = os.path.dirname(os.path.abspath(__file__))

# Max relative error: for each position, max over the vocabulary of
# |ftune - reference| divided by max |reference| at that position, then the
# max over positions and prompts. Each row is scaled by its own largest logit
# because a logit near zero has no useful relative error of its own, and
# positions differ in scale; the row's largest logit is what decides softmax
# and argmax. Both compute in float32 (each ~4e-6 from a float64 forward),
# so this is float32 rounding through 24-30 layers, twice: 1e-4 as for the
# small models in cli_eco_peft and test_forward (measured there
# 1e-6..6e-5, float32 against float64). The smallest
# top-1 minus top-2 gap of the reference's logits along the continuations is
# printed with it: the rounding is far below it, so the argmax cannot flip.
TOL = 1e-4
N_GREEDY = 32

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]


def data_dir():
    return os.environ.get("FTUNE_DATA") or os.path.join(HERE, "..", "..", "shared", "data")


def gsm8k_question():
    """the shortest question of the test split (a short context)"""
    with open(os.path.join(data_dir(), "text", "gsm8k", "test.jsonl"), encoding="utf-8") as f:
        return min((json.loads(line)["question"] for line in f if line.strip()), key=len)


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


def load_reference(path):
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model, info = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32,
                                                       output_loading_info=True)
    missing = set(info["missing_keys"])
    if missing == {"lm_head.weight"}:  # no output.weight in the file: tied (see the docstring)
        model.lm_head.weight = model.model.embed_tokens.weight
    elif missing:
        raise RuntimeError(f"{path}: transformers did not load {sorted(missing)}")
    return tok, mkldnn.to_mkldnn(model.eval())  # the same weights, the products on oneDNN


def seq_arg(seqs):
    return ";".join(",".join(map(str, s)) for s in seqs)


def check_model(path, helper, ftune, work):
    name = os.path.basename(path).split(".")[0].split("-")[0].lower()
    t0 = time.time()
    tok, model = load_reference(path)
    t_load = time.time() - t0
    chat = tok.apply_chat_template([{"role": "user", "content": "What is 7 times 8? Answer with the number only."}],
                                   tokenize=False, add_generation_prompt=True)
    texts = PROMPTS + [gsm8k_question(), chat]
    # the files say no BOS (both models); the ChatML markers of the chat
    # prompt are parsed as special tokens
    seqs = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    ok = True

    # ftune's greedy continuations, then its logits over prompt + continuation
    gpath = os.path.join(work, name + ".greedy.json")
    run([helper, "greedy", path, seq_arg(seqs), str(N_GREEDY), gpath])
    cont = json.load(open(gpath))
    full = [s + c for s, c in zip(seqs, cont)]
    lpath = os.path.join(work, name + ".logits.bin")
    run([helper, "logits", path, "-", seq_arg(full), lpath])
    got = read_logits(lpath)
    t_ftune = time.time() - t0 - t_load

    errs, gaps, bad = [], [], 0
    with torch.no_grad():
        for i, (s, f, g) in enumerate(zip(seqs, full, got)):
            want = model(torch.tensor([f])).logits[0].numpy()
            want = want.astype(np.float64)
            errs.append(float((np.abs(g.astype(np.float64) - want).max(axis=1) / np.abs(want).max(axis=1)).max()))
            # the reference's choice after the prompt and after each of ftune's tokens
            pick = want[len(s) - 1:len(f) - 1]
            ref_next = pick.argmax(axis=1).tolist()
            top2 = np.sort(pick, axis=1)[:, -2:]
            gaps.append(float((top2[:, 1] - top2[:, 0]).min()))
            if ref_next != cont[i]:
                bad += 1
                k = next(j for j in range(N_GREEDY) if ref_next[j] != cont[i][j])
                print(f"  {name} prompt {i}: greedy differs at token {k}: transformers {ref_next[k]} "
                      f"{tok.decode([ref_next[k]])!r}, ftune {cont[i][k]} {tok.decode([cont[i][k]])!r}")
    t_ref = time.time() - t0 - t_load - t_ftune
    e = max(errs)
    n_pos = sum(len(f) for f in full)
    line = (f"real_forward_{name}_logits: max rel err {e:.3g} (tolerance {TOL:g}; per prompt "
            f"{', '.join(f'{x:.2g}' for x in errs)}; {len(full)} prompts + {N_GREEDY} tokens each, {n_pos} positions)")
    print(("PASS " if e <= TOL else "FAIL ") + line)
    ok &= e <= TOL
    if bad:
        print(f"FAIL real_forward_{name}_greedy: {bad} of {len(seqs)} prompts continue differently "
              f"(max rel err {e:.3g})")
        ok = False
    else:
        print(f"PASS real_forward_{name}_greedy ({len(seqs)} prompts x {N_GREEDY} tokens identical; max rel err "
              f"{e:.3g}; smallest top-2 logit gap {min(gaps):.3g})")

    # ftune generate on the plain prompts (-p is text, not special tokens):
    # the prompt, then the continuation up to its first end token
    eog = {i for i in (tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")) if i is not None}
    bad = 0
    for i, t in enumerate(texts[:3]):
        stop = next((j for j, x in enumerate(cont[i]) if x in eog), N_GREEDY)
        want = t + tok.decode(cont[i][:stop]) + "\n"
        got_txt = run([ftune, "generate", "-m", path, "-p", t, "-n", str(N_GREEDY), "--temp", "0", "--quiet",
                       "-t", "2"])
        if got_txt != want:
            bad += 1
            print(f"  {name} generate prompt {i}:\n    want {want!r}\n    got  {got_txt!r}")
    if bad:
        print(f"FAIL real_forward_{name}_generate: {bad} of 3 prompts print differently from the greedy tokens")
        ok = False
    else:
        print(f"PASS real_forward_{name}_generate (ftune generate prints the greedy text of 3 prompts)")
    print(f"  {name}: transformers' loading {t_load:.0f} s, ftune's greedy and logits {t_ftune:.0f} s, "
          f"transformers' forward {t_ref:.0f} s, ftune generate {time.time() - t0 - t_load - t_ftune - t_ref:.0f} s")
    del model
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--helper", required=True)
    ap.add_argument("--ftune", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    torch.set_num_threads(2)
    ok = True
    for m in a.models:
        ok &= check_model(m, a.helper, a.ftune, a.work)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
