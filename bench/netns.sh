# netns.sh — sourced by the benchmarks that run traffic across a veth pair (xdp_bench.sh,
# stream_bench.sh, spark_bench.sh).
#
# For: the one topology they share: a server and a client network namespace joined by a veth
# pair, each end with its IPv4 address (/24) and up, loopback up in both.
# Not for: what a benchmark adds on top (XDP programs, NAPI steering) or removing the
# namespaces: each script deletes its own in its EXIT trap, so a failed run leaves nothing.

# veth_namespaces SRV_NS CLI_NS SRV_DEV CLI_DEV SRV_V4 CLI_V4
veth_namespaces() {
    local srv=$1 cli=$2 vs=$3 vc=$4 v4s=$5 v4c=$6
    ip netns add "$srv"
    ip netns add "$cli"
    ip link add "$vs" type veth peer name "$vc"
    ip link set "$vs" netns "$srv"
    ip link set "$vc" netns "$cli"
    ip -n "$srv" addr add "$v4s/24" dev "$vs"
    ip -n "$cli" addr add "$v4c/24" dev "$vc"
    for ns in "$srv" "$cli"; do ip -n "$ns" link set lo up; done
    ip -n "$srv" link set "$vs" up
    ip -n "$cli" link set "$vc" up
}
