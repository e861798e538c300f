# mpi_lib.sh — what the tests/cli_*.sh that run `mpirun -np N ftune train`
# share; sourced after lib.sh, never run. Ends the script with a skip (a
# failure under FTUNE_REQUIRE=all, see skip_or_fail) named after it when there
# is no mpirun or ftune is built without MPI. Sets MPI (the launcher: every
# rank on this machine) and defines run_mpi, same_curve and
# same_output.
mpi_name=$(basename "$0" .sh); mpi_name=${mpi_name#cli_}
if ! command -v mpirun > /dev/null; then
    skip_or_fail "$mpi_name" tool "mpirun not found (scripts/setup.sh installs Open MPI)"; exit
fi
# a build without MPI (make MPI=0) is a one-rank program: nothing to test here
if ! ldd "$FT" 2>/dev/null | grep -q libmpi; then
    skip_or_fail "$mpi_name" tool "$FT is built without MPI (make MPI=1, with scripts/setup.sh's Open MPI)"; exit
fi
# Open MPI refuses root unless told; a test container runs as root
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# every rank on this machine, over shared memory and loopback TCP; quiet about the missing fast fabrics
MPI=(mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo)
# a hang is a failure, not a stuck test suite
run_mpi() { local n=$1; shift; timeout 120 "${MPI[@]}" -np "$n" "$@"; }


# same_curve NAME METRICS_A METRICS_B [FROM_STEP [TOLERANCE]]: per-step losses,
# validation losses and grad norms of run b against run a, from FROM_STEP (1).
# 1e-5 relative by default: the only difference is the order of the gradient
# and loss sums over ranks (float32); measured up to 9.7e-6 (3 ranks, 10 KiB
# buckets, 4 steps at lr 1e-2: Open MPI's non-blocking all-reduce of small
# buckets sums in another order than its blocking one did, 7.6e-6), otherwise
# up to 5e-6 at ZeRO 0/1 and 1e-7 at ZeRO 2/3, where each micro-batch's
# gradient is summed over ranks and then added to the shard.
same_curve() {  # name metrics_a metrics_b [from_step [tolerance]]
    $PY - "$2" "$3" "${4:-1}" "${5:-1e-5}" <<'EOF' && pass "$1" || fail "$1" "$(cat "$2" "$3")"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
first = int(sys.argv[3])
a = [x for x in a if x["step"] >= first]
b = [x for x in b if x["step"] >= first]
assert [x["step"] for x in a] == [x["step"] for x in b] and a, "the same steps"
worst = 0
for x, y in zip(a, b):
    for k in ("loss", "grad_norm", "val_loss"):
        assert (k in x) == (k in y), k
        if k in x:
            worst = max(worst, abs(x[k] - y[k]) / max(abs(x[k]), 1e-30))
print("max relative difference over %d steps: %.2e" % (len(a), worst))
assert worst <= float(sys.argv[4]), worst
EOF
}

# What rank 0 wrote is the whole adapter (or model): the same tensors as the
# one-process run's, and the same loss on the training text. Not the
# values elementwise: AdamW's first steps move an element by about lr
# whatever its gradient's size, so an element whose gradient is rounding
# noise differs by up to 2 lr between runs (measured 4e-4 relative after 6
# LoRA steps), while the loss agrees to 1e-6.
same_output() {  # name dir_a dir_b eval-args...
    local name=$1 a=$2 b=$3; shift 3
    local la lb
    la=$("$FT" eval "$@" "$a" --jsonl "$tmp/d.jsonl" --ctx 48 -t 1 --json 2> "$tmp/err.txt") &&
    lb=$("$FT" eval "$@" "$b" --jsonl "$tmp/d.jsonl" --ctx 48 -t 1 --json 2>> "$tmp/err.txt") || {
        fail "$name" "$(cat "$tmp/err.txt")"; return; }
    $PY - "$a" "$b" "$la" "$lb" <<'EOF' && pass "$name" || fail "$name" "$la / $lb"
import json, struct, sys, os
def header(d):
    p = [os.path.join(d, f) for f in ("adapter_model.safetensors", "model.safetensors") if os.path.exists(os.path.join(d, f))][0]
    b = open(p, "rb").read(8)
    h = json.loads(open(p, "rb").read(8 + struct.unpack("<Q", b)[0])[8:])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"]) for k, v in h.items()}
assert header(sys.argv[1]) == header(sys.argv[2]), "the same tensors"
la, lb = json.loads(sys.argv[3])["loss"], json.loads(sys.argv[4])["loss"]
print("eval loss %.9g (one process), %.9g (ranks): relative difference %.2e" % (la, lb, abs(la - lb) / la))
# 1e-5 as for the training losses: the values differ only by the reduction order's rounding
assert abs(la - lb) <= 1e-5 * la
EOF
}
