"""A SuperNode that dies (SIGKILL) in a real loopback deployment, then is restarted (an adversarial review,
session 22). `deploy/local-federation.sh` (TLS + node authentication) with one SuperNode; its process tree is
SIGKILLed and the node started again with `deploy/start-supernode.sh`, the same key, `--flwr-home` and
`--state-dir` (so its privacy ledger resumes). Flower 1.42's SuperLink refuses the activation of a node it still
counts online ("Failed to activate SuperNode", 305: the review found this undocumented, measured 2 s and ~50 s
after the crash); deploy/README.md now says to restart after about a minute, which this checks.

    pytest -m slow tests/test_deploy_restart.py
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from deploy_helpers import BIN, alive, free_ports, kill_pids, offline_env, process_tree

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed"),
    pytest.mark.skipif(not (BIN / "flower-superlink").exists(), reason="flwr not installed"),
]








HEARTBEAT_EXPIRY = 75  # s: Flower 1.42's SuperLink counts a node online until two 30 s heartbeats are missed


def test_supernode_restarted_after_sigkill_rejoins(tmp_path):
    link_port, node_port, restart_port = free_ports(3)
    run_dir, certs, cli_home = tmp_path / "run", tmp_path / "certs", tmp_path / "cli"
    env = offline_env(FLWR_HOME=str(cli_home))
    script = str(DEPLOY / "local-federation.sh")
    restarted: subprocess.Popen | None = None
    started: list[int] = []
    try:
        r = subprocess.run([script, "start", "-n", "1", "--port", str(link_port), "--node-port-base", str(node_port),
                            "--certs", str(certs), "--workdir", str(tmp_path), "--run-dir", str(run_dir)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        pids = dict(line.split() for line in (run_dir / "pids").read_text().splitlines())
        node = int(pids["supernode-1"])
        tree = process_tree(node)
        kill_pids(tree)  # the crash: SuperNode, its SuperExec, any ClientApp
        deadline = time.time() + 20
        while time.time() < deadline and any(alive(p) for p in tree):
            time.sleep(0.2)
        time.sleep(HEARTBEAT_EXPIRY)  # deploy/README.md: the SuperLink counts it online until then

        log = tmp_path / "restarted.log"
        with log.open("w") as out:
            restarted = subprocess.Popen(
                [str(DEPLOY / "start-supernode.sh"), "--superlink", f"127.0.0.1:{link_port}", "--partition-id", "0",
                 "--num-partitions", "1", "--key", str(certs / "supernode-1.key"), "--ca", str(certs / "ca.crt"),
                 "--port", str(restart_port), "--flwr-home", str(run_dir / "supernode-1"),
                 "--state-dir", str(run_dir / "supernode-1" / "state")],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        started = [restarted.pid]
        deadline = time.time() + 60
        while time.time() < deadline and restarted.poll() is None:
            time.sleep(1)
        started += [p for p in process_tree(restarted.pid) if p != restarted.pid] if restarted.poll() is None else []
        text = log.read_text(errors="replace")
        assert restarted.poll() is None, (
            f"the SuperNode restarted with the same key after a crash exited with {restarted.returncode} "
            f"(should rejoin, retry until it can, or say why; deploy/README.md names exit 305 only for an "
            f"unregistered key):\n{text[-1500:]}")
    finally:
        if restarted is not None:
            pids_r = process_tree(restarted.pid) if restarted.poll() is None else started
            kill_pids(pids_r, signal.SIGTERM)
            try:
                restarted.wait(timeout=20)
            except subprocess.TimeoutExpired:
                kill_pids(process_tree(restarted.pid))
                restarted.wait(timeout=10)
            # its SuperExec watches the (now reaped) parent pid and exits; make sure
            for line in subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines():
                pid, _, args = line.strip().partition(" ")
                if f"--parent-pid {restarted.pid}" in args and "flower-superexec" in args:
                    kill_pids([int(pid)])
        subprocess.run([script, "stop", "--run-dir", str(run_dir)], env=env, capture_output=True, text=True,
                       timeout=60)
