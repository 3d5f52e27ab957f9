#!/usr/bin/env bash
# A whole privfed federation on one host (loopback): TLS, node authentication,
# one SuperLink and N SuperNodes, each with its own port, FLWR_HOME, data
# partition and state folder.
#
#   deploy/local-federation.sh start [-n N] [--port PORT] [--node-port-base PORT]
#                                    [--run-dir DIR] [--certs DIR] [--data-dir DIR]
#                                    [--connection NAME] [--workdir DIR]
#   deploy/local-federation.sh status [--run-dir DIR] [--connection NAME]
#   deploy/local-federation.sh stop   [--run-dir DIR]
#
# start:
#   1. deploy/make-certs.sh -o CERTS -n N          (CA, SuperLink cert, node keys)
#   2. deploy/start-superlink.sh on 127.0.0.1:PORT  (TLS + --enable-supernode-auth)
#   3. writes the connection NAME (default privfed-local) into $FLWR_HOME/config.toml
#      (FLWR_HOME of this shell, default ~/.flwr: the one `flwr run` will read)
#   4. flwr supernode register CERTS/supernode-I.pub NAME   for I = 1..N
#   5. deploy/start-supernode.sh for partition I-1 of N on port NODE_PORT_BASE+I-1
#   6. waits until the N SuperNodes are online, then prints the `flwr run` line
#   The PIDs go to RUN_DIR/pids and logs to RUN_DIR/*.log; SuperLink state,
#   each SuperNode's FLWR_HOME and its state folder (privacy ledger) live in
#   RUN_DIR/superlink and RUN_DIR/supernode-I and survive stop/start.
#   A start that fails (or is interrupted) stops what it had started; a port
#   already in use (PORT, or a SuperNode port) is refused before anything starts.
# stop: stops exactly the processes in RUN_DIR/pids and their children, provided
#   each still is one of this run's (its command line names RUN_DIR), so a PID
#   reused by another process is left alone.
#
# Defaults: N=3, PORT=8000, NODE_PORT_BASE=9094, RUN_DIR=.flwr/deploy (inside the
# repository but ignored by git and left out of the FAB that `flwr run .` packs),
# CERTS=deploy/certs, WORKDIR=current directory (the ServerApp's working
# directory: results-dir=results lands in WORKDIR/results).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
action="${1:-}"
[[ $# -gt 0 ]] && shift
if [[ "$action" == -h || "$action" == --help ]]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0
fi
num=3
port=8000
node_port_base=9094
run_dir="$(dirname "$here")/.flwr/deploy"
certs="$here/certs"
data_dir=""
connection="privfed-local"
workdir="$PWD"
wait_s=60

while [[ $# -gt 0 ]]; do
    case "$1" in
        -n|--num-nodes) num="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --node-port-base) node_port_base="$2"; shift 2 ;;
        --run-dir) run_dir="$2"; shift 2 ;;
        --certs) certs="$2"; shift 2 ;;
        --data-dir) data_dir="$2"; shift 2 ;;
        --connection) connection="$2"; shift 2 ;;
        --workdir) workdir="$2"; shift 2 ;;
        --wait) wait_s="$2"; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "local-federation.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

export FLWR_DISABLE_UPDATE_CHECK=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
cli_home="${FLWR_HOME:-$HOME/.flwr}"
mkdir -p "$run_dir"
run_dir="$(cd "$run_dir" && pwd)"
pids_file="$run_dir/pids"

log() { echo "[local-federation] $*"; }
alive() { kill -0 "$1" 2>/dev/null; }
# Alive and still one of ours: each process that start launches names $run_dir/ in its
# command line (--flwr-home, --database, --state-dir), a reused PID does not.
# (No `tr | grep -q` pipeline: under pipefail an early grep exit could read as "not ours".)
ours() { alive "$1" && [[ "$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null)" == *"$run_dir/"* ]]; }

