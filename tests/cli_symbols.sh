#!/usr/bin/env bash
# The public library exports only its public API: every global symbol that
# $BUILD/libftune.a defines starts with ftune_, every function ftune.h
# declares is among them, and a program that defines its own
# gguf_find_tensor (as ggml does) links with libftune.a and runs.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
. tests/lib.sh
LIB=$BUILD/libftune.a
INTERNAL=$BUILD/libftune-internal.a
CC=${CC:-cc}
[ -f "$LIB" ] && [ -f "$INTERNAL" ] || { fail symbols "$LIB or $INTERNAL missing (run make)"; exit 1; }

# 1. only ftune_* is global. Nothing else is allowed: the objects are built
# with -fvisibility=hidden, so the toolchain has nothing of its own to export
# (OpenMP, BLAS, cJSON and libc symbols are undefined references, which
# --defined-only leaves out).
nm -g --defined-only "$LIB" | awk 'NF == 3 { print $3 }' | sort > "$tmp/exported"
grep -v '^ftune_' "$tmp/exported" > "$tmp/bad"
if [ ! -s "$tmp/exported" ]; then fail exports_only_ftune "no symbols at all in $LIB"
elif [ -s "$tmp/bad" ]; then fail exports_only_ftune "$(wc -l < "$tmp/bad") non-ftune_ global(s): $(head -5 "$tmp/bad" | tr '\n' ' ')"
else pass exports_only_ftune; fi

# 2. every function the header declares (FTUNE_API) is exported
grep -oE 'FTUNE_API [^(]*\bftune_[a-z0-9_]+\(' include/ftune.h | grep -oE 'ftune_[a-z0-9_]+\($' | tr -d '(' |
    sort -u > "$tmp/declared"
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
if [ ! -s "$tmp/declared" ]; then fail header_exported "found no FTUNE_API declarations in include/ftune.h"
elif [ -n "$missing" ]; then fail header_exported "declared but not exported: $(echo $missing)"
else pass header_exported; fi

# 3. a program with its own gguf_find_tensor (ggml's public name) that also
# loads a GGUF model through ftune, so ftune's gguf code is linked in
cat > "$tmp/prog.c" <<'C'
#include <stdio.h>
#include <string.h>
#include "ftune.h"
/* ggml's: int64_t gguf_find_tensor(const struct gguf_context *, const char *) */
long gguf_find_tensor(const void *ctx, const char *name) { (void)ctx; return strcmp(name, "x") == 0 ? 7 : -1; }
/* and one of ftune's own internal names, which libftune.a must hide too */
long ft_gguf_find_tensor(const void *ctx, const char *name) { (void)ctx; return strcmp(name, "y") == 0 ? 8 : -1; }
int main(int argc, char **argv) {
    ftune_model *m = NULL;
    if (ftune_model_load(&m, argv[1], NULL)) { fprintf(stderr, "%s\n", ftune_last_error()); return 1; }
    ftune_model_info info;
    ftune_model_get_info(m, &info);
    printf("%s %d %ld %ld\n", info.format, info.n_layers, gguf_find_tensor(NULL, "x"), ft_gguf_find_tensor(NULL, "y"));
    ftune_model_free(m);
    return 0;
}
C
[ -f "$BUILD/link-flags" ] || { fail link_with_own_gguf_find_tensor "$BUILD/link-flags missing (run make)"; exit 1; }
flags=$(cat "$BUILD/link-flags")
model=$D/models/stories260K/stories260K.gguf
if ! $CC -std=c11 -Iinclude -o "$tmp/prog" "$tmp/prog.c" "$LIB" $flags > "$tmp/link.log" 2>&1; then
    fail link_with_own_gguf_find_tensor "$(head -5 "$tmp/link.log")"
elif ! out=$("$tmp/prog" "$model" 2>&1); then fail link_with_own_gguf_find_tensor "run: $out"
elif [ "$out" != "gguf 5 7 8" ]; then fail link_with_own_gguf_find_tensor "printed \"$out\", expected \"gguf 5 7 8\""
else pass link_with_own_gguf_find_tensor; fi

# 4. the control: the internals define ft_gguf_find_tensor globally, so the
# same program must fail to link against them (else check 3 proves nothing)
if nm -g --defined-only "$INTERNAL" | awk '{ print $3 }' | grep -qx ft_gguf_find_tensor; then
    if $CC -std=c11 -Iinclude -o "$tmp/prog2" "$tmp/prog.c" "$INTERNAL" $flags > "$tmp/link2.log" 2>&1; then
        fail internal_collides "linking against $INTERNAL succeeded: check 3 would not detect a leak"
    elif grep -q 'multiple definition.*ft_gguf_find_tensor' "$tmp/link2.log"; then pass internal_collides
    else fail internal_collides "unexpected link error: $(head -3 "$tmp/link2.log")"; fi
else
    fail internal_collides "$INTERNAL does not define ft_gguf_find_tensor: pick another internal name for the control"
fi
