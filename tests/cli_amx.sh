#!/usr/bin/env bash
# The AMX kernel level from the command line: `ftune -v` names the level the
# products run on and says in one line what the AMX probe found; FTUNE_CPU=amx
# on a CPU whose tiles do not work (no AMX, or the OS or a trial refused)
# runs the best level there is, as any FTUNE_CPU above the CPU's does, and the
# line says why. The kernels themselves are test_kernels' (test_amx_tiles).
set -u
. "$(dirname "$0")/lib.sh"

line() { FTUNE_CPU=$1 "$FT" -v 2>&1 | grep '^kernels: '; }
best=$(line "")
asked=$(line amx)
echo "  $asked"

# 1. one line: the level, then the probe's note
case "$best" in
"kernels: "*"; AMX: "*) pass version_kernels_line ;;
*) fail version_kernels_line "'$best'" ;;
esac

# 2. FTUNE_CPU=amx changes nothing but the cap: the same level and note as no FTUNE_CPU
[ "$asked" = "$best" ] && pass amx_request_is_a_cap || fail amx_request_is_a_cap "'$asked' vs '$best'"

# 3. without amx_bf16 in /proc/cpuinfo the level is not amx, and the note says
#    the CPU has none; with it, amx or a note naming the step that failed
level=${asked#kernels: }; level=${level%%;*}
if ! grep -qw amx_bf16 /proc/cpuinfo; then
    if [ "$level" != amx ] && echo "$asked" | grep -q "AMX: not on this CPU"; then pass amx_falls_back
    else fail amx_falls_back "'$asked'"; fi
else
    if [ "$level" = amx ] || echo "$asked" | grep -q "using avx512bf16"; then pass amx_probed
    else fail amx_probed "'$asked'"; fi
fi

# 4. a cap below the best level is obeyed and keeps the note
if grep -qw avx512_bf16 /proc/cpuinfo; then
    l=$(line avx512bf16)
    case "$l" in
    "kernels: avx512bf16; AMX: "*) pass cap_avx512bf16 ;;
    *) fail cap_avx512bf16 "'$l'" ;;
    esac
else
    skip_or_fail cap_avx512bf16 hardware "/proc/cpuinfo lists no avx512_bf16: no level to cap at"
fi
l=$(line generic)
case "$l" in
"kernels: generic; AMX: "*) pass cap_generic ;;
*) fail cap_generic "'$l'" ;;
esac

# 5. a SIGILL in the command (here sent from outside while it waits on its
#    input) ends it by SIGILL with one line naming the kernel level and what
#    FTUNE_CPU avoids it (ftune_report_kernel_faults; the tile-code line and
#    a real tile fault are test_amx_state's)
err=$(mktemp); trap 'rm -f "$err"' EXIT
fifo=$(mktemp -u); mkfifo "$fifo"
"$FT" tokenize -m "$HF" < "$fifo" 2> "$err" &
pid=$!
exec 7> "$fifo" # the writer: tokenize now blocks reading, after its start-up
sleep 0.5
kill -ILL "$pid"
{ wait "$pid"; } 2> /dev/null; rc=$? # (bash's own "Illegal instruction" line)
exec 7>&-
rm -f "$fifo"
if [ "$rc" = $((128 + 4)) ] && grep -q "^ftune: fatal: illegal instruction (SIGILL) at kernel level $level" "$err" &&
    [ "$(wc -l < "$err")" = 1 ]; then pass sigill_reported
else fail sigill_reported "rc $rc, stderr '$(cat "$err")'"; fi
