"""The deployment scripts' failure modes found by an adversarial review (session 11).

No Docker, no network namespaces (network commands are faked), loopback only;
every process a test starts is stopped by PID in a `finally`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
from deploy_helpers import BIN, alive, offline_env

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recorded_pids(run_dir: Path) -> list[int]:
    f = run_dir / "pids"
    if not f.exists():
        return []
    return [int(line.split()[1]) for line in f.read_text().splitlines() if len(line.split()) == 2]


def _stop_federation(run_dir: Path, env: dict[str, str]) -> None:
    pids = _recorded_pids(run_dir)
    subprocess.run([str(DEPLOY / "local-federation.sh"), "stop", "--run-dir", str(run_dir)],
                   env=env, capture_output=True, text=True, timeout=60)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


# --- .ci/run -------------------------------------------------------------------


def test_ci_cleanup_spares_processes_it_did_not_start(tmp_path):
    """.ci/run's EXIT trap SIGKILLs every process whose environment merely *contains*
    `FLWR_HOME=<repo>/.flwr`, e.g. the SuperLink of a running local-federation.sh
    (FLWR_HOME=<repo>/.flwr/deploy/superlink) or another session's test run."""
    text = (ROOT / ".ci/run").read_text()
    m = re.search(r"^cleanup\(\) \{\n.*?^\}\n", text, re.S | re.M)
    assert m, "no cleanup() in .ci/run"
    repo, tag = tmp_path / "repo", f"test-{os.getpid()}-{time.time_ns()}"
    base = {k: v for k, v in os.environ.items() if k != "PRIVFED_CI_TAG"}  # under CI: never our own run's tag
    victim = subprocess.Popen(["sleep", "120"], start_new_session=True,
                              env=dict(base, FLWR_HOME=f"{repo}/.flwr/deploy/superlink"))
    started = subprocess.Popen(["sleep", "120"], start_new_session=True, env=dict(base, PRIVFED_CI_TAG=tag))
    try:
        time.sleep(0.2)
        subprocess.run(["bash", "-c", m.group(0) + "cleanup\n"], timeout=30,
                       env=dict(base, FLWR_HOME=f"{repo}/.flwr", PRIVFED_CI_TAG=tag))
        time.sleep(0.3)
        assert victim.poll() is None, "cleanup() killed a process that .ci/run did not start"
        assert started.poll() is not None, "cleanup() left a process that .ci/run started"
    finally:
        for proc in (victim, started):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


# --- make-certs.sh -----------------------------------------------------------------


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_make_certs_rerun_without_options_keeps_docker_sans_and_key_modes(tmp_path):
    """README section 3 makes deploy/certs with --san DNS:superlink --docker; then
    `local-federation.sh start` re-runs `make-certs.sh -o deploy/certs -n N` ("keeps what
    already exists"), which re-issues server.pem WITHOUT DNS:superlink and chmods the
    mounted keys back to 0600, so the compose TLS overlay breaks."""
    out = tmp_path / "certs"
    mk = str(DEPLOY / "make-certs.sh")
    subprocess.run([mk, "-o", str(out), "-n", "2", "--san", "DNS:superlink", "--docker"],
                   check=True, capture_output=True, timeout=120)
    subprocess.run([mk, "-o", str(out), "-n", "2"], check=True, capture_output=True, timeout=120)
    sans = subprocess.run(["openssl", "x509", "-in", str(out / "server.pem"), "-noout", "-ext",
                           "subjectAltName"], capture_output=True, text=True, check=True).stdout
    assert "DNS:superlink" in sans, f"re-run dropped a SAN the compose setup needs: {sans.strip()}"
    mode = stat.S_IMODE((out / "supernode-1.key").stat().st_mode)
    assert mode & 0o004, f"re-run made the container-mounted key unreadable again ({oct(mode)})"


