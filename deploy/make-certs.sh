#!/usr/bin/env bash
# Make the TLS and node-authentication material for a privfed deployment.
#
#   deploy/make-certs.sh [-o DIR] [-n NUM_NODES] [--san SAN]... [--docker] [--force]
#
# Writes into DIR (default: deploy/certs next to this script):
#   ca.crt, ca.key            a private certificate authority (EC P-384, 10 years)
#   server.pem, server.key    the SuperLink certificate, signed by the CA, with
#                             subjectAltName = DNS:localhost, IP:127.0.0.1 plus every
#                             --san (e.g. --san DNS:superlink --san IP:10.0.0.5)
#   server.san                the SAN list the certificate was made for
#   supernode-I.key           SuperNode I's private key (OpenSSH format, ECDSA P-384),
#   supernode-I.pub           and its public key, for I = 1..NUM_NODES (default 3):
#                             `flwr supernode register supernode-I.pub <connection>`
#                             on the SuperLink side, `--auth-supernode-private-key
#                             supernode-I.key` on the SuperNode side.
#
# Idempotent: an existing CA and existing node keys are kept; the SuperLink
# certificate is re-issued only when SANs are added, it no longer verifies
# against the CA, or --force is given. Without --force the SANs recorded in
# server.san are kept (a plain re-run never drops one); --force re-issues the
# server certificate for exactly the default and --san SANs (delete the folder
# to start from scratch).
#
# --docker makes server.key and supernode-*.key readable by the containers'
# non-root user (uid 49999 in the official flwr images; compose bind-mounts each
# file on its own). The folder itself stays 0700, so on the host only you can
# reach them; a later run without --docker leaves those modes as they are (new
# keys are 0600). ca.key always stays 0600 and is never mounted anywhere.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$here/certs"
num_nodes=3
docker_mode=0
force=0
extra_sans=()

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        -o|--out) out="$2"; shift 2 ;;
        -n|--num-nodes) num_nodes="$2"; shift 2 ;;
        --san) extra_sans+=("$2"); shift 2 ;;
        --docker) docker_mode=1; shift ;;
        --force) force=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "make-certs.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

if ! [[ "$num_nodes" =~ ^[0-9]+$ ]]; then
    echo "make-certs.sh: --num-nodes must be a non-negative integer, got '$num_nodes'" >&2
    exit 2
fi
for s in "${extra_sans[@]+"${extra_sans[@]}"}"; do
    if ! [[ "$s" =~ ^(DNS|IP):[^,[:space:]]+$ ]]; then
        echo "make-certs.sh: --san takes DNS:<name> or IP:<address>, got '$s'" >&2
        exit 2
    fi
done
command -v openssl >/dev/null || { echo "make-certs.sh: openssl not found" >&2; exit 1; }

umask 077
mkdir -p "$out"
chmod 700 "$out"
cd "$out"

# SAN list: defaults first, then (unless --force) those recorded in server.san,
# so that a plain re-run keeps what exists, then extras; without duplicates,
# comma separated.
sans="DNS:localhost,IP:127.0.0.1"
recorded_sans=()
if [[ $force == 0 && -s server.san ]]; then
    IFS=, read -r -a recorded_sans <server.san || true
fi
for s in "${recorded_sans[@]+"${recorded_sans[@]}"}" "${extra_sans[@]+"${extra_sans[@]}"}"; do
    case ",$sans," in *",$s,"*) ;; *) sans="$sans,$s" ;; esac
done

# --- CA ------------------------------------------------------------------
if [[ -s ca.key && -s ca.crt ]]; then
    echo "CA: keeping $out/ca.crt"
elif [[ -s ca.key ]]; then  # a new key would orphan every certificate and ca.crt already handed out
    echo "make-certs: $out/ca.key exists without ca.crt: restore ca.crt (the nodes trust it), or move ca.key" \
        "away to start a new CA (then re-deploy ca.crt to every node)" >&2
    exit 1
