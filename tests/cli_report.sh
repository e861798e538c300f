#!/usr/bin/env bash
# `ftune report`: the SVG paths of a short training run's report carry its
# logged points (one vertex per step, the y-range metrics.jsonl's min and max
# loss), headless Chromium renders the page to a non-blank screenshot, and bad
# input: no metrics, a corrupt and a truncated line (named, skipped), a null
# loss (a marked gap), no -o.
set -u
. "$(dirname "$0")/lib.sh"
VPY=.venv/bin/python
export OMP_NUM_THREADS=1

stories_jsonl "$tmp/d.jsonl" 8
"$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 64 -t 1 --quiet --steps 12 --val-split 0.25 --eval-every 4 \
    -o "$tmp/run" > /dev/null 2>&1 || { fail report_train "ftune train failed"; exit 1; }

# check_svg HTML METRICS: every series' path has one vertex per finite logged
# value; the loss chart's data-ymin/ymax are the min and max of loss and
# val_loss, and the path's pixel extremes reach the plot's top and bottom
cat > "$tmp/check.py" <<'P'
import json, math, re, sys
html, metrics = open(sys.argv[1]).read(), [json.loads(l) for l in open(sys.argv[2])]
charts = dict((m.group(1), m.group(0)) for m in re.finditer(r'<svg [^>]*data-chart="([^"]+)".*?</svg>', html, re.S))
def verts(d): return re.findall(r'[ML]([-0-9.]+) ([-0-9.]+)', d)
loss = charts["loss"]
raw = re.search(r'data-series="train-raw"[^>]* d="([^"]*)"', loss).group(1)
fin = [m["loss"] for m in metrics if m["loss"] is not None]
assert len(verts(raw)) == len(fin), (len(verts(raw)), len(fin))
val = re.search(r'data-series="val"[^>]* d="([^"]*)"', loss).group(1)
vals = [m["val_loss"] for m in metrics if m.get("val_loss") is not None]
assert len(verts(val)) == len(vals), (len(verts(val)), len(vals))
lo, hi = min(fin + vals), max(fin + vals)
ymin = float(re.search(r'data-ymin="([^"]+)"', loss).group(1)); ymax = float(re.search(r'data-ymax="([^"]+)"', loss).group(1))
# %.9g in both the report and metrics.jsonl: the same decimal, so equal to 1e-9 relative
assert math.isclose(ymin, lo, rel_tol=1e-9) and math.isclose(ymax, hi, rel_tol=1e-9), (ymin, ymax, lo, hi)
top, bot = int(re.search(r'data-top="(\d+)"', loss).group(1)), int(re.search(r'data-bottom="(\d+)"', loss).group(1))
ys = [float(y) for _, y in verts(raw)] + [float(y) for _, y in verts(val)]
assert abs(min(ys) - top) < 0.01 and abs(max(ys) - bot) < 0.01, (min(ys), max(ys), top, bot)  # %.2f pixels
for name, key in (("learning rate", "lr"), ("grad norm", "grad_norm"), ("tokens per second", "tokens_per_s")):
    d = re.search(r'data-series="value"[^>]* d="([^"]*)"', charts[name]).group(1)
    n = sum(1 for m in metrics if m.get(key) is not None)
    assert len(verts(d)) == n, (name, len(verts(d)), n)
nulls = sum(1 for m in metrics if m["loss"] is None)
assert loss.count('class="gap"') == nulls, (loss.count('class="gap"'), nulls)
print(len(metrics))
P
"$FT" report "$tmp/run" -o "$tmp/r.html" > /dev/null 2> "$tmp/err" || { fail report_runs "exit $?: $(cat "$tmp/err")"; }
if out=$("$VPY" "$tmp/check.py" "$tmp/r.html" "$tmp/run/metrics.jsonl" 2>&1); then pass "report_svg_points ($out steps)"
else fail report_svg_points "$out"; fi
grep -q '<script' "$tmp/r.html" && fail report_no_script "the report holds a <script>" || pass report_no_script
grep -qE '(src|href)="https?:' "$tmp/r.html" && fail report_no_network "the report loads from the network" || pass report_no_network

