#!/usr/bin/env bash
# `ftune train`'s progress line at a terminal: with a UTF-8 locale it ends
# the loss with a sparkline of the last losses (block characters U+2581..
# U+2588, one per step, at most 16); with another locale, or when stderr is
# not a terminal (a log file), the line has none. The terminal is a pty from
# script(1).
set -u
. "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
if ! command -v script > /dev/null; then skip_or_fail sparkline tool "script (util-linux) not found"; exit; fi
stories_jsonl "$tmp/d.jsonl" 10
cmd="$FT train -m $HF --data $tmp/d.jsonl --ctx 64 -t 1 --steps 20 --lr 1e-2 -o"
bars='[▁▂▃▄▅▆▇█]'
# tty LOCALE OUT_DIR: stderr of a run at a pty, carriage returns as newlines
tty() { LC_ALL=$1 script -qec "$cmd $2" /dev/null 2>&1 < /dev/null | tr '\r' '\n'; }

tty C.UTF-8 "$tmp/a" > "$tmp/tty_utf8.txt"
last=$(grep -a 'step 20/20' "$tmp/tty_utf8.txt" | tail -1)
n=$(printf '%s' "$last" | sed -n 's/.*loss [0-9.]*  \([^ ]*\)  lr.*/\1/p' | grep -o "$bars" | wc -l)
if [ "$n" -eq 16 ]; then pass "utf8_terminal_sparkline ($(printf '%s' "$last" | sed -n 's/.*loss \([0-9.]*  [^ ]*\)  lr.*/\1/p'))"
else fail utf8_terminal_sparkline "want 16 block characters after the loss of step 20, got $n: $last"; fi
first=$(grep -a 'step 2/20' "$tmp/tty_utf8.txt" | tail -1)
n=$(printf '%s' "$first" | grep -o "$bars" | wc -l)
if [ "$n" -eq 2 ]; then pass utf8_terminal_grows_per_step; else fail utf8_terminal_grows_per_step "step 2 shows $n: $first"; fi

tty C "$tmp/b" > "$tmp/tty_c.txt"
if grep -a -q 'step 20/20' "$tmp/tty_c.txt" && ! grep -a -q "$bars" "$tmp/tty_c.txt"; then pass c_locale_no_sparkline
else fail c_locale_no_sparkline "$(grep -a 'step 20/20' "$tmp/tty_c.txt" | tail -1)"; fi

LC_ALL=C.UTF-8 $cmd "$tmp/c" 2> "$tmp/log.txt" < /dev/null
if grep -q 'step 20/20' "$tmp/log.txt" && ! grep -q "$bars" "$tmp/log.txt" && ! grep -q $'\r' "$tmp/log.txt"; then pass log_file_no_sparkline
else fail log_file_no_sparkline "$(grep 'step 20/20' "$tmp/log.txt")"; fi
