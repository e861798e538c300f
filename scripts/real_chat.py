"""real_chat.py — ftune's chat rendering of the two real models against the
Jinja template each GGUF carries (tokenizer.chat_template), rendered by
transformers' apply_chat_template (jinja2) on the tokenizer its GGUF loader
builds. Run with .venv/bin/python by tests/cli_real_chat.sh.

  real_chat.py --helper build/tests/helper_eco --ftune build/ftune --work DIR MODEL.gguf...

Conversations with and without a system message (without one, both
templates put their own first: Qwen2.5's "You are Qwen, created by Alibaba
Cloud. ...", SmolLM2's "You are a helpful AI assistant named SmolLM, ..."),
several turns, and contents with newlines, unicode and text that looks like
the markers; with the generation prompt, and without it for conversations
that end with the assistant (training's shape). For each: ftune's ids
(ftune_chat_tokenize with the model's own template, the path train and
generate --chat take) equal the tokenizer's ids of the rendered text
(apply_chat_template(tokenize=True)), and decode to that text
(apply_chat_template(tokenize=False)). Then `ftune generate
--chat` on a question: it prints ftune's greedy reply (helper_eco greedy on
the rendered ids) up to the first <|im_end|>, which must come within the
token budget, so that the stop is what is tested. (cli_real_forward checks
ftune's greedy tokens against transformers'.)
Prints PASS/FAIL lines; exits 1 if any failed.
"""
import argparse
import json
import os
import subprocess
import sys

from transformers import AutoTokenizer
from transformers.utils import logging

logging.set_verbosity_error()

CONVERSATIONS = [
    [{"role": "user", "content": "What is 7 times 8?"}],
    [{"role": "system", "content": "You are a terse math tutor."},
     {"role": "user", "content": "What is 7 times 8?"}],
    [{"role": "user", "content": "Name a prime number."},
     {"role": "assistant", "content": "7"},
     {"role": "user", "content": "Another one, please."}],
    [{"role": "system", "content": "Answer in French.\nBe brief."},
     {"role": "user", "content": "  Where is Łódź?  \n"},
     {"role": "assistant", "content": "En Pologne. 🇵🇱"},
     {"role": "user", "content": "And 東京?\n\n```python\nprint('<|im_end|> is text here')\n```"}],
    [{"role": "user", "content": "Janet's ducks lay 16 eggs per day. How many in a week?"},
     {"role": "assistant", "content": "16 * 7 = <<16*7=112>>112\n#### 112"}],
]
# with add_generation_prompt, and (ending with the assistant) without it
CASES = [(c, True) for c in CONVERSATIONS] + [(c, False) for c in CONVERSATIONS if c[-1]["role"] == "assistant"]
QUESTION = "What is the capital of France? Answer in one word."
BUDGET = 48  # tokens: the reply above ends far sooner (checked, not assumed)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
    return r.stdout


def check_model(path, helper, ftune, work):
    name = os.path.basename(path).split(".")[0].split("-")[0].lower()
    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path))
    ok = True
    want_text = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=g) for c, g in CASES]
    want_ids = [tok.apply_chat_template(c, tokenize=True, add_generation_prompt=g) for c, g in CASES]
    convs = os.path.join(work, name + ".convs.json")
    with open(convs, "w", encoding="utf-8") as f:
        json.dump([{"messages": c, "add_generation_prompt": g} for c, g in CASES], f, ensure_ascii=False)
    out = os.path.join(work, name + ".chat.json")
    run([helper, "chat", path, "-", convs, out])
    got = json.load(open(out, encoding="utf-8"))
    # ftune's ids as text (the reference tokenizer decodes them; it gives
    # each template rendering back from its own ids, checked here)
    got_text = [tok.decode(g, skip_special_tokens=False) for g in got]
    for i in range(len(CASES)):
        if tok.decode(want_ids[i], skip_special_tokens=False) != want_text[i]:
            print(f"FAIL real_chat_{name}_reference: conversation {i}'s ids do not decode to its text")
            return False
    head = "<|im_start|>system\n"
    default = want_text[0][len(head):want_text[0].index("<|im_end|>")] if want_text[0].startswith(head) else None
    print(f"  {name}: the template's default system message: {default!r}")
    bad_text = [i for i in range(len(CASES)) if got_text[i] != want_text[i]]
    bad_ids = [i for i in range(len(CASES)) if got[i] != want_ids[i]]
    for i in bad_text[:3]:
        print(f"  {name} conversation {i}:\n    template {want_text[i]!r}\n    ftune    {got_text[i]!r}")
    for i in bad_ids[:3]:
        print(f"  {name} conversation {i} ids:\n    template {want_ids[i]}\n    ftune    {got[i]}")
    n_sys = sum(c[0]["role"] == "system" for c, _ in CASES)
    what = (f"{len(CASES)} conversations, {n_sys} with a system message and {len(CASES) - n_sys} without, "
            f"{sum(g for _, g in CASES)} with the generation prompt")
    if bad_text:
        print(f"FAIL real_chat_{name}_text: {len(bad_text)} of {len(CASES)} render differently from the template")
        ok = False
    else:
        print(f"PASS real_chat_{name}_text ({what})")
    if bad_ids:
        print(f"FAIL real_chat_{name}_ids: {len(bad_ids)} of {len(CASES)} tokenize differently")
        ok = False
    else:
        print(f"PASS real_chat_{name}_ids ({sum(len(x) for x in want_ids)} tokens)")

    # generate --chat stops at <|im_end|>
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = tok.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=True, add_generation_prompt=True)
    gpath = os.path.join(work, name + ".greedy.json")
    run([helper, "greedy", path, ",".join(map(str, prompt)), str(BUDGET), gpath])
    reply = json.load(open(gpath))[0]
    if im_end not in reply:
        print(f"FAIL real_chat_{name}_generate_stops: no <|im_end|> in {BUDGET} greedy tokens "
              f"({tok.decode(reply)!r}): the stop would not be tested")
        return False
    stop = reply.index(im_end)
    want = tok.decode(reply[:stop]) + "\n"
    printed = run([ftune, "generate", "-m", path, "--chat", "-p", QUESTION, "-n", str(BUDGET), "--temp", "0",
                   "--quiet", "-t", "2"])
    if printed != want:
        print(f"FAIL real_chat_{name}_generate_stops: ftune generate --chat printed {printed!r}, "
              f"the greedy reply up to <|im_end|> (token {stop}) is {want!r}")
        ok = False
    else:
        print(f"PASS real_chat_{name}_generate_stops (the reply {want.strip()!r} ends at <|im_end|>, token {stop} "
              f"of at most {BUDGET})")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--helper", required=True)
    ap.add_argument("--ftune", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    ok = True
    for m in a.models:
        ok &= check_model(m, a.helper, a.ftune, a.work)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