# two runs, the configuration's differences highlighted
"$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 64 -t 1 --quiet --steps 6 --lora-r 4 -o "$tmp/run2" > /dev/null 2>&1
"$FT" report "$tmp/run" "$tmp/run2" -o "$tmp/r2.html" > /dev/null 2> "$tmp/err"
if grep -q '<tr class=diff><td>r</td>' "$tmp/r2.html" && grep -q 'data-run="1"' "$tmp/r2.html"; then pass report_two_runs
else fail report_two_runs "no highlighted r row or no second run's paths in the report"; fi

# a corrupt line, a truncated last line and a null loss: named, skipped, a gap
mkdir -p "$tmp/bad"
{ head -n 3 "$tmp/run/metrics.jsonl"; echo 'not json'; sed -n 5p "$tmp/run/metrics.jsonl" | sed 's/"loss":[0-9.e-]*/"loss":null/'
  sed -n 6,8p "$tmp/run/metrics.jsonl"; printf '{"step":9,"loss":2.0'; } > "$tmp/bad/metrics.jsonl"
if "$FT" report "$tmp/bad" -o "$tmp/b.html" > /dev/null 2> "$tmp/err" && grep -q 'metrics.jsonl:4: not a JSON object' "$tmp/err" &&
    grep -q 'metrics.jsonl:9: not a JSON object (truncated' "$tmp/err" && grep -q 'line 4' "$tmp/b.html"; then
    head -n 8 "$tmp/bad/metrics.jsonl" | grep -v '^not json' > "$tmp/bad_ok.jsonl"
    if out=$("$VPY" "$tmp/check.py" "$tmp/b.html" "$tmp/bad_ok.jsonl" 2>&1); then pass report_bad_lines
    else fail report_bad_lines "the readable lines' points: $out"; fi
else fail report_bad_lines "$(cat "$tmp/err")"; fi

mkdir -p "$tmp/empty"
expect_error report_no_metrics "empty/metrics.jsonl: cannot open" "$FT" report "$tmp/empty" -o "$tmp/e.html"
expect_error report_no_output "give -o FILE" "$FT" report "$tmp/run"

# a real browser renders it, and the screenshot is not blank
CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROME" ]; then
    skip_or_fail report_chromium tool "no chromium on PATH (Debian's chromium package; scripts/setup.sh installs it)"; exit
fi
timeout 60 "$CHROME" --headless --no-sandbox --disable-gpu --user-data-dir="$tmp/chrome" --window-size=1000,1600 \
    --screenshot="$tmp/shot.png" "file://$(realpath "$tmp/r.html")" > "$tmp/chrome.log" 2>&1
cat > "$tmp/png.py" <<'P'
import struct, sys, zlib
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
i, idat, w, h, ct = 8, b"", 0, 0, 0
while i < len(b):
    n, t = struct.unpack(">I4s", b[i:i + 8]); c = b[i + 8:i + 8 + n]; i += 12 + n
    if t == b"IHDR": w, h, bd, ct = struct.unpack(">IIBB", c[:10])
    if t == b"IDAT": idat += c
raw = zlib.decompress(idat); bpp = {2: 3, 6: 4}[ct]; stride = w * bpp
# unfilter rows (PNG filters 0-4) to count the distinct colours
prev, px = bytearray(stride), set()
for y in range(h):
    f, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for x in range(stride):
        a = row[x - bpp] if x >= bpp else 0; up = prev[x]; ul = prev[x - bpp] if x >= bpp else 0
        if f == 1: row[x] = (row[x] + a) & 255
        elif f == 2: row[x] = (row[x] + up) & 255
        elif f == 3: row[x] = (row[x] + (a + up) // 2) & 255
        elif f == 4:
            p = a + up - ul; pa, pb, pc = abs(p - a), abs(p - up), abs(p - ul)
            row[x] = (row[x] + (a if pa <= pb and pa <= pc else up if pb <= pc else ul)) & 255
    for x in range(0, stride, bpp * 7): px.add(bytes(row[x:x + 3]))
    prev = row
# a blank page is one colour; curves in several colours, text and axes give many
assert len(px) >= 8, "screenshot has %d colours: blank" % len(px)
print(w, h, len(px))
P
if [ -s "$tmp/shot.png" ] && out=$("$VPY" "$tmp/png.py" "$tmp/shot.png" 2>&1); then pass "report_chromium ($out: width height colours)"
else fail report_chromium "${out:-no screenshot}: $(tail -3 "$tmp/chrome.log")"; fi
