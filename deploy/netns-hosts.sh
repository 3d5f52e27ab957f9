#!/usr/bin/env bash
# Emulated hosts on one Linux machine: one network namespace per host, each
# with a veth pair whose other end sits on a bridge in a "switch" namespace,
# and its own IPv4 address. Nothing is added to the machine's own namespace.
# Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2.
#
#   deploy/netns-hosts.sh up   --prefix P --subnet A.B.C HOST=OCTET [HOST=OCTET ...]
#   deploy/netns-hosts.sh down --prefix P [--kill]
#   deploy/netns-hosts.sh check
#
# up:    creates namespaces P-sw (bridge br0) and P-HOST for each HOST; HOST gets
#        eth0 = A.B.C.OCTET/24 and a working loopback. Prints "HOST NAMESPACE ADDRESS"
#        per host. Run a process on a host with: ip netns exec P-HOST <command>
# down:  deletes every namespace named P-*. With --kill it first sends SIGKILL to
#        the processes still inside them (by PID, as listed by `ip netns pids`).
# check: exits 0 if namespaces, bridges and veth pairs can be created here (creates
#        and deletes one namespace).
#
# Example (what tests/test_deploy_multihost.py does):
#   deploy/netns-hosts.sh up --prefix pf1 --subnet 10.213.7 link=1 node1=11 node2=12 node3=13
#   ip netns exec pf1-link deploy/start-superlink.sh --host 0.0.0.0 ...
#   ip netns exec pf1-node1 deploy/start-supernode.sh --superlink 10.213.7.1:8000 ...
#   deploy/netns-hosts.sh down --prefix pf1 --kill
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
die() { echo "netns-hosts.sh: $*" >&2; exit 2; }

cmd="${1:-}"; [[ $# -gt 0 ]] && shift
[[ "$cmd" == "-h" || "$cmd" == "--help" ]] && { usage; exit 0; }
prefix=""; subnet=""; kill=0; hosts=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --prefix) prefix="$2"; shift 2 ;;
        --subnet) subnet="$2"; shift 2 ;;
        --kill) kill=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *=*) hosts+=("$1"); shift ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
command -v ip >/dev/null || die "iproute2 ('ip') not found"

ours() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}-" || true; }

case "$cmd" in
    check)
        ns="pfcheck-$$"
        ip netns add "$ns" 2>/dev/null || { echo "cannot create network namespaces here" >&2; exit 1; }
        if ! { ip -n "$ns" link set lo up && ip -n "$ns" link add br0 type bridge \
               && ip -n "$ns" link add va type veth peer name vb; } 2>/dev/null; then
            ip netns del "$ns"
            echo "namespaces work, but bridges or veth pairs cannot be created here" >&2
            exit 1
        fi
        ip netns del "$ns"
        ;;
    up)
        [[ "$prefix" =~ ^[a-zA-Z0-9]{1,8}$ ]] || die "--prefix: 1-8 letters/digits"
        [[ "$subnet" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--subnet A.B.C (a /24)"
        [[ ${#hosts[@]} -gt 0 ]] || die "no HOST=OCTET given"
        [[ -z "$(ours)" ]] || die "namespaces ${prefix}-* already exist; run down first"
        # Validate every HOST=OCTET before creating anything (die does not fire the ERR trap).
        declare -A seen_name=() seen_octet=()
        for h in "${hosts[@]}"; do
            name="${h%%=*}"; octet="${h#*=}"
            [[ "$name" =~ ^[a-zA-Z0-9]+$ ]] || die "host name '$name': letters/digits only"
            [[ "$name" != sw ]] || die "host name 'sw' is taken by the switch namespace ${prefix}-sw"
            [[ "$octet" =~ ^[1-9][0-9]{0,2}$ && "$octet" -le 254 ]] || die "host '$name': octet 1..254"
            [[ -z "${seen_name[$name]:-}" ]] || die "host name '$name' given twice"
            [[ -z "${seen_octet[$octet]:-}" ]] || die "octet $octet given twice (${seen_octet[$octet]} and $name)"
            seen_name[$name]=1; seen_octet[$octet]="$name"
        done
        trap 'echo "netns-hosts.sh: up failed, removing ${prefix}-*" >&2; for n in $(ours); do ip netns del "$n"; done' ERR
        sw="${prefix}-sw"
        ip netns add "$sw"
        ip -n "$sw" link set lo up
        ip -n "$sw" link add br0 type bridge
        ip -n "$sw" link set br0 up
        i=0
        for h in "${hosts[@]}"; do
            name="${h%%=*}"; octet="${h#*=}"
            ns="${prefix}-${name}"
            ip netns add "$ns"
            ip link add eth0 netns "$ns" type veth peer name "v$i" netns "$sw"
            ip -n "$sw" link set "v$i" master br0
            ip -n "$sw" link set "v$i" up
            ip -n "$ns" addr add "$subnet.$octet/24" dev eth0
            ip -n "$ns" link set eth0 up
            ip -n "$ns" link set lo up
            echo "$name $ns $subnet.$octet"
            i=$((i + 1))
        done
        ;;
    down)  # the same check as up: the prefix is a regex in ours(), and '.' would match every namespace
        [[ "$prefix" =~ ^[a-zA-Z0-9]{1,8}$ ]] || die "--prefix: 1-8 letters/digits"
        for ns in $(ours); do
            if [[ $kill == 1 ]]; then
                for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
            fi
            ip netns del "$ns"
        done
        ;;
    *) usage; exit 2 ;;
esac
