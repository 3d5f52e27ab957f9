"""Multi-host deployment: real Flower processes, one network namespace per host.

One federation serves every test here (module fixture `fed`): `deploy/netns-hosts.sh`
creates a switch namespace (a bridge) and 4 host namespaces, each with a veth
pair and its own address on 10.213.S.0/24 (S from the pid): the SuperLink host
`link` (.1) and three SuperNode hosts `node1..3` (.11-.13). The SuperLink runs
with TLS (certificate SAN = its address) and SuperNode authentication; the
three node keys are registered with `flwr supernode register` from the link
host. The fixture kills every process it started (by PID) and removes the
namespaces, also on failure.

One run (fixture `scenario`, run-name "mh", 4 rounds, DP-SGD clients,
checkpointing on, polling grid), with two faults:
- after round 1 the ServerApp process is killed (SIGKILL) and a new
  `flwr run` (a new Flower run id) resumes from the round-1 checkpoint;
- after round 3 SuperNode 3 is killed (SIGKILL); round 4 completes with the two
  others, bounded by round-timeout.
The asserts: rounds 1-3 equal the in-process engine with the same seed
(`run_inprocess`, proven equal to Flower's simulation by tests/test_e2e_flower.py);
round 4 ends within round-timeout; the privacy mirror and the clients'
ledgers continue across the restart, without double counting. A SuperNode with
an unregistered key is refused.

Slow (`pytest -m slow tests/test_deploy_multihost.py`): the same two-fault run
with secure aggregation on; the SuperLink itself (with its SuperExec and the
ServerApp) killed after round 1, restarted on its database, and resumed.

Skipped with the reason when namespaces cannot be created (not root, no
iproute2, a container without CAP_SYS_ADMIN).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from deploy_helpers import BIN, kill_pids, offline_env, process_tree

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
STEPS = 2
ROUND_TIMEOUT = 45.0
RUN = {"num-clients": 3, "num-rounds": 4, "seed": 7, "privacy": "dpsgd", "local-steps": STEPS,
       "dp-sample-rate": 0.2, "lr": 0.5, "checkpoint": True, "run-name": "mh", "node-wait-timeout": 120.0,
       "round-timeout": ROUND_TIMEOUT,
       "dp-noise-seed": "run-seed"}  # reproducible DP noise: the deployed run must equal the simulation
PORT = 8000  # inside the link namespace: no clash with anything on the machine


def _netns_reason() -> str | None:
    if shutil.which("ip") is None:
        return "iproute2 ('ip') not installed"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "network namespaces need root"
    r = subprocess.run([str(DEPLOY / "netns-hosts.sh"), "check"], capture_output=True, text=True)
    return None if r.returncode == 0 else f"cannot create network namespaces here: {r.stderr.strip()}"


_reason = _netns_reason() if sys.platform.startswith("linux") else "network namespaces are Linux-only"
pytestmark = [
    pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed"),
    pytest.mark.skipif(not (BIN / "flower-superlink").exists(), reason="flwr not installed"),
    pytest.mark.skipif(_reason is not None, reason=_reason or ""),
]


# --- processes ---------------------------------------------------------------------






def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def run_config(**overrides) -> dict:
    return {**RUN, **overrides}


class Federation:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.prefix = f"pf{os.getpid() % 100000}"
        self.subnet = f"10.213.{os.getpid() % 250}"
        self.link_ip = f"{self.subnet}.1"
        self.procs: dict[str, subprocess.Popen] = {}
        self.certs = tmp / "certs"
        self.cli_home = tmp / "cli"
        self.results = tmp / "results"

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def popen(self, name: str, host: str, argv: list[str], **env) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "a")
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(host), *argv], cwd=self.tmp, env=offline_env(**env),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        p = self.tmp / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns("link"), str(BIN / "flwr"), *args], cwd=ROOT,
                              env=offline_env(FLWR_HOME=str(self.cli_home)), capture_output=True, text=True,
                              timeout=timeout)

    def flwr_run_argv(self, cfg: dict) -> list[str]:
        rc = " ".join(f"{k}={_toml(v)}" for k, v in {**cfg, "results-dir": str(self.results)}.items())
        return ["ip", "netns", "exec", self.ns("link"), str(BIN / "flwr"), "run", ".", "multihost", "--stream",
                "--run-config", rc]

    def flwr_run(self, cfg: dict, timeout: float = 420) -> subprocess.CompletedProcess:
        return subprocess.run(self.flwr_run_argv(cfg), cwd=ROOT, env=offline_env(FLWR_HOME=str(self.cli_home)),
                              capture_output=True, text=True, timeout=timeout)

    def start_supernode(self, i: int, key: Path | None = None, port: int = 9094, name: str | None = None):
        return self.popen(name or f"node{i}", f"node{i}", [
            str(DEPLOY / "start-supernode.sh"), "--superlink", f"{self.link_ip}:{PORT}",
            "--partition-id", str(i - 1), "--num-partitions", "3",
            "--key", str(key or self.certs / f"supernode-{i}.key"), "--ca", str(self.certs / "ca.crt"),
            "--port", str(port), "--flwr-home", str(self.tmp / f"home-{name or f'node{i}'}"),
            "--state-dir", str(self.state_dir(i))])

    def state_dir(self, i: int) -> Path:
        return self.tmp / f"state-node{i}"

    def kill_tree(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        pids = process_tree(proc.pid) if proc.poll() is None else []
        kill_pids(pids)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass

    def up(self) -> None:
        r = subprocess.run([str(DEPLOY / "netns-hosts.sh"), "up", "--prefix", self.prefix, "--subnet",
                            self.subnet, "link=1", "node1=11", "node2=12", "node3=13"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        subprocess.run([str(DEPLOY / "make-certs.sh"), "-o", str(self.certs), "-n", "3", "--san",
                        f"IP:{self.link_ip}"], check=True, capture_output=True, timeout=120)
        (self.tmp / "link-wd").mkdir()
        self.popen("superlink", "link", [
            str(DEPLOY / "start-superlink.sh"), "--certs", str(self.certs), "--host", "0.0.0.0", "--port",
            str(PORT), "--flwr-home", str(self.tmp / "home-link"), "--workdir", str(self.tmp / "link-wd")])
        self.cli_home.mkdir()
        (self.cli_home / "config.toml").write_text(
            '[superlink]\ndefault = "multihost"\n[superlink.multihost]\n'
            f'address = "{self.link_ip}:{PORT}"\nroot-certificates = "{self.certs / "ca.crt"}"\n')
        for i in (1, 2, 3):
            deadline = time.time() + 90
            while True:
                r = self.flwr("supernode", "register", str(self.certs / f"supernode-{i}.pub"), "multihost")
                if r.returncode == 0 or time.time() > deadline:
                    break
                assert self.procs["superlink"].poll() is None, self.log("superlink")[-3000:]
                time.sleep(1)
            assert r.returncode == 0, r.stdout + r.stderr + self.log("superlink")[-2000:]
        for i in (1, 2, 3):
            self.start_supernode(i)

    def down(self) -> None:
        for name in list(self.procs):
            self.kill_tree(name)
        subprocess.run([str(DEPLOY / "netns-hosts.sh"), "down", "--prefix", self.prefix, "--kill"],
                       capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    f = Federation(tmp_path_factory.mktemp("multihost"))
    try:
        f.up()
        yield f
    finally:
        f.down()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f.prefix + "-" not in left, f"namespaces left behind: {left}"


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _ok(r: subprocess.CompletedProcess, fed: Federation) -> str:
    out = r.stdout + r.stderr
    logs = "\n".join(f"--- {n}\n{fed.log(n)[-1500:]}" for n in ("superlink", "node1", "node2", "node3"))
    assert r.returncode == 0, out[-4000:] + logs
    assert re.search(r"round\s+3/3", out), out[-4000:] + logs
    return out


# --- one run, two faults ----------------------------------------------------------------


def _checkpoint(path: Path) -> dict | None:
    from server.checkpoint import load_checkpoint

    try:
        return load_checkpoint(path)
    except (OSError, ValueError, KeyError, EOFError):
        return None


def _wait_round(fed: Federation, proc: subprocess.Popen, log: str, path: Path, r: int, timeout: float) -> dict:
    deadline = time.time() + timeout
    while True:
        ckpt = _checkpoint(path) if path.exists() else None
        if ckpt is not None and int(ckpt["round"]) >= r:
            return ckpt
        if proc.poll() is not None:
            pytest.fail(f"flwr run ended (rc {proc.returncode}) before round {r}:\n{fed.log(log)[-3000:]}")
        if time.time() > deadline:
            pytest.fail(f"no round-{r} checkpoint within {timeout:.0f} s:\n{fed.log(log)[-3000:]}")
        time.sleep(0.1)


def run_scenario(fed: Federation, cfg: dict) -> dict:
    """round 1 -> the ServerApp process is killed (SIGKILL) -> a new `flwr run` resumes at round 2;
    round 3 -> SuperNode 3 is killed (SIGKILL) -> round 4 runs with nodes 1 and 2 only."""
    name = cfg["run-name"]
    ckpt_path = fed.results / "checkpoints" / f"{name}.ckpt.npz"
    out: dict = {"t0": time.time()}

    def start(log: str) -> subprocess.Popen:
        fh = open(fed.tmp / f"{log}.log", "w")
        proc = subprocess.Popen(fed.flwr_run_argv(cfg), cwd=ROOT, env=offline_env(FLWR_HOME=str(fed.cli_home)),
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        fed.procs[log] = proc
        return proc

    first = start(f"{name}-first")
    _wait_round(fed, first, f"{name}-first", ckpt_path, 1, 400)
    servers = [p for p in process_tree(fed.procs["superlink"].pid) if "flwr-serverapp" in _cmdline(p)]
    assert servers, "no flwr-serverapp process found under the SuperLink"
    kill_pids(servers)  # the ServerApp dies right after its round-1 checkpoint
    out["t_first"] = time.time() - out["t0"]
    fed.kill_tree(f"{name}-first")  # the CLI that streamed its log
    run_id = re.search(r"started run (\d+)", fed.log(f"{name}-first"))
    if run_id:  # end the dead run on the SuperLink: its leftover instructions are no longer served
        fed.flwr("stop", run_id.group(1), "multihost")

    t1 = time.time()
    second = start(f"{name}-resumed")
    out["round3"] = _wait_round(fed, second, f"{name}-resumed", ckpt_path, 3, 600)
    fed.kill_tree("node3")  # SuperNode 3, its SuperExec and any ClientApp
    t_kill = time.time()
    try:
        second.wait(timeout=ROUND_TIMEOUT + 300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the resumed run hung after node 3 was killed:\n{fed.log(name + '-resumed')[-3000:]}")
    out.update(rc=second.returncode, log=fed.log(f"{name}-resumed"), t_last=time.time() - t_kill,
               t_resumed=time.time() - t1)
    fed.procs.pop(f"{name}-resumed", None)
    return out


@pytest.fixture(scope="module")
def scenario(fed):
    return run_scenario(fed, run_config())


def test_restarted_run_matches_the_simulation(fed, scenario):
    """Rounds 1-3 (TLS, node auth, 3 hosts, one ServerApp restart) equal the in-process engine,
    which tests/test_e2e_flower.py proves equal to Flower's simulation with the same seed."""
    from common.config import validate
    from server.inprocess import run_inprocess

    assert scenario["rc"] == 0, scenario["log"][-4000:]
    assert "resuming run 'mh'" in scenario["log"] and "next round 2" in scenario["log"], scenario["log"][-3000:]
    ref = run_inprocess(validate(run_config(**{"run-name": "ref", "checkpoint": False,
                                               "results-dir": str(fed.tmp / "ref")})))
    a, b = _rows(ref), _rows(fed.results / "mh")
    assert [r["round"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a[:3], b[:3]):
        for key in ("accuracy", "loss"):
            assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-6), (rb["round"], key)
    # epsilon: equal before the restart; after it, the round the killed ServerApp may have started counts
    assert b[0]["epsilon_max"] == pytest.approx(a[0]["epsilon_max"], rel=1e-5)
    assert all(rb["epsilon_max"] >= ra["epsilon_max"] * (1 - 1e-5) for ra, rb in zip(a[1:3], b[1:3]))
    # the global model after round 3 (from the round-3 checkpoint) against the reference's round 3
    ref3 = run_inprocess(validate(run_config(**{"run-name": "ref3", "checkpoint": False, "num-rounds": 3,
                                                "results-dir": str(fed.tmp / "ref")})))
    model3, ref_model = scenario["round3"]["model"], np.load(ref3 / "model.npz")
    assert sorted(model3.keys()) == sorted(ref_model.files)
    for key in ref_model.files:
        np.testing.assert_allclose(model3[key].numpy(), ref_model[key], rtol=1e-5, atol=1e-6)
    rounds = ", ".join(f"{r['seconds']:.1f}" for r in b)
    print(f"\nmulti-host: first run to round 1 {scenario['t_first']:.1f} s, resumed run "
          f"{scenario['t_resumed']:.1f} s, rounds {rounds} s")