descendants() {  # all descendants of PID $1 (children first walked breadth-first)
    local queue=("$1") out=() p c
    while [[ ${#queue[@]} -gt 0 ]]; do
        p="${queue[0]}"; queue=("${queue[@]:1}")
        for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do
            out+=("$c"); queue+=("$c")
        done
    done
    echo "${out[@]+"${out[@]}"}"
}

do_stop() {
    [[ -f "$pids_file" ]] || { log "nothing to stop ($pids_file not found)"; return 0; }
    local targets=() name pid d
    while read -r name pid; do
        [[ -n "${pid:-}" ]] || continue
        if ours "$pid"; then
            # Children first recorded, so that none is orphaned before we saw it.
            for d in $(descendants "$pid"); do targets+=("$d"); done
            targets+=("$pid")
            log "stopping $name (pid $pid)"
        fi
    done <"$pids_file"
    if [[ ${#targets[@]} -gt 0 ]]; then
        kill -TERM "${targets[@]}" 2>/dev/null || true
        for _ in $(seq 1 50); do
            local left=()
            for pid in "${targets[@]}"; do alive "$pid" && left+=("$pid"); done
            [[ ${#left[@]} -eq 0 ]] && break
            sleep 0.2
        done
        for pid in "${targets[@]}"; do
            if alive "$pid"; then log "pid $pid ignored SIGTERM; sending SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
        done
    fi
    rm -f "$pids_file"
    log "stopped"
}

write_connection() {  # name address ca
    python - "$cli_home/config.toml" "$1" "$2" "$3" <<'EOF'
import sys, tomllib
from pathlib import Path
import tomli_w  # a dependency of flwr
path, name, address, ca = Path(sys.argv[1]), *sys.argv[2:]
cfg = tomllib.loads(path.read_text()) if path.exists() else {}
links = cfg.setdefault("superlink", {})
links.setdefault("default", name)
links[name] = {"address": address, "root-certificates": ca}
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(tomli_w.dumps(cfg))
print(f"[local-federation] connection '{name}' -> {address} written to {path}")
EOF
}

online_count() {
    flwr supernode ls "$connection" --format json 2>/dev/null | python -c '
import json, sys
try:
    nodes = json.loads(sys.stdin.read())["nodes"]
except Exception:
    print(0); raise SystemExit
print(sum(1 for n in nodes if n.get("status") == "online"))' 2>/dev/null || echo 0
}

do_start() {
    [[ "$num" =~ ^[0-9]+$ && "$num" -ge 1 ]] || { echo "local-federation.sh: -n must be >= 1" >&2; exit 2; }
    if [[ -f "$pids_file" ]]; then
        while read -r name pid; do
            if [[ -n "${pid:-}" ]] && ours "$pid"; then
                echo "local-federation.sh: already running ($name pid $pid); run '$0 stop --run-dir $run_dir' first" >&2
                exit 1
            fi
        done <"$pids_file"
        rm -f "$pids_file"
    fi
    for tool in flwr flower-superlink flower-supernode python; do
        command -v "$tool" >/dev/null || { echo "local-federation.sh: '$tool' not found; activate privfed's environment" >&2; exit 1; }
    done
    local p
    for p in "$port" $(seq "$node_port_base" $((node_port_base + num - 1))); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "local-federation: port $p on 127.0.0.1 is already in use" >&2
            exit 1
        fi
    done
    local t0=$SECONDS
    "$here/make-certs.sh" -o "$certs" -n "$num"
    certs="$(cd "$certs" && pwd)"
    : >"$pids_file"
    # From here on, any failure (set -e, an explicit exit 1, Ctrl-C) stops what was started.
    started_ok=0
    trap '[[ $started_ok == 1 ]] || { echo "local-federation: start failed; stopping what it started" >&2; do_stop; }' EXIT
    trap 'exit 130' INT TERM

    local dd_args=()  # the ServerApp loads the federation and its test set too
    [[ -n "$data_dir" ]] && dd_args=(--data-dir "$data_dir")
    setsid "$here/start-superlink.sh" --certs "$certs" --host 127.0.0.1 --port "$port" \
        --flwr-home "$run_dir/superlink" --workdir "$workdir" "${dd_args[@]+"${dd_args[@]}"}" \
        >"$run_dir/superlink.log" 2>&1 </dev/null &
    echo "superlink $!" >>"$pids_file"
    local sl_pid=$!
    log "SuperLink pid $sl_pid on 127.0.0.1:$port (log: $run_dir/superlink.log)"
    local ok=0
    for _ in $(seq 1 $((wait_s * 5))); do
        alive "$sl_pid" || break
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then ok=1; break; fi
        sleep 0.2
    done
    if [[ $ok != 1 ]]; then
        echo "local-federation.sh: SuperLink did not come up; see $run_dir/superlink.log" >&2
        tail -n 20 "$run_dir/superlink.log" >&2 || true
        exit 1
    fi

    write_connection "$connection" "127.0.0.1:$port" "$certs/ca.crt"

    local i out try
    for ((i = 1; i <= num; i++)); do
        # The port accepts connections a moment before the API answers: retry.
        for try in $(seq 1 20); do
            if out="$(flwr supernode register "$certs/supernode-$i.pub" "$connection" 2>&1)"; then
                log "registered supernode-$i.pub: $(echo "$out" | grep -o 'SuperNode [0-9]* registered' || echo ok)"
                break
            elif echo "$out" | grep -qi "already"; then
                log "supernode-$i.pub was already registered"
                break
            elif echo "$out" | grep -qi "unavailable" && [[ $try -lt 20 ]]; then
                sleep 0.5
            else
                echo "$out" >&2
                echo "local-federation.sh: could not register supernode-$i.pub" >&2
                exit 1
            fi
        done
    done

    for ((i = 1; i <= num; i++)); do
        setsid "$here/start-supernode.sh" --superlink "127.0.0.1:$port" \
            --partition-id $((i - 1)) --num-partitions "$num" \
            --key "$certs/supernode-$i.key" --ca "$certs/ca.crt" \
            --port $((node_port_base + i - 1)) --flwr-home "$run_dir/supernode-$i" \
            --state-dir "$run_dir/supernode-$i/state" "${dd_args[@]+"${dd_args[@]}"}" \
            >"$run_dir/supernode-$i.log" 2>&1 </dev/null &
        echo "supernode-$i $!" >>"$pids_file"
        log "SuperNode $i pid $! (partition $((i - 1)) of $num, runtime port $((node_port_base + i - 1)), log: $run_dir/supernode-$i.log)"
    done

    local n=0
    for _ in $(seq 1 "$wait_s"); do
        n="$(online_count)"
        [[ "$n" -ge "$num" ]] && break
        while read -r name pid; do
            if ! alive "$pid"; then
                echo "local-federation.sh: $name (pid $pid) exited; see $run_dir/$name.log" >&2
                tail -n 20 "$run_dir/$name.log" >&2 || true
                exit 1
            fi
        done <"$pids_file"
        sleep 1
    done
    if [[ "$n" -lt "$num" ]]; then
        echo "local-federation.sh: only $n of $num SuperNodes online after ${wait_s}s" >&2
        exit 1
    fi
    started_ok=1
    log "federation up: $num SuperNodes online after $((SECONDS - t0))s"
    log "run:  flwr run . $connection --stream --run-config 'num-clients=$num num-rounds=3'"
    log "stop: $0 stop --run-dir $run_dir"
}

do_status() {
    if [[ -f "$pids_file" ]]; then
        while read -r name pid; do
            if ours "$pid"; then echo "$name pid $pid: running"; else echo "$name pid $pid: not running"; fi
        done <"$pids_file"
    else
        echo "no federation recorded in $run_dir"
    fi
    flwr supernode ls "$connection" 2>/dev/null || true
}

case "$action" in
    start) do_start ;;
    stop) do_stop ;;
    status) do_status ;;
    *) echo "usage: $0 start|status|stop [options] (see --help)" >&2; exit 2 ;;
esac