else
    openssl ecparam -name secp384r1 -genkey -noout -out ca.key
    openssl req -x509 -new -key ca.key -sha384 -days 3650 \
        -subj "/O=privfed/CN=privfed deployment CA" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -addext "subjectKeyIdentifier=hash" \
        -out ca.crt
    rm -f server.pem server.san  # a new CA invalidates the old server certificate
    echo "CA: created $out/ca.crt"
fi

# --- SuperLink certificate -------------------------------------------------
reissue=$force
if [[ ! -s server.pem || ! -s server.key || ! -s server.san ]]; then
    reissue=1
elif [[ "$(cat server.san)" != "$sans" ]]; then
    reissue=1
elif ! openssl verify -CAfile ca.crt server.pem >/dev/null 2>&1; then
    reissue=1
fi
if [[ $reissue == 1 ]]; then
    [[ -s server.key ]] || openssl ecparam -name secp384r1 -genkey -noout -out server.key
    ext="$(mktemp)"
    trap 'rm -f "$ext" server.csr' EXIT
    cat >"$ext" <<EOF
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
subjectAltName = $sans
EOF
    openssl req -new -key server.key -sha384 -subj "/O=privfed/CN=privfed SuperLink" -out server.csr
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
        -sha384 -days 825 -extfile "$ext" -out server.pem 2>/dev/null
    rm -f server.csr ca.srl
    printf '%s\n' "$sans" >server.san
    echo "SuperLink certificate: issued $out/server.pem for $sans"
else
    echo "SuperLink certificate: keeping $out/server.pem ($sans)"
fi
openssl verify -CAfile ca.crt server.pem >/dev/null

# --- SuperNode key pairs ---------------------------------------------------
make_node_key() {  # $1 = basename without extension: a new pair, $1.key and $1.pub
    if command -v ssh-keygen >/dev/null; then
        ssh-keygen -q -t ecdsa -b 384 -N "" -C "privfed-$1" -f "$1.key"
        mv "$1.key.pub" "$1.pub"
    else
        node_key_tool new "$1"
    fi
}
node_pub_from_key() {  # $1 = basename: rewrite $1.pub from the existing private key $1.key
    if command -v ssh-keygen >/dev/null; then
        printf '%s privfed-%s\n' "$(ssh-keygen -y -f "$1.key")" "$1" >"$1.pub"
    else
        node_key_tool pub "$1"
    fi
}
node_key_tool() {  # $1 = new|pub, $2 = basename: the same OpenSSH formats without ssh-keygen
    python3 - "$@" <<'EOF'  # cryptography ships with flwr
import sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
mode, name = sys.argv[1:3]
if mode == "new":
    key = ec.generate_private_key(ec.SECP384R1())
    with open(f"{name}.key", "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                  serialization.NoEncryption()))
else:
    with open(f"{name}.key", "rb") as f:
        key = serialization.load_ssh_private_key(f.read(), password=None)
with open(f"{name}.pub", "wb") as f:
    f.write(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            + f" privfed-{name}\n".encode())
EOF
}
for ((i = 1; i <= num_nodes; i++)); do
    name="supernode-$i"
    if [[ -s "$name.key" && -s "$name.pub" ]]; then
        echo "SuperNode key $i: keeping $out/$name.key"
    elif [[ -s "$name.key" ]]; then  # the registered private key stays: only its public half is rebuilt
        node_pub_from_key "$name"
        echo "SuperNode key $i: keeping $out/$name.key; rebuilt its missing $name.pub"
    else
        rm -f "$name.key" "$name.pub"
        make_node_key "$name"
        echo "SuperNode key $i: created $out/$name.key (+ .pub)"
    fi
done

# --- permissions -------------------------------------------------------------
chmod 600 ca.key
chmod 644 ca.crt server.pem server.san ./*.pub 2>/dev/null || true
if [[ $docker_mode == 1 ]]; then
    chmod 644 server.key supernode-*.key 2>/dev/null || true
    echo "--docker: server.key and supernode-*.key are readable by container users; $out stays 0700"
fi