def test_killed_supernode_the_run_completes_with_the_others(scenario, fed):
    assert scenario["rc"] == 0, scenario["log"][-4000:]
    assert re.search(r"round\s+4/4", scenario["log"]), scenario["log"][-3000:]
    last = _rows(fed.results / "mh")[-1]
    assert last["round"] == 4 and last["seconds"] <= ROUND_TIMEOUT + 15, last  # never past round-timeout
    assert scenario["t_last"] <= ROUND_TIMEOUT + 120, scenario["t_last"]  # round 4 + final evaluation and exit


def test_serverapp_restart_keeps_privacy_accounting(scenario, fed):
    """The mirror resumes from the checkpoint (not re-counted), the clients' ledgers continue
    under the run-name across Flower run ids (not fresh), and the mirror never counts less than a
    client's own ledger holds."""
    from common.privacy.ledger import PrivacyLedger

    assert scenario["rc"] == 0, scenario["log"][-4000:]
    mirror = json.loads((fed.results / "mh" / "summary.json").read_text())["privacy"]["ledgers"]
    for p in ("0", "1", "2"):  # 4 rounds, plus round 2 if the killed ServerApp had started it
        assert 4 * STEPS <= mirror[p]["steps"] <= 5 * STEPS, mirror
    for i in (1, 2):
        ledger = PrivacyLedger.load(fed.state_dir(i) / "name-mh" / f"partition-{i - 1}.ledger.json")
        assert set(ledger.rounds()) == {1, 2, 3, 4}
        # at most one extra: an instruction of the killed ServerApp carried out before it was stopped
        assert 4 * STEPS <= ledger.steps() <= mirror[str(i - 1)]["steps"], (ledger.to_json(), mirror)


