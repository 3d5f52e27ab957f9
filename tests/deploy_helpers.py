"""Process helpers shared by the deployment tests (test_deploy_*.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent  # flwr, flower-superlink, ... of this venv


def offline_env(**extra: str) -> dict[str, str]:
    """This process's environment with the venv's tools first on PATH and Flower kept offline."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(FLWR_DISABLE_UPDATE_CHECK="1", FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    env.update(extra)
    return env


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie of ours counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def free_ports(n: int, lo: int = 18000, hi: int = 18999) -> list[int]:
    """n consecutive free ports in [lo, hi], starting at a pid-dependent offset."""
    start = lo + (os.getpid() * 7) % (hi - lo - 50)
    for base in list(range(start, hi - n)) + list(range(lo, start)):
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return list(range(base, base + n))
    raise RuntimeError("no free ports")


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(p)], capture_output=True, text=True).stdout
        todo.extend(int(x) for x in out.split())
    return seen


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
