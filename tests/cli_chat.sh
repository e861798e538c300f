#!/usr/bin/env bash
# Chat on a model's own template: the template a GGUF file
# (tokenizer.chat_template) or a Hugging Face directory (tokenizer_config.json,
# or transformers 5's chat_template.jinja) carries is the one train and
# generate use; prompt/completion records (GSM8K's question/answer) with
# --format chat become a user and an assistant turn; and `generate --chat`
# tokenizes a user message exactly as the file's Jinja template renders it
# (jinja2, which transformers renders templates with, in .venv), then stops at
# <|im_end|>.
set -u
. "$(dirname "$0")/lib.sh"
VPY=${VENV_PY:-.venv/bin/python}
G=$D/text/gsm8k/train.jsonl

# dump the first batch's tokens and targets of a one-step run
first_batch() {  # out model data [train options...]
    local out=$1 model=$2 data=$3; shift 3
    "$FT" train -m "$model" --data "$data" -o "$tmp/run_$out" --steps 1 --val-split 0 --no-shuffle -c 512 \
        --lora-r 2 --quiet --dump-batches "$tmp/$out.dump" "$@" > "$tmp/$out.log" 2>&1 || { cat "$tmp/$out.log"; return 1; }
    python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(json.dumps([d["tokens"], d["targets"]]))' \
        "$tmp/$out.dump" > "$tmp/$out.batch"
}

# 1. --format chat on question/answer records gives exactly the batch of the
# same records written as messages (user, assistant)
head -n 3 "$G" > "$tmp/qa.jsonl"
python3 -c '
import json, sys
with open(sys.argv[2], "w") as g:
    for l in open(sys.argv[1]):
        r = json.loads(l)
        g.write(json.dumps({"messages": [{"role": "user", "content": r["question"]},
                                         {"role": "assistant", "content": r["answer"]}]}) + "\n")
' "$tmp/qa.jsonl" "$tmp/msgs.jsonl"
if first_batch pair "$HF" "$tmp/qa.jsonl" --format chat --prompt-key question --completion-key answer --chat-template chatml &&
   first_batch msgs "$HF" "$tmp/msgs.jsonl" --chat-template chatml; then
    if cmp -s "$tmp/pair.batch" "$tmp/msgs.batch"; then
        pass "chat_from_question_answer (tokens and loss mask equal to the messages form)"
    else fail chat_from_question_answer "the batches differ"; fi
else fail chat_from_question_answer "a run failed"; fi
expect_error chat_pair_missing_field 'messages.*missing.*nope_q' \
    "$FT" train -m "$HF" --data "$tmp/qa.jsonl" -o "$tmp/run_bad" --format chat --prompt-key nope_q --completion-key answer \
    --chat-template chatml --steps 1 --val-split 0 --quiet

# 2. transformers 5 keeps the template in chat_template.jinja: a directory
# whose tokenizer_config.json has none takes it from there (else chat data
# has no template and is refused)
mkdir -p "$tmp/hf5"; cp "$HF"/* "$tmp/hf5/"
python3 -c '
import json, sys
p = sys.argv[1] + "/tokenizer_config.json"; c = json.load(open(p)); c.pop("chat_template", None)
json.dump(c, open(p, "w"))
' "$tmp/hf5"
expect_error chat_no_template 'chat template' \
    "$FT" train -m "$tmp/hf5" --data "$tmp/msgs.jsonl" -o "$tmp/run_nt" --steps 1 --val-split 0 --quiet
printf '%s' "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}{% endfor %}" \
    > "$tmp/hf5/chat_template.jinja"
if first_batch jinja "$tmp/hf5" "$tmp/msgs.jsonl"; then
    if cmp -s "$tmp/jinja.batch" "$tmp/msgs.batch"; then pass "chat_template_jinja (transformers 5's file: the batch of --chat-template chatml)"
    else fail chat_template_jinja "the batch differs from --chat-template chatml"; fi
else fail chat_template_jinja "the run failed"; fi

# 3. generate --chat: errors first
expect_error generate_system_without_chat 'go with --chat' "$FT" generate -m "$HF" --system "x" -p hi
expect_error generate_chat_no_template 'no chat template' "$FT" generate -m "$HF" --chat -p hi -n 1 --quiet

# 4. the real model: its GGUF's template is found (train on messages without
# --chat-template: the conversations have no system message, so the batch
# starts with the template's default one, as cli_real_chat checks in full),
# and generate --chat feeds exactly the ids of the text
# the file's Jinja template renders (with a system message, so that no
# default system prompt is involved), then stops at <|im_end|>
if need_model chat_real_model "$SMOL"; then
    if first_batch smol "$SMOL" "$tmp/msgs.jsonl"; then
        want=$(printf '<|im_start|>system\n' | "$FT" tokenize -m "$SMOL" --no-bos --parse-special)
        got=$(python3 -c 'import json,sys; print(" ".join(map(str, json.load(open(sys.argv[1]))[0][0][:3])))' "$tmp/smol.batch")
        if [ "$got" = "$want" ]; then pass "chat_template_from_gguf (batch starts '$got')"
        else fail chat_template_from_gguf "batch starts '$got', want '$want'"; fi
    else fail chat_template_from_gguf "train on messages without --chat-template failed"; fi
    q="What is 2 + 2? Answer with the number only."
    "$VPY" - "$SMOL" "$q" > "$tmp/rendered.txt" <<'PY'
import sys, jinja2, gguf
r = gguf.GGUFReader(sys.argv[1])
f = r.fields["tokenizer.chat_template"]
tmpl = bytes(f.parts[f.data[0]]).decode()
msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": sys.argv[2]}]
sys.stdout.write(jinja2.Environment().from_string(tmpl).render(messages=msgs, add_generation_prompt=True))
PY
    n_want=$("$FT" tokenize -m "$SMOL" --no-bos --parse-special < "$tmp/rendered.txt" | wc -w)
    "$FT" generate -m "$SMOL" --chat --system "You are terse." -p "$q" --temp 0 -n 48 -t 2 > "$tmp/reply.txt" 2> "$tmp/gen.err"
    rc=$?
    n_got=$(sed -n 's/^prefill: \([0-9]*\) tokens.*/\1/p' "$tmp/gen.err")
    n_dec=$(sed -n 's/^decode: *\([0-9]*\) tokens.*/\1/p' "$tmp/gen.err")
    if [ $rc -eq 0 ] && [ "$n_got" = "$n_want" ] && [ -n "$n_want" ]; then
        pass "generate_chat_prompt_ids (the $n_got ids of the file's own template rendering)"
    else fail generate_chat_prompt_ids "rc $rc, prefill '$n_got' tokens, the Jinja rendering is '$n_want': $(cat "$tmp/gen.err")"; fi
    if [ $rc -eq 0 ] && [ -n "$n_dec" ] && [ "$n_dec" -lt 47 ] && ! grep -q 'im_end\|im_start' "$tmp/reply.txt" && grep -q 4 "$tmp/reply.txt"; then
        pass "generate_chat_stops_at_im_end (reply '$(tr '\n' ' ' < "$tmp/reply.txt")' in $((n_dec + 1)) tokens)"
    else fail generate_chat_stops_at_im_end "decode '$n_dec' tokens, reply '$(cat "$tmp/reply.txt")'"; fi
fi
