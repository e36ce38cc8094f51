#!/usr/bin/env bash
# Two emulated machines on one: a real 2-node torchrun over a rate-limited link.
#
#   benchmarks/netns_torchrun.sh RATE NPROC_PER_NODE TAG -- tierec-args...   (NETNS_MODULE: another -m module)
#   e.g. benchmarks/netns_torchrun.sh 100mbit 2 t1 -- train --run-dir /tmp/r --set train.max_steps=20
#
# Makes network namespaces tierec-TAG-0 and tierec-TAG-1 joined by a veth pair
# (10.231.0.1 and 10.231.0.2, the pair's own addresses only), limits both
# directions with a token bucket (tc tbf; netem is not available on these
# machines), starts `torchrun --nnodes 2 --node_rank i` inside each namespace
# (node 0 hosts the rendezvous) and waits for both. The namespaces (and with
# them the veth pair and its qdiscs) are removed on every exit: success,
# failure, Ctrl-C or a kill. Needs root, ip and tc (iproute2).
# Exit status: 0 when both nodes succeeded, else the first non-zero one.
set -euo pipefail

if [[ $# -lt 4 || "$4" != "--" ]]; then
    echo "usage: $0 RATE NPROC_PER_NODE TAG -- tierec-args..." >&2
    exit 2
fi
RATE=$1 NPROC=$2 TAG=$3
shift 4
PYTHON=${PYTHON:-python}
PORT=${NETNS_PORT:-29533}
NS=("tierec-$TAG-0" "tierec-$TAG-1")
DEV=("trv0-$TAG" "trv1-$TAG")
ADDR=(10.231.0.1 10.231.0.2)
PIDS=()
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/tierec-netns-XXXXXX")  # the agents' temp files (torchelastic_* logs); removed at exit

cleanup() {
    local pid ns
    for pid in "${PIDS[@]}"; do kill -TERM -- "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$SCRATCH"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The token bucket must hold a few full-size (GSO) packets: 2 ms of the rate, at least 64 KiB.
rate_bits=$(python3 -c "import re,sys; m=re.fullmatch(r'(\d+)([kmg]?)bit', sys.argv[1]); print(int(m[1]) * {'': 1, 'k': 10**3, 'm': 10**6, 'g': 10**9}[m[2]])" "$RATE")
burst=$(( rate_bits / 8 / 500 ))
(( burst < 65536 )) && burst=65536

for ns in "${NS[@]}"; do ip netns add "$ns"; done
ip link add "${DEV[0]}" netns "${NS[0]}" type veth peer name "${DEV[1]}" netns "${NS[1]}"
for i in 0 1; do
    ip -n "${NS[$i]}" link set lo up
    ip -n "${NS[$i]}" addr add "${ADDR[$i]}/24" dev "${DEV[$i]}"
    ip -n "${NS[$i]}" link set "${DEV[$i]}" up
    ip netns exec "${NS[$i]}" tc qdisc add dev "${DEV[$i]}" root tbf rate "$RATE" burst "$burst" latency 100ms
done

for i in 0 1; do
    ip netns exec "${NS[$i]}" env GLOO_SOCKET_IFNAME="${DEV[$i]}" TP_SOCKET_IFNAME="${DEV[$i]}" TMPDIR="$SCRATCH" \
        "$PYTHON" -m torch.distributed.run --nnodes 2 --node_rank "$i" --nproc_per_node "$NPROC" \
        --master_addr "${ADDR[0]}" --master_port "$PORT" -m "${NETNS_MODULE:-tierec}" "$@" &
    PIDS+=($!)
done
status=0
for pid in "${PIDS[@]}"; do
    rc=0
    wait "$pid" || rc=$?
    if (( status == 0 )); then status=$rc; fi
done
PIDS=()
exit "$status"
