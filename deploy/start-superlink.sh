#!/usr/bin/env bash
# Start a Flower SuperLink for privfed with TLS and SuperNode authentication.
# Runs in the foreground (exec), so `start-superlink.sh ... &` gives you its PID.
#
#   deploy/start-superlink.sh [--certs DIR] [--host HOST] [--port PORT]
#                             [--flwr-home DIR] [--database FILE] [--workdir DIR]
#                             [--log-file FILE] [--data-dir DIR] [--insecure]
#
#   --certs DIR      folder written by deploy/make-certs.sh (default: deploy/certs);
#                    uses ca.crt, server.pem, server.key
#   --host HOST      address to bind; 127.0.0.1 (default) for one host, 0.0.0.0 when
#                    SuperNodes run on other hosts (their address must be one of
#                    the certificate's SANs: make-certs.sh --san)
#   --port PORT      the one HTTP(S) port serving the Fleet, Control and Runtime
#                    APIs (default 8000)
#   --flwr-home DIR  this SuperLink's FLWR_HOME (installed apps, logs; default
#                    ${XDG_STATE_HOME:-~/.local/state}/privfed/superlink)
#   --database FILE  SQLite file for the SuperLink state (registered node keys,
#                    runs); default $FLWR_HOME/superlink.db. ':flwr-in-memory:'
#                    keeps it in memory (then registrations vanish on restart).
#                    A relative FILE (also for --log-file) is taken relative to
#                    the current directory, not to --workdir.
#   --workdir DIR    working directory of the SuperLink, and hence of the ServerApp
#                    processes it spawns: relative run-config paths such as
#                    results-dir=results resolve against it (default: current dir)
#   --data-dir DIR   the data folder of the ServerApp processes, which load the
#                    federation and the test set they evaluate on (exported as
#                    PRIVFED_DATA_DIR; default: the caller's PRIVFED_DATA_DIR, else
#                    <workdir>/data)
#   --insecure       plain HTTP and no node authentication (debugging only)
#
# Flower's own environment switches are set for offline use: no update check,
# no telemetry, no runtime dependency installation (install the app's
# dependencies into this Python environment beforehand: pip install -e .).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
certs="$here/certs"
host=127.0.0.1
port=8000
flwr_home="${XDG_STATE_HOME:-$HOME/.local/state}/privfed/superlink"
database=""
workdir="$PWD"
log_file=""
data_dir=""
insecure=0

while [[ $# -gt 0 ]]; do
    case "$1" in
        --certs) certs="$2"; shift 2 ;;
        --host) host="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --flwr-home) flwr_home="$2"; shift 2 ;;
        --database) database="$2"; shift 2 ;;
        --workdir) workdir="$2"; shift 2 ;;
        --log-file) log_file="$2"; shift 2 ;;
        --data-dir) data_dir="$2"; shift 2 ;;
        --insecure) insecure=1; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "start-superlink.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

command -v flower-superlink >/dev/null || {
    echo "start-superlink.sh: flower-superlink not found; activate the environment where privfed is installed" >&2
    exit 1
}

mkdir -p "$flwr_home"
flwr_home="$(cd "$flwr_home" && pwd)"
[[ -n "$database" ]] || database="$flwr_home/superlink.db"
# Like --certs and --flwr-home, a relative --database / --log-file is relative to the
# caller's directory, not to --workdir: make them absolute before the `cd` below.
case "$database" in /*|:*) ;; *) database="$PWD/$database" ;; esac
[[ -z "$log_file" || "$log_file" == /* ]] || log_file="$PWD/$log_file"
if [[ -n "$data_dir" ]]; then
    [[ -d "$data_dir" ]] || { echo "start-superlink.sh: --data-dir $data_dir is not a folder" >&2; exit 2; }
    export PRIVFED_DATA_DIR="$(cd "$data_dir" && pwd)"
fi
export FLWR_HOME="$flwr_home"
export FLWR_DISABLE_UPDATE_CHECK=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

args=(--host "$host" --port "$port" --database "$database" --disable-runtime-dependency-installation)
[[ -n "$log_file" ]] && args+=(--log-file "$log_file")
if [[ $insecure == 1 ]]; then
    args+=(--insecure)
else
    [[ -d "$certs" ]] || { echo "start-superlink.sh: --certs $certs is not a folder; run deploy/make-certs.sh" >&2; exit 1; }
    certs="$(cd "$certs" && pwd)"
    for f in ca.crt server.pem server.key; do
        [[ -s "$certs/$f" ]] || { echo "start-superlink.sh: $certs/$f missing; run deploy/make-certs.sh" >&2; exit 1; }
    done
    args+=(--ssl-ca-certfile "$certs/ca.crt" --ssl-certfile "$certs/server.pem"
           --ssl-keyfile "$certs/server.key" --enable-supernode-auth)
fi

cd "$workdir"
exec flower-superlink "${args[@]}"
