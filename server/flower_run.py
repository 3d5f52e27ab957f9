"""Run the app through Flower's own simulation engine (`flwr run`) and clean up.

`flwr run` against a local connection starts a detached local SuperLink that
outlives the command. We give it a private `FLWR_HOME` and ports, and stop
exactly the processes started for it (found by that `FLWR_HOME` in their
environment) when the run ends.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

import tomli_w

APP_DIR = Path(__file__).resolve().parents[1]
RESULTS_LINE = re.compile(r"privfed: results in (.+)$", re.M)

OFFLINE_ENV = {
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flower_env(flwr_home: Path) -> dict[str, str]:
    env = dict(os.environ, **OFFLINE_ENV, FLWR_HOME=str(flwr_home))
    env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(free_port())
    env["FLWR_LOCAL_CONTROL_API_PORT"] = str(free_port())
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def pids_with_home(flwr_home: Path) -> list[int]:
    """Processes whose environment has FLWR_HOME=<flwr_home> (Linux /proc)."""
    needle = f"FLWR_HOME={flwr_home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def stop_processes(pids: list[int], grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and not _zombie(p) for p in pids):
            time.sleep(0.1)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


TIMED_OUT = "privfed: flwr run stopped at its timeout of"  # the last output line of a run the watchdog stopped


def run_with_flower(overrides: Mapping[str, object], num_supernodes: int, *, flwr_home: Path | None = None,
                    timeout: float = 1800, echo: Callable[[str], None] | None = None,
                    gpus_per_client: float = 0.0) -> tuple[int, str, Path | None]:
    """`flwr run <app> --stream` in simulation with `num_supernodes` nodes, each client's Ray actor holding
    `gpus_per_client` GPUs (Flower's default 0 hides the GPU from it).

    Returns (exit code, combined output, results folder or None). Every process
    started for the run is stopped before returning; one stopped at `timeout` ends
    its output with a `TIMED_OUT` line.
    """
    with tempfile.TemporaryDirectory(prefix="privfed-flwr-") as tmp:
        home = Path(flwr_home or Path(tmp) / "flwr-home").resolve()
        home.mkdir(parents=True, exist_ok=True)
        run_config = Path(tmp) / "run-config.toml"
        run_config.write_bytes(tomli_w.dumps(dict(overrides)).encode())
        federation = f"num-supernodes={num_supernodes}"
        if gpus_per_client:  # Flower takes the resources given or its defaults (2 CPUs, 0 GPUs), not a mix
            federation += f" client-resources-num-cpus=2 client-resources-num-gpus={float(gpus_per_client)}"
        command = ["flwr", "run", str(APP_DIR), "--stream", "--run-config", str(run_config),
                   "--federation-config", federation]
        lines: list[str] = []
        watchdog = None
        try:
            proc = subprocess.Popen(command, env=flower_env(home), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, cwd=APP_DIR)
            # a run that hangs silently never yields a line: a timer, not the read loop, enforces the timeout
            fired = threading.Event()

            def expire() -> None:
                fired.set()
                stop_processes([proc.pid, *pids_with_home(home)])

            watchdog = threading.Timer(timeout, expire)
            watchdog.daemon = True
            watchdog.start()
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.append(line)
                if echo:
                    echo(line.rstrip("\n"))
            code = proc.wait()
        finally:
            if watchdog is not None:
                watchdog.cancel()
            stop_processes(pids_with_home(home))
        if watchdog is not None and fired.is_set():
            lines.append(f"{TIMED_OUT} {timeout:g} s\n")
        output = "".join(lines)
        match = RESULTS_LINE.search(output)
        return code, output, Path(match.group(1).rstrip("\r")) if match else None  # a run-name may end in " "
