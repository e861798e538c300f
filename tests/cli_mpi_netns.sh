#!/usr/bin/env bash
# Two "hosts" on this machine: each rank runs in its own network namespace,
# joined to the other by veth pairs on a bridge, so the ranks can only talk
# over TCP (Open MPI's tcp BTL, no shared memory). mpirun launches an orted
# in each namespace through a launch agent that stands in for ssh. The
# per-step losses equal one process's with the same global batch, and the
# bytes on the veth are the collectives' payload plus protocol overhead, the
# same with --grad-accum 2 (one round of communication per optimizer step).
# Needs root (CAP_NET_ADMIN) and iproute2: skipped otherwise (skip_or_fail: a
# failure under FTUNE_REQUIRE=all).
set -u
. "$(dirname "$0")/lib.sh"
case $FT in /*) ;; *) FT=$PWD/$FT ;; esac

command -v mpirun > /dev/null || { skip_or_fail mpi_netns tool "mpirun not found (scripts/setup.sh installs Open MPI)"; exit; }
ldd "$FT" 2>/dev/null | grep -q libmpi ||
    { skip_or_fail mpi_netns tool "$FT is built without MPI (make MPI=1, with scripts/setup.sh's Open MPI)"; exit; }
[ "$(id -u)" -eq 0 ] ||
    { skip_or_fail mpi_netns tool "not root: network namespaces need CAP_NET_ADMIN (run the suite as root)"; exit; }
command -v ip > /dev/null || { skip_or_fail mpi_netns tool "ip not found (scripts/setup.sh installs iproute2)"; exit; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# names and a subnet of this run's own (other test runs may be doing the same)
id=$(( $$ % 10000 ))
net=10.213.$(( $$ % 250 ))
br=ftbr$id; nsa=ftmpi${id}a; nsb=ftmpi${id}b
cleanup() {
    ip netns del "$nsa" 2> /dev/null; ip netns del "$nsb" 2> /dev/null; ip link del "$br" 2> /dev/null
    [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
setup() {
    ip link add "$br" type bridge && ip addr add "$net.254/24" dev "$br" && ip link set "$br" up || return 1
    local i=1
    for ns in "$nsa" "$nsb"; do
        ip netns add "$ns" && ip link add "ftr$id$i" type veth peer name "ftp$id$i" &&
        ip link set "ftr$id$i" master "$br" && ip link set "ftr$id$i" up && ip link set "ftp$id$i" netns "$ns" &&
        ip -n "$ns" link set "ftp$id$i" name ftv && ip -n "$ns" addr add "$net.$i/24" dev ftv &&
        ip -n "$ns" link set ftv up && ip -n "$ns" link set lo up || return 1
        i=$((i + 1))
    done
}
if ! setup 2> "$tmp/err.txt"; then
    skip_or_fail mpi_netns tool "cannot create network namespaces here (a container without CAP_NET_ADMIN?): $(cat "$tmp/err.txt")"
    exit
fi

# the launch agent: mpirun calls it as ssh, "agent HOST command..."; a host is
# a namespace with its own temporary directory (Open MPI's session
# directories are named by hostname, which the two "hosts" share)
mkdir -p "$tmp/host1" "$tmp/host2"
cat > "$tmp/agent.sh" <<EOF
#!/bin/sh
h=\$1; shift
case \$h in $net.1) ns=$nsa; d=$tmp/host1 ;; $net.2) ns=$nsb; d=$tmp/host2 ;; *) echo "agent: unknown host \$h" >&2; exit 1 ;; esac
export OMPI_MCA_orte_tmpdir_base=\$d
exec ip netns exec \$ns sh -c "\$*"
EOF
chmod +x "$tmp/agent.sh"
printf '%s slots=1\n%s slots=1\n' "$net.1" "$net.2" > "$tmp/hosts"

stories_jsonl "$tmp/d.jsonl" 6
args=(train -m "$(cd "$HF" && pwd)" --data "$tmp/d.jsonl" --ctx 48 -t 1 --seed 5 --lora-dropout 0 --val-split 0
      --steps 4 --lr 1e-2 --batch-size 4)
"$FT" "${args[@]}" --quiet -o "$tmp/one" 2> "$tmp/err.txt" || fail one_process "$(cat "$tmp/err.txt")"
tx0=$(ip netns exec "$nsa" cat /sys/class/net/ftv/statistics/tx_bytes)
timeout 120 mpirun --hostfile "$tmp/hosts" -np 2 --mca plm_rsh_agent "$tmp/agent.sh" \
    --mca routed direct --mca oob_tcp_if_include "$net.0/24" --mca btl self,tcp --mca btl_tcp_if_include "$net.0/24" \
    "$FT" "${args[@]}" -o "$tmp/two" > "$tmp/out.txt" 2>&1
rc=$?
tx1=$(ip netns exec "$nsa" cat /sys/class/net/ftv/statistics/tx_bytes)
if [ $rc -ne 0 ]; then fail two_namespaces "exit $rc: $(tail -20 "$tmp/out.txt")"; exit 0; fi
$PY - "$tmp/one/metrics.jsonl" "$tmp/two/metrics.jsonl" <<'EOF' && pass tcp_two_hosts_losses || fail tcp_two_hosts_losses "$(cat "$tmp/one/metrics.jsonl" "$tmp/two/metrics.jsonl")"
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 4
worst = max(abs(x - y) / x for x, y in zip(a, b))
print("max relative difference over %d steps: %.2e" % (len(a), worst))
# as in cli_mpi.sh: only the order of the sums over ranks differs
assert worst <= 1e-5
EOF
# What rank 0's host sent over the veth against what the collectives must
# move: with 2 ranks every all-reduce algorithm (ring: half the buffer in the
# reduce-scatter, half in the all-gather; recursive doubling: the whole
# buffer once) sends each rank's whole 4-byte gradient buffer per step, and
# the start broadcasts rank 0's initial values once: 5 x 4 x trainable bytes.
# Within 10% above it: TCP/IP headers (~3% at 1500-byte frames), MPI's
# handshakes and the few small all-reduces of counts and losses.
n=$(sed -n 's/^trainable parameters: //p' "$tmp/out.txt")
want=$((5 * 4 * ${n:-0}))
echo "namespace $nsa sent $((tx1 - tx0)) bytes on its veth; the collectives' payload is $want bytes"
[ -n "$n" ] && [ $((tx1 - tx0)) -ge $want ] && [ $((tx1 - tx0)) -le $((want + want / 10)) ] &&
    pass wire_bytes_match_the_collectives || fail wire_bytes_match_the_collectives "sent $((tx1 - tx0)) bytes, expected $want (+10%)"

# --grad-accum 2 communicates once per optimizer step: the same bytes on the veth for the same steps
tx0=$(ip netns exec "$nsa" cat /sys/class/net/ftv/statistics/tx_bytes)
timeout 120 mpirun --hostfile "$tmp/hosts" -np 2 --mca plm_rsh_agent "$tmp/agent.sh" \
    --mca routed direct --mca oob_tcp_if_include "$net.0/24" --mca btl self,tcp --mca btl_tcp_if_include "$net.0/24" \
    "$FT" "${args[@]}" --grad-accum 2 -o "$tmp/accum" > "$tmp/out.txt" 2>&1
rc=$?
tx1=$(ip netns exec "$nsa" cat /sys/class/net/ftv/statistics/tx_bytes)
echo "with --grad-accum 2: $((tx1 - tx0)) bytes"
[ $rc -eq 0 ] && [ $((tx1 - tx0)) -ge $want ] && [ $((tx1 - tx0)) -le $((want + want / 10)) ] &&
    pass grad_accum_communicates_once_per_step || fail grad_accum_communicates_once_per_step "exit $rc, sent $((tx1 - tx0)) bytes, expected $want (+10%): $(tail -5 "$tmp/out.txt")"
exit 0