def test_unregistered_node_is_refused(fed):
    rogue = fed.tmp / "rogue"
    subprocess.run([str(DEPLOY / "make-certs.sh"), "-o", str(rogue), "-n", "1"], check=True,
                   capture_output=True, timeout=120)
    proc = fed.start_supernode(2, key=rogue / "supernode-1.key", port=9095, name="rogue")
    try:
        rc = proc.wait(timeout=120)
    finally:
        fed.kill_tree("rogue")
    assert rc != 0
    assert "Failed to activate SuperNode" in fed.log("rogue"), fed.log("rogue")[-2000:]


@pytest.mark.slow
def test_secure_aggregation_restart_and_dropout(fed):
    """The same run with secure-aggregation = true (masked replies; node 3's drop in round 4 is
    recovered by the reveal step). Slow: a second 4-round deployment run."""
    from common.config import validate
    from server.inprocess import run_inprocess

    if "node3" not in fed.procs or fed.procs["node3"].poll() is not None:
        fed.kill_tree("node3")
        fed.start_supernode(3)  # back with its key; it activates once the SuperLink has marked it offline
    cfg = run_config(**{"run-name": "mh-secagg", "secure-aggregation": True})
    out = run_scenario(fed, cfg)
    assert out["rc"] == 0, out["log"][-4000:]
    assert "resuming run 'mh-secagg'" in out["log"] and re.search(r"round\s+4/4", out["log"]), out["log"][-3000:]
    ref = run_inprocess(validate(run_config(**{"run-name": "ref-secagg", "checkpoint": False,
                                               "secure-aggregation": True, "results-dir": str(fed.tmp / "ref")})))
    a, b = _rows(ref), _rows(fed.results / "mh-secagg")
    assert [r["round"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a[:3], b[:3]):
        for key in ("accuracy", "loss"):
            assert rb[key] == pytest.approx(ra[key], rel=1e-4, abs=1e-5), (rb["round"], key)
    assert b[3]["seconds"] <= 2 * ROUND_TIMEOUT + 15  # training round + reveal round, each bounded


@pytest.mark.slow
def test_superlink_killed_and_restarted_resumes(fed):
    """The SuperLink itself (with its SuperExec and the ServerApp) is killed after round 1 and
    restarted on the same database; the SuperNodes reconnect and a new `flwr run` resumes."""
    if "node3" not in fed.procs or fed.procs["node3"].poll() is not None:
        fed.kill_tree("node3")
        fed.start_supernode(3)
    cfg = run_config(**{"run-name": "mh-link"})
    ckpt_path = fed.results / "checkpoints" / "mh-link.ckpt.npz"
    log = open(fed.tmp / "mh-link-first.log", "w")
    first = subprocess.Popen(fed.flwr_run_argv(cfg), cwd=ROOT, env=offline_env(FLWR_HOME=str(fed.cli_home)),
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    fed.procs["mh-link-first"] = first
    _wait_round(fed, first, "mh-link-first", ckpt_path, 1, 400)
    fed.kill_tree("superlink")  # SIGKILL: SuperLink, its SuperExec, the ServerApp
    fed.kill_tree("mh-link-first")
    fed.popen("superlink", "link", [
        str(DEPLOY / "start-superlink.sh"), "--certs", str(fed.certs), "--host", "0.0.0.0", "--port",
        str(PORT), "--flwr-home", str(fed.tmp / "home-link"), "--workdir", str(fed.tmp / "link-wd")])
    deadline = time.time() + 120
    while fed.flwr("ls").returncode != 0:  # the restarted SuperLink answers
        assert time.time() < deadline, fed.log("superlink")[-3000:]
        time.sleep(1)
    r = fed.flwr_run(cfg, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:] + fed.log("superlink")[-2000:]
    assert "resuming run 'mh-link'" in out and "next round 2" in out, out[-3000:]
    assert re.search(r"round\s+4/4", out), out[-3000:]
    assert [row["round"] for row in _rows(fed.results / "mh-link")] == [1, 2, 3, 4]