def test_make_certs_rerun_keeps_private_keys_whose_public_half_moved_away(tmp_path):
    """The header promises "existing node keys are kept". A re-run after supernode-1.pub was handed out
    (and not kept) made a new pair, locking the registered node out; after ca.crt moved away it made a
    new CA key, orphaning every certificate it had signed (review of session 18). Now the node's .pub is
    rebuilt from its key, and a CA key without its certificate stops the script."""
    out = tmp_path / "certs"
    mk = [str(DEPLOY / "make-certs.sh"), "-o", str(out), "-n", "2"]
    subprocess.run(mk, check=True, capture_output=True, timeout=120)
    key, pub = (out / "supernode-1.key").read_bytes(), (out / "supernode-1.pub").read_text()
    ca_key = (out / "ca.key").read_bytes()
    (out / "supernode-1.pub").unlink()
    subprocess.run(mk, check=True, capture_output=True, timeout=120)
    assert (out / "supernode-1.key").read_bytes() == key
    assert (out / "supernode-1.pub").read_text().split()[:2] == pub.split()[:2]  # the same public key
    (out / "ca.crt").rename(tmp_path / "ca.crt")
    done = subprocess.run(mk, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "ca.key exists without ca.crt" in done.stderr, done
    assert (out / "ca.key").read_bytes() == ca_key


# --- local-federation.sh ------------------------------------------------------------


def test_local_federation_stop_spares_a_reused_pid(tmp_path):
    """`stop` SIGTERMs (then SIGKILLs) whatever process now holds a recorded PID, e.g.
    after a reboot or once the federation died by itself and the PID was reused."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    other = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        (run_dir / "pids").write_text(f"superlink {other.pid}\n")
        subprocess.run([str(DEPLOY / "local-federation.sh"), "stop", "--run-dir", str(run_dir)],
                       env=offline_env(FLWR_HOME=str(tmp_path / "home")), capture_output=True, timeout=60)
        time.sleep(0.3)
        assert other.poll() is None, "stop killed a process that is not a Flower process of this run"
    finally:
        if other.poll() is None:
            other.kill()
        other.wait(timeout=10)


@pytest.mark.skipif(not (BIN / "flower-superlink").exists(), reason="flwr not installed")
def test_local_federation_failed_start_leaves_nothing_running(tmp_path):
    """A failure after the SuperLink started (here: an unreadable $FLWR_HOME/config.toml;
    same for Ctrl-C during the node wait) exits under `set -e` with no cleanup: the
    SuperLink and its SuperExec keep running and hold the port."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("this is = = not toml\n")
    run_dir = tmp_path / "run"
    env = offline_env(FLWR_HOME=str(home))
    try:
        r = subprocess.run([str(DEPLOY / "local-federation.sh"), "start", "-n", "1",
                            "--port", str(_free_port()), "--node-port-base", str(_free_port()),
                            "--run-dir", str(run_dir), "--certs", str(tmp_path / "certs"),
                            "--workdir", str(tmp_path), "--wait", "20"],
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0, r.stdout + r.stderr
        time.sleep(0.5)
        left = [p for p in _recorded_pids(run_dir) if alive(p)]
        assert not left, f"failed start left recorded processes running: {left}"
    finally:
        _stop_federation(run_dir, env)


@pytest.mark.skipif(not (BIN / "flower-superlink").exists(), reason="flwr not installed")
def test_local_federation_refuses_a_port_already_in_use(tmp_path):
    """With the SuperLink port taken, the readiness probe connects to the other listener:
    against another SuperLink `start` even reports "federation up" (exit 0) while its own
    SuperLink died with 'address already in use' and its SuperNodes were refused (305)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    run_dir = tmp_path / "run"
    env = offline_env(FLWR_HOME=str(tmp_path / "home"))
    proc = subprocess.Popen([str(DEPLOY / "local-federation.sh"), "start", "-n", "1",
                             "--port", str(port), "--node-port-base", str(_free_port()),
                             "--run-dir", str(run_dir), "--certs", str(tmp_path / "certs"),
                             "--workdir", str(tmp_path), "--wait", "10"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=10)
            pytest.fail(f"start did not refuse port {port} (in use) within 20 s:\n{out[-2000:]}")
        assert proc.returncode != 0, out
        assert re.search(r"in use", out, re.I), f"no 'port in use' message:\n{out[-2000:]}"
    finally:
        listener.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        _stop_federation(run_dir, env)


# --- netns-hosts.sh (with a fake `ip`: no namespace is created) ---------------------------

FAKE_IP = r"""#!/usr/bin/env bash
state="$FAKE_IP_STATE"; touch "$state"
if [[ "$1" == netns ]]; then
  case "$2" in
    list) cat "$state" ;;
    add) echo "$3" >> "$state" ;;
    del) { grep -vx "$3" "$state" || true; } > "$state.tmp"; mv "$state.tmp" "$state" ;;
  esac
