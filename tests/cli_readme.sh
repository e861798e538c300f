#!/usr/bin/env bash
# The README's examples run as written: every indented README line that runs
# build/ftune (joined across "\" continuations) is run, in README order, in a
# scratch directory where build/ is the tree's build and the placeholder
# inputs the README names (chat.jsonl, alpaca.json, data.jsonl, test.txt,
# path/to/config.json) exist, small and in the formats the README describes.
# Changes, each to stay within the suite's time (they are printed):
#   /tmp/NAME outputs go to the scratch directory instead;
#   a train command with neither --steps nor --epochs gets --steps 20 (an
#   epoch of GSM8K's 7473 examples would take minutes);
#   eval reads the first 20 KB of tinyshakespeare (test.txt) instead of all
#   1.1 MB of it (over a minute on 2 cores);
#   init's llama-110m (220 MB) is removed once written.
# The test fails with the command and its stderr when one exits non-zero.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FT=${FTUNE:-build/ftune}
case $FT in /*) ;; *) FT=$ROOT/$FT ;; esac
D=${FTUNE_DATA:-../shared/data}
case $D in /*) ;; *) D=$(cd "$ROOT" && cd "$D" && pwd) ;; esac
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass() { echo "PASS $1"; }
status=0
fail() { echo "FAIL $1: $2"; status=1; }

# the commands, one per line, continuations joined
/usr/bin/python3 - "$ROOT/README.md" > "$tmp/commands" <<'EOF' || { fail readme_extract "cannot read README.md"; exit 1; }
import re, sys
lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
i = 0
while i < len(lines):
    l = lines[i]
    if l.startswith("    ") and re.match(r"\s*(echo .*\| )?build/ftune ", l):
        cmd = l.strip()
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
        print(cmd)
    i += 1
EOF
n=$(wc -l < "$tmp/commands")
[ "$n" -ge 20 ] || { fail readme_extract "only $n commands found in README.md"; exit 1; }

# the scratch directory: build/ftune, and the placeholders
w=$tmp/w; mkdir -p "$w/build" "$w/path/to"
ln -s "$FT" "$w/build/ftune"
head -c 20000 "$D/text/tinyshakespeare/input.txt" > "$w/test.txt"
/usr/bin/python3 - "$w" <<'EOF' || { fail readme_placeholders "cannot write the placeholder inputs"; exit 1; }
import json, sys
w = sys.argv[1]
with open(w + "/data.jsonl", "w") as f:
    for t in ["Once upon a time there was a little dog.", "The cat sat on the mat and looked at the sun."]:
        f.write(json.dumps({"text": t}) + "\n")
with open(w + "/chat.jsonl", "w") as f:
    for q, a in [("What is the sun?", "A star."), ("Who is Lily?", "A little girl who likes to play."),
                 ("Is the sky blue?", "Yes, on a sunny day."), ("Can a dog run?", "Yes, very fast.")] * 4:
        f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
EOF
/usr/bin/python3 -c '
import json, sys
a = json.load(open(sys.argv[1]))[:16]
json.dump(a, open(sys.argv[2], "w"), indent=1)
' "$D/text/alpaca/alpaca_200.json" "$w/alpaca.json" || { fail readme_placeholders "cannot write alpaca.json"; exit 1; }
cp "$D/models/stories260K-hf/config.json" "$w/path/to/config.json"

cd "$w" || exit 1
# M: where scripts/fetch_models.sh keeps the real models (the README's examples on them)
M=${FTUNE_MODELS:-$HOME/.cache/ftune/models}
export D M
bad=0 k=0
while IFS= read -r cmd; do
    k=$((k + 1))
    run=$cmd
    run=${run//\/tmp\//$w\/}
    # the real models' examples run as written but short: one training step and no
    # validation, 8 new tokens
    case $run in *'$M/'*) run=$(printf '%s' "$run" | sed -E 's/--steps [0-9]+/--steps 1/; s/--val-split [0-9.]+/--val-split 0/; s/ -n [0-9]+/ -n 8/') ;; esac
    case $run in
        *"ftune train "*) case $run in *--steps*|*--epochs*) ;; *) run="$run --steps 20" ;; esac ;;
        *"ftune eval "*) run=${run//\$D\/text\/tinyshakespeare\/input.txt/test.txt} ;;
    esac
    [ "$run" != "$cmd" ] && echo "README command $k run as: $run"
    t0=$SECONDS
    if ! bash -c "$run" > "$tmp/out" 2> "$tmp/err"; then
        fail "readme_cmd_$k" "$cmd
$(tail -20 "$tmp/err")"
        bad=$((bad + 1))
    else
        echo "ok ($((SECONDS - t0)) s): $cmd"
    fi
    case $run in *"--preset llama-110m"*) rm -rf "$w/llama110m" ;; esac
done < "$tmp/commands"
[ "$bad" -eq 0 ] && pass "readme_examples ($k commands)" || fail readme_examples "$bad of $k README commands failed"

# merge's progress (the README's merge subsection): with --progress, lines
# with an ETA ending at 100% on stderr, nothing on stdout, the same file as
# without; without it (stderr is not a terminal here) no progress line
m=$D/models/stories260K-hf
if "$FT" merge -m "$m" -o "$tmp/p.gguf" --dtype q4_0 --progress > "$tmp/out" 2> "$tmp/err" &&
   "$FT" merge -m "$m" -o "$tmp/q.gguf" --dtype q4_0 > "$tmp/out2" 2> "$tmp/err2"; then
    if ! grep -q "^writing $tmp/p.gguf  100%  ETA " "$tmp/err"; then fail merge_progress "no 100% line: $(cat "$tmp/err")"
    elif [ -s "$tmp/out" ] || [ -s "$tmp/out2" ]; then fail merge_progress "output on stdout"
    elif grep -q "ETA" "$tmp/err2"; then fail merge_progress "progress without --progress off a terminal"
    elif ! cmp -s "$tmp/p.gguf" "$tmp/q.gguf"; then fail merge_progress "--progress changed the file"
    else pass merge_progress; fi
else fail merge_progress "$(cat "$tmp/err" "$tmp/err2")"; fi
exit $status
