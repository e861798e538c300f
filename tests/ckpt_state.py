"""ckpt_state.py — edits an ftune trainer_state.json as the tests need it.

    python3 tests/ckpt_state.py FILE 'PYTHON STATEMENTS on the dict s' [--unsigned]

Runs the statements on the parsed state and writes it back. A version 4
state is signed again as ftune signs it (src/train/train_state.c): its last
field "state_checksum" is FNV-1a 64 of the file's bytes with the field's 16
hex digits read as '0's; so an edited state reaches the checks behind the
checksum. --unsigned keeps the old "state_checksum" (the checksum test: an
edit ftune must see as damage); a state made version 2 or 3 loses the field.
"""
import json
import sys


def fnv1a(b):
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def signed_text(s):
    s = {k: v for k, v in s.items() if k != "state_checksum"}
    t = json.dumps(s, indent="\t")
    t = t[: t.rindex("}")].rstrip() + ',\n\t"state_checksum":\t"' + "0" * 16 + '"\n}\n'
    at = t.rindex('"' + "0" * 16 + '"') + 1
    return t[:at] + "%016x" % fnv1a(t.encode()) + t[at + 16 :]


def main():
    path, code = sys.argv[1], sys.argv[2]
    unsigned = "--unsigned" in sys.argv[3:]
    s = json.load(open(path))
    if not unsigned:
        s.pop("state_checksum", None)
    exec(code, {"s": s})
    if unsigned or not (isinstance(s.get("version"), int) and s["version"] >= 4):
        text = json.dumps(s)
    else:
        text = signed_text(s)
    open(path, "w").write(text)


main()