fi
exit 0
"""


def test_netns_hosts_up_leaves_no_namespace_on_a_bad_host_argument(tmp_path):
    """`up` validates HOST=OCTET inside the creation loop and `die` (exit 2) does not fire
    the ERR trap: `up ... link=1 node_1=11` leaves P-sw and P-link behind, and the next
    `up` refuses with 'already exist'."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "ip").write_text(FAKE_IP)
    (fake_bin / "ip").chmod(0o755)
    state = tmp_path / "netns"
    env = dict(os.environ, PATH=f"{fake_bin}{os.pathsep}{os.environ['PATH']}", FAKE_IP_STATE=str(state))
    r = subprocess.run([str(DEPLOY / "netns-hosts.sh"), "up", "--prefix", "rv", "--subnet", "10.213.9",
                        "link=1", "node_1=11"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    left = state.read_text().split() if state.exists() else []
    assert not left, f"rejected `up` left namespaces behind: {left}"


def test_netns_hosts_down_refuses_a_prefix_that_is_a_pattern(tmp_path):
    """`down --prefix .*` matched every namespace on the machine (the prefix is a regex); it is checked as
    `up` checks it (review of session 18)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "ip").write_text(FAKE_IP)
    (fake_bin / "ip").chmod(0o755)
    state = tmp_path / "netns"
    state.write_text("someone-else\nrv-sw\n")
    env = dict(os.environ, PATH=f"{fake_bin}{os.pathsep}{os.environ['PATH']}", FAKE_IP_STATE=str(state))
    r = subprocess.run([str(DEPLOY / "netns-hosts.sh"), "down", "--prefix", ".*"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and state.read_text().split() == ["someone-else", "rv-sw"]


def test_start_supernode_refuses_node_config_repeating_a_key_it_sets(tmp_path):
    """`--node-config 'state-dir=...'` repeated a key the script sets; Flower's parser then failed with "the
    provided configuration string is in an invalid format" (review of session 18). The script names the option."""
    env = dict(os.environ, HOME=str(tmp_path), PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run([str(DEPLOY / "start-supernode.sh"), "--superlink", "127.0.0.1:1", "--partition-id", "0",
                        "--num-partitions", "2", "--insecure", "--state-dir", str(tmp_path / "s"),
                        "--node-config", 'state-dir="/x"'], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--state-dir" in r.stderr, r.stderr


def test_start_supernode_passes_its_key_and_node_config_to_flower(tmp_path):
    """What the script execs (a fake flower-supernode prints its arguments): the node key and CA as given, and
    the extra node config after the script's own keys. The check above once reused the variable holding
    the key path, and every authenticated node died with "node key 'data-dir' not found"."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "flower-supernode").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (fake / "flower-supernode").chmod(0o755)
    key, ca = tmp_path / "n.key", tmp_path / "ca.crt"
    key.write_text("k")
    ca.write_text("c")
    env = dict(os.environ, HOME=str(tmp_path), PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run([str(DEPLOY / "start-supernode.sh"), "--superlink", "h:1", "--partition-id", "1",
                        "--num-partitions", "2", "--key", str(key), "--ca", str(ca), "--state-dir", str(tmp_path / "s"),
                        "--node-config", "max-epsilon=2"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    args = r.stdout.splitlines()
    assert args[args.index("--auth-supernode-private-key") + 1] == str(key)
    assert args[args.index("--root-certificates") + 1] == str(ca)
    assert args[args.index("--node-config") + 1].endswith(" max-epsilon=2")


# --- an adversarial review, session 21: each test failed on the code it reviewed ----------------------------
# (fake Flower executables first on PATH record what they got and exit: no real SuperLink/SuperNode)


def _fake_exe(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
    (bin_dir / name).chmod(0o755)


def _fake_env(tmp_path: Path, fake: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PRIVFED_DATA_DIR"}
    env.update(HOME=str(tmp_path), FLWR_HOME=str(tmp_path / "flwr-cli"),
               PATH=f"{fake}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
               FLWR_DISABLE_UPDATE_CHECK="1", FLWR_TELEMETRY_ENABLED="0")
    return env


# --- local-federation.sh ------------------------------------------------------------------------


def test_local_federation_data_dir_reaches_the_serverapp(tmp_path):
    """`local-federation.sh start --data-dir DIR` passes DIR only to the SuperNodes; the SuperLink (whose
    ServerApp subprocesses load the same federation and test set) gets neither a data-dir nor
    PRIVFED_DATA_DIR. Observed with the real runtime (2 nodes, TLS, --data-dir /work/shared/data,
    `flwr run . <conn> --run-config 'num-clients=2 num-rounds=1 dataset="mnist"'`): the ServerApp died with
    DataFileMissing: "... not found in folder '<workdir>/data/mnist'", exit code 201. Here a fake
    flower-superlink records the environment it was started with."""
    fake, data = tmp_path / "bin", tmp_path / "data"
    data.mkdir()
    seen = tmp_path / "superlink.env"
    _fake_exe(fake, "flower-superlink", f'echo "PRIVFED_DATA_DIR=${{PRIVFED_DATA_DIR:-}}" >"{seen}"\necho "$@" >>"{seen}"\nexit 1\n')
    env = _fake_env(tmp_path, fake)
    r = subprocess.run([str(DEPLOY / "local-federation.sh"), "start", "-n", "1", "--port", str(_free_port()),
                        "--node-port-base", str(_free_port()), "--run-dir", str(tmp_path / "run"),
                        "--certs", str(tmp_path / "certs"), "--workdir", str(tmp_path), "--wait", "3",
                        "--data-dir", str(data)], env=env, capture_output=True, text=True, timeout=60)
    assert seen.exists(), r.stdout + r.stderr
    recorded = seen.read_text()
    assert f"PRIVFED_DATA_DIR={data}\n" in recorded or str(data) in recorded.splitlines()[1], (
        f"the SuperLink (and so the ServerApp) was started without the federation's data dir:\n{recorded}")


# --- start-supernode.sh -------------------------------------------------------------------------


def _start_supernode(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "bin"
    _fake_exe(fake, "flower-supernode", 'printf "%s\\n" "$@"\n')
    return subprocess.run([str(DEPLOY / "start-supernode.sh"), "--superlink", "127.0.0.1:1", "--insecure",
                           "--state-dir", str(tmp_path / "s"), "--flwr-home", str(tmp_path / "h"), *extra],
                          env=_fake_env(tmp_path, fake), capture_output=True, text=True, timeout=30)


def test_start_supernode_refuses_a_node_config_entry_flower_would_drop(tmp_path):
    """`--node-config 'max-epsilon 2'` (a typo for max-epsilon=2, the data owner's privacy cap) is passed on
    verbatim, and Flower's parse_config_args silently drops a token without '=': the node then runs with
    no cap at all, while the script prints 'node config: ... max-epsilon 2' as if it applied. A privacy
    setting that vanishes must stop the start, not half-start the node."""
    from flwr.common.config import parse_config_args

    assert "max-epsilon" not in parse_config_args(["partition-id=0 max-epsilon 2"])  # what Flower does with it
    r = _start_supernode(tmp_path, "--partition-id", "0", "--num-partitions", "2", "--node-config", "max-epsilon 2")
    assert r.returncode == 2, (f"started (rc {r.returncode}) with a node config Flower drops silently; "
                               f"flower-supernode got: {r.stdout.split()[-3:]}")


def test_start_supernode_refuses_a_partition_id_with_a_leading_zero(tmp_path):
    """`--partition-id 07` passes the script's ^[0-9]+$ check and is exec'd as partition-id=07, which Flower's
    node-config parser rejects with a traceback ('invalid format'); `--partition-id 08` is refused with
    the false reason '08 is not below --num-partitions 10' after bash's octal error. The script should
    refuse both itself, naming the option."""
    r = _start_supernode(tmp_path, "--partition-id", "07", "--num-partitions", "9")
    assert r.returncode == 2 and "--partition-id" in r.stderr, (r.returncode, r.stdout, r.stderr)
    r = _start_supernode(tmp_path, "--partition-id", "08", "--num-partitions", "10")
    assert "is not below" not in r.stderr, r.stderr
