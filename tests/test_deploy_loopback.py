"""End-to-end deployment runs on loopback (slow: about a minute each on 2 cores).

1. `deploy/local-federation.sh` as the README uses it: TLS + node authentication,
   3 SuperNodes, a 3-round `flwr run`; a SuperNode with an unregistered key is
   refused; `stop` leaves no process behind.
2. The exact command lines of `docker-compose.yml` + `docker-compose.tls.yml`
   (SuperLink and SuperNodes in `--isolation process`, one flower-superexec per
   SuperNode and one for the SuperLink), run as local processes with the
   compose host names, ports, volumes and secrets mapped to loopback and
   temporary folders. This checks every flag against the installed Flower; it
   does not check the images (no Docker engine here).

    pytest -m slow tests/test_deploy_loopback.py
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deploy_helpers import BIN, alive, free_ports, offline_env, process_tree

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
RUN_CONFIG = "num-clients=3 num-rounds=3"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed"),
    pytest.mark.skipif(not (BIN / "flower-superlink").exists(), reason="flwr not installed"),
]








def _kill_trees(procs: list[subprocess.Popen]) -> None:
    pids = [p for proc in procs if proc.poll() is None for p in process_tree(proc.pid)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + 10
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _flwr_run(connection: str, cli_home: Path, timeout: int = 420) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "flwr"), "run", ".", connection, "--stream", "--run-config", RUN_CONFIG],
        cwd=ROOT, env=offline_env(FLWR_HOME=str(cli_home)), capture_output=True, text=True, timeout=timeout,
    )


def _assert_three_rounds(r: subprocess.CompletedProcess) -> None:
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert re.search(r"round\s+3/3", out), out[-4000:]
    assert "failures" not in out or "0 failures" in out, out[-4000:]


# --- 1. the loopback scripts -----------------------------------------------------


def test_local_federation_script_tls_node_auth(tmp_path):
    ports = free_ports(5)
    link_port, node_base, rogue_port = ports[0], ports[1], ports[4]
    pids: list[int] = []
    run_dir, certs, cli_home = tmp_path / "run", tmp_path / "certs", tmp_path / "cli"
    script = str(DEPLOY / "local-federation.sh")
    common = ["--run-dir", str(run_dir)]
    env = offline_env(FLWR_HOME=str(cli_home))
    t0 = time.time()
    try:
        r = subprocess.run([script, "start", "-n", "3", "--port", str(link_port), "--node-port-base",
                            str(node_base), "--certs", str(certs), "--workdir", str(tmp_path), *common],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "3 SuperNodes online" in r.stdout
        pids = [int(line.split()[1]) for line in (run_dir / "pids").read_text().splitlines()]
        assert len(pids) == 4
        t_up = time.time() - t0

        r = _flwr_run("privfed-local", cli_home)
        _assert_three_rounds(r)
        t_run = time.time() - t0 - t_up
        assert list((tmp_path / "results").iterdir()), "ServerApp results should land in --workdir/results"

        # a key that was never registered is refused
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f",
                        str(tmp_path / "rogue.key")], check=True)
        # (output to a file and wait(): with pipes, communicate() would keep the exited
        # SuperNode a zombie, and its SuperExec child, which watches the parent pid,
        # would hold the pipe open)
        rogue_log = tmp_path / "rogue.log"
        with rogue_log.open("w") as log:
            rogue = subprocess.Popen(
                [str(DEPLOY / "start-supernode.sh"), "--superlink", f"127.0.0.1:{link_port}",
                 "--partition-id", "0", "--num-partitions", "3", "--key", str(tmp_path / "rogue.key"),
                 "--ca", str(certs / "ca.crt"), "--port", str(rogue_port), "--flwr-home",
                 str(tmp_path / "rogue")],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = rogue.wait(timeout=120)
            finally:
                _kill_trees([rogue])
        assert rc != 0
        assert "Failed to activate SuperNode" in rogue_log.read_text()
        print(f"\nfederation up in {t_up:.1f}s, 3-round flwr run {t_run:.1f}s")
    finally:
        r = subprocess.run([script, "stop", *common], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not (run_dir / "pids").exists()
    for pid in pids:
        assert not alive(pid), f"pid {pid} survived stop"
    leftovers = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.split()
    assert not leftovers, f"processes left behind: {leftovers}"


# --- 2. the compose command lines ----------------------------------------------------

ENTRYPOINT = {"flwr/superlink": "flower-superlink", "flwr/supernode": "flower-supernode"}


def _merged_compose() -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_deploy_compose import load, merge  # same merge rules as the static checks

    return merge(load(ROOT / "docker-compose.yml"), load(ROOT / "docker-compose.tls.yml"))


def test_compose_tls_command_lines_on_loopback(tmp_path):
    cfg = _merged_compose()
    svcs = {k: v for k, v in cfg["services"].items() if v.get("command") and k != "volume-init"}
    ports = iter(free_ports(len(svcs) + 1))

    # compose host:port -> loopback host:port
    link_cmd = svcs["superlink"]["command"]
    link_port = link_cmd[link_cmd.index("--port") + 1]
    addr = {f"superlink:{link_port}": f"localhost:{next(ports)}"}  # 'localhost' is a SAN
    for name, svc in svcs.items():
        if name.startswith("supernode-"):
            cmd = svc["command"]
            addr[f"{name}:{cmd[cmd.index('--port') + 1]}"] = f"127.0.0.1:{next(ports)}"

    certs = tmp_path / "certs"
    subprocess.run([str(DEPLOY / "make-certs.sh"), "-o", str(certs), "-n", "3", "--san", "DNS:superlink"],
                   check=True, capture_output=True, timeout=120)
    data = tmp_path / "data"
    data.mkdir()

    def argv(name: str, svc: dict) -> list[str]:
        """The service's command with compose names, ports and paths mapped to loopback."""
        out, prev = [], None
        for tok in map(str, svc["command"]):
            if prev == "--port":  # the service's own listening port
                own = "superlink" if name == "superlink" else name
                tok = addr[f"{own}:{tok}"].rsplit(":", 1)[1]
            elif prev == "--host" and tok == "0.0.0.0":
                tok = "127.0.0.1"
            elif tok in addr:  # --superlink / --runtime-api-address
                tok = addr[tok]
            tok = tok.replace("/run/secrets/", f"{certs}/")
            tok = tok.replace("/app/state/superlink.db", str(tmp_path / "superlink-state" / "superlink.db"))
            tok = tok.replace('"/app/data"', f'"{data}"')
            tok = tok.replace('"/app/state"', f'"{tmp_path / ("state-" + name)}"')
            out.append(tok)
            prev = tok
        image = svc.get("image", "").split(":")[0]
        # ENTRYPOINT of the official images / of deploy/docker/superexec.Dockerfile
        exe = ENTRYPOINT.get(image, "flower-superexec")
        return [str(BIN / exe), *out]

    (tmp_path / "superlink-state").mkdir()
    procs: list[subprocess.Popen] = []
    cli_home = tmp_path / "cli"
    cli_home.mkdir()
    (cli_home / "config.toml").write_text(
        '[superlink]\ndefault = "privfed-docker"\n[superlink.privfed-docker]\n'
        f'address = "127.0.0.1:{addr[f"superlink:{link_port}"].rsplit(":", 1)[1]}"\n'
        f'root-certificates = "{certs / "ca.crt"}"\n')
    order = ["superlink", "superexec-serverapp"] + sorted(n for n in svcs if n.startswith("supernode-")) \
        + sorted(n for n in svcs if n.startswith("superexec-clientapp-"))
    assert set(order) == set(svcs), f"unexpected services {set(svcs) ^ set(order)}"

    def start(name: str) -> None:
        wd = tmp_path / name / "app"  # stands in for the image's WORKDIR /app
        wd.mkdir(parents=True)
        env = offline_env(FLWR_HOME=str(tmp_path / name / "flwr-home"),
                   **{k: str(v) for k, v in svcs[name].get("environment", {}).items()})
        log = open(tmp_path / f"{name}.log", "w")
        procs.append(subprocess.Popen(argv(name, svcs[name]), cwd=wd, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))

    t0 = time.time()
    try:
        start("superlink")
        start("superexec-serverapp")
        time.sleep(3)
        for i in (1, 2, 3):
            for attempt in range(20):
                r = subprocess.run([str(BIN / "flwr"), "supernode", "register", str(certs / f"supernode-{i}.pub"),
                                    "privfed-docker"], env=offline_env(FLWR_HOME=str(cli_home)),
                                   capture_output=True, text=True, timeout=60)
                if r.returncode == 0:
                    break
                time.sleep(0.5)
            assert r.returncode == 0, r.stdout + r.stderr
        for name in order[2:]:
            start(name)
        r = _flwr_run("privfed-docker", cli_home)
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in tmp_path.glob("*.log"))
        _assert_three_rounds(subprocess.CompletedProcess(r.args, r.returncode, r.stdout, r.stderr + logs))
        # results-dir=results resolves against the serverapp SuperExec's working dir
        # (/app in the image, where the `results` volume is mounted)
        assert list((tmp_path / "superexec-serverapp" / "app" / "results").iterdir())
        for p in procs:
            assert p.poll() is None, f"{p.args[0]} exited with {p.returncode}"
        print(f"\ncompose command lines (TLS): 3-round federation in {time.time() - t0:.1f}s")
    finally:
        _kill_trees(procs)
