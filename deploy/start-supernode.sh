#!/usr/bin/env bash
# Start one Flower SuperNode for privfed (one data owner), with TLS and node
# authentication. Runs in the foreground (exec), so `... &` gives you its PID.
#
#   deploy/start-supernode.sh --superlink HOST:PORT --partition-id I --num-partitions N
#                             [--key FILE] [--ca FILE] [--port PORT] [--flwr-home DIR]
#                             [--data-dir DIR] [--state-dir DIR] [--isolation MODE]
#                             [--node-config 'k=v ...'] [--insecure]
#
#   --superlink HOST:PORT  the SuperLink's Fleet address (HOST must be one of the
#                          SuperLink certificate's SANs)
#   --partition-id I       this node's data partition, 0..N-1
#   --num-partitions N     number of partitions (= SuperNodes = run config num-clients)
#   --key FILE             this node's private key (make-certs.sh: supernode-<I+1>.key);
#                          its .pub must be registered first:
#                          flwr supernode register <FILE without .key>.pub <connection>
#   --ca FILE              CA certificate that signed the SuperLink's (default
#                          deploy/certs/ca.crt)
#   --port PORT            this SuperNode's local Runtime API port (default 9094);
#                          every SuperNode on one host needs its own
#   --host HOST            address the Runtime API binds (default 127.0.0.1; 0.0.0.0
#                          when a flower-superexec in another container connects)
#   --flwr-home DIR        this SuperNode's FLWR_HOME (installed apps, logs); default
#                          ${XDG_STATE_HOME:-~/.local/state}/privfed/supernode-<I>.
#                          Never share it between SuperNodes, and keep it out of the
#                          app folder (`flwr run .` would pack the installed apps).
#   --data-dir DIR         where this node's dataset files live; passed to the ClientApp
#                          as node config data-dir (beats the run config's data-dir)
#   --state-dir DIR        where this node keeps its privacy ledger and other state
#                          that must survive restarts (default <flwr-home>/state)
#   --isolation MODE       subprocess (default: the SuperNode spawns the ClientApp) or
#                          process (a separate flower-superexec connects to --port)
#   --node-config STR      extra node config entries, appended verbatim
#   --insecure             plain HTTP, no node key (only against an --insecure SuperLink)
#
# Paths given to --data-dir/--state-dir are made absolute and must not contain
# spaces or double quotes (they travel inside Flower's node-config string).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
superlink=""
partition_id=""
num_partitions=""
key=""
ca="$here/certs/ca.crt"
port=9094
host=127.0.0.1
flwr_home=""
data_dir=""
state_dir=""
isolation=subprocess
extra_config=""
insecure=0

while [[ $# -gt 0 ]]; do
    case "$1" in
        --superlink) superlink="$2"; shift 2 ;;
        --partition-id) partition_id="$2"; shift 2 ;;
        --num-partitions) num_partitions="$2"; shift 2 ;;
        --key) key="$2"; shift 2 ;;
        --ca) ca="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --host) host="$2"; shift 2 ;;
        --flwr-home) flwr_home="$2"; shift 2 ;;
        --data-dir) data_dir="$2"; shift 2 ;;
        --state-dir) state_dir="$2"; shift 2 ;;
        --isolation) isolation="$2"; shift 2 ;;
        --node-config) extra_config="$2"; shift 2 ;;
        --insecure) insecure=1; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "start-supernode.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

die() { echo "start-supernode.sh: $*" >&2; exit 2; }
[[ -n "$superlink" ]] || die "--superlink HOST:PORT is required"
# no leading zeros: bash reads 08 as octal, Flower's node-config parser refuses 07
[[ "$partition_id" =~ ^(0|[1-9][0-9]*)$ ]] || die "--partition-id must be an integer >= 0 (no leading zeros)"
[[ "$num_partitions" =~ ^[1-9][0-9]*$ ]] || die "--num-partitions must be an integer >= 1 (no leading zeros)"
(( partition_id < num_partitions )) || die "--partition-id $partition_id is not below --num-partitions $num_partitions"
[[ "$isolation" == subprocess || "$isolation" == process ]] || die "--isolation is subprocess or process"
command -v flower-supernode >/dev/null || {
    echo "start-supernode.sh: flower-supernode not found; activate the environment where privfed is installed" >&2
    exit 1
}

abspath() { mkdir -p "$1" && (cd "$1" && pwd); }
checkpath() { [[ "$1" != *[[:space:]\"]* ]] || die "path '$1' must not contain spaces or quotes"; }

[[ -n "$flwr_home" ]] || flwr_home="${XDG_STATE_HOME:-$HOME/.local/state}/privfed/supernode-$partition_id"
flwr_home="$(abspath "$flwr_home")"
[[ -n "$state_dir" ]] || state_dir="$flwr_home/state"
state_dir="$(abspath "$state_dir")"
checkpath "$state_dir"
node_config="partition-id=$partition_id num-partitions=$num_partitions state-dir=\"$state_dir\""
if [[ -n "$data_dir" ]]; then
    [[ -d "$data_dir" ]] || die "--data-dir '$data_dir' is not a folder"
    data_dir="$(cd "$data_dir" && pwd)"
    checkpath "$data_dir"
    node_config+=" data-dir=\"$data_dir\""
fi
for name in partition-id num-partitions state-dir data-dir; do  # Flower's parser would fail on a repeat, obscurely
    [[ " $extra_config" =~ [[:space:]]$name= ]] && die "--node-config sets $name, which has its own option (--$name)"
done
entries='^[[:space:]]*([A-Za-z0-9_.-]+=("[^"]*"|[^[:space:]"]+)[[:space:]]*)+$'
# Flower drops a token without '=' silently: 'max-epsilon 2' would start a node with no privacy cap
[[ -z "$extra_config" || "$extra_config" =~ $entries ]] \
    || die "--node-config '$extra_config': every entry must be key=value (e.g. max-epsilon=2), quoted values without quotes inside"
[[ -n "$extra_config" ]] && node_config+=" $extra_config"

export FLWR_HOME="$flwr_home"
export FLWR_DISABLE_UPDATE_CHECK=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

args=(--superlink "$superlink" --host "$host" --port "$port" --isolation "$isolation"
      --node-config "$node_config")
if [[ $insecure == 1 ]]; then
    args+=(--insecure)
else
    [[ -s "$ca" ]] || die "CA certificate '$ca' not found (--ca)"
    [[ -n "$key" ]] || die "--key FILE is required (or --insecure)"
    [[ -s "$key" ]] || die "node key '$key' not found"
    args+=(--root-certificates "$ca" --auth-supernode-private-key "$key")
fi

echo "start-supernode.sh: node config: $node_config" >&2
exec flower-supernode "${args[@]}"
