#!/usr/bin/env bash
# The floors of src/README.md hold: every folder of src/ has a floor in its
# table, and every `#include "dir/name.h"` of src/*/*.[ch] names its own
# folder or a folder on a lower floor (none on its own floor or above). The
# table is read from the README, so the check and the description cannot
# drift apart. A control checks that an include up a floor is caught.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh

# "folder floor" per line, from the rows "| N | `a/`, `b/` ... |" of the Floors table
awk '/^## Floors/ { on = 1; next } /^## / { on = 0 } on' src/README.md |
    grep -E '^\| [0-9]+ \|' | while IFS='|' read -r _ floor folders _; do
        for f in $(echo "$folders" | grep -oE '`[a-z_]+/`' | tr -d '`/'); do echo "$f ${floor// /}"; done
    done > "$tmp/floors"

# includes, as "folder file included-folder header"
for f in src/*/*.[ch]; do
    d=${f#src/}; d=${d%%/*}
    grep -oE '^#include "[a-z_0-9]+/[a-z_0-9]+\.h"' "$f" | sed -E 's/^#include "(([a-z_0-9]+)\/[a-z_0-9]+\.h)"/\2 \1/' |
        while read -r hd h; do echo "$d $f $hd $h"; done
done > "$tmp/includes"

# check FLOORS INCLUDES: prints one line per include that does not go down (or stay in its folder)
check() {
    awk 'NR == FNR { floor[$1] = $2; next }
         $1 == $3 { next }
         !($1 in floor) || !($3 in floor) { print $2 " -> " $4 ": no floor for " (($1 in floor) ? $3 : $1); next }
         floor[$3] >= floor[$1] { print $2 " -> " $4 " (floor " floor[$1] " -> " floor[$3] ")" }' "$1" "$2"
}

if [ ! -s "$tmp/floors" ]; then fail floors_table "no floor table (## Floors, rows | N | \`dir/\` |) in src/README.md"; exit 1; fi
missing=""
for d in src/*/; do d=${d#src/}; d=${d%/}; grep -q "^$d " "$tmp/floors" || missing="$missing $d"; done
if [ -n "$missing" ]; then fail floors_every_folder "folders of src/ without a floor in src/README.md:$missing"
else pass floors_every_folder; fi

check "$tmp/floors" "$tmp/includes" > "$tmp/bad"
if [ ! -s "$tmp/includes" ]; then fail includes_go_down "found no includes in src/"
elif [ -s "$tmp/bad" ]; then fail includes_go_down "$(wc -l < "$tmp/bad") include(s) up or across a floor: $(head -5 "$tmp/bad" | tr '\n' ';')"
else pass includes_go_down; fi

# the control: nn/ including model/model.h (a floor up) and ops/ including formats/ (its own floor) are caught
printf 'nn src/nn/x.c model model/model.h\nops src/ops/y.c formats formats/gguf.h\n' > "$tmp/control"
if [ "$(check "$tmp/floors" "$tmp/control" | wc -l)" -eq 2 ]; then pass floors_control
else fail floors_control "an include up a floor or across one was not caught: the check proves nothing"; fi
