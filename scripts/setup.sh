#!/usr/bin/env bash
# Installs every Debian package ftune needs to build, test and benchmark.
# Idempotent: packages already present are skipped by apt.
set -euo pipefail
PKGS=(
  build-essential     # gcc, make
  libopenblas-dev     # BLAS for fp32 matrix products (and PyTorch's fast BLAS)
  libopenblas-serial-dev  # the single-threaded OpenBLAS ftune links: threads come from ftune's own pool
  libopenblas-openmp-dev  # the OpenMP build, for BLAS=openblas-openmp
  libpcre2-dev        # Unicode regex pre-tokenization for byte-level BPE
  libcjson-dev        # JSON parsing: config.json, tokenizer.json, JSONL, safetensors headers
  clang               # libFuzzer target for the file parsers
  libclang-rt-14-dev  # sanitizer / fuzzer runtimes for clang
  python3-torch       # numerical reference (Debian's PyTorch, run with /usr/bin/python3)
  python3-numpy
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
