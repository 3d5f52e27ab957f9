"""Static checks of the deployment files (no Docker engine, no network).

* every compose file validates against the Compose specification schema that
  check-jsonschema vendors (`--builtin-schema vendor.compose-spec`);
* the compose files agree with each other, with deploy/ and with pyproject.toml:
  Flower image versions inside the flwr range, Dockerfiles present and based on
  the official images, SuperExecs pointing at existing services and ports,
  partitions 0..N-1, volumes and secrets declared, TLS secrets named as
  deploy/make-certs.sh writes them, SANs covering the compose host names;
* every deploy/ shell script parses (`bash -n`) and make-certs.sh works and is
  idempotent.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
BASE = ROOT / "docker-compose.yml"
TLS = ROOT / "docker-compose.tls.yml"
GPU = ROOT / "docker-compose.gpu.yml"
COMPOSE_FILES = [BASE, TLS, GPU]
SCRIPTS = sorted(DEPLOY.glob("*.sh"))
FLOWER_IMAGES = ("flwr/superlink", "flwr/supernode", "flwr/superexec")


# --- helpers ---------------------------------------------------------------


def load(path: Path) -> dict:
    with path.open() as f:
        return yaml.safe_load(f)


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(value: str) -> str:
    """Compose-style ${VAR:-default} with the defaults (the environment is ignored)."""
    return _VAR.sub(lambda m: m.group(2) or "", value)


def merge(base: dict, *overlays: dict) -> dict:
    """Merge compose files the way `docker compose -f a -f b` does for what we use:
    mappings merge, `command`/`entrypoint` are replaced, secrets/volumes/ports
    lists are unioned."""

    def _merge(a, b, key=None):
        if isinstance(a, dict) and isinstance(b, dict):
            out = dict(a)
            for k, v in b.items():
                out[k] = _merge(a[k], v, k) if k in a else v
            return out
        if isinstance(a, list) and isinstance(b, list) and key not in ("command", "entrypoint"):
            return a + [x for x in b if x not in a]
        return b

    out = base
    for o in overlays:
        out = _merge(out, o)
    return out


def services(cfg: dict) -> dict[str, dict]:
    return cfg.get("services", {})


def flag(cmd: list[str], name: str) -> str | None:
    """Value of `--name value` in an exec-form command, None when absent."""
    for i, tok in enumerate(cmd):
        if tok == name:
            return cmd[i + 1]
        if tok.startswith(name + "="):
            return tok.split("=", 1)[1]
    return None


def node_config(cmd: list[str]) -> dict:
    """Parse --node-config with Flower's own parser, as the SuperNode does."""
    from flwr.common.config import parse_config_args

    raw = flag(cmd, "--node-config")
    assert raw is not None, f"no --node-config in {cmd}"
    return parse_config_args([raw])


def flwr_range() -> tuple[tuple[int, ...], tuple[int, ...]]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"flwr(\[|[<>=!~ ]|$)", d))
    lo = re.search(r">=\s*([0-9.]+)", spec)
    hi = re.search(r"<\s*([0-9.]+)", spec)
    assert lo and hi, f"flwr requirement {spec!r} should have a >= and a < bound"
    return _ver(lo.group(1)), _ver(hi.group(1))


def _ver(s: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in s.split("."))
    return parts + (0,) * (3 - len(parts))


def in_flwr_range(version: str) -> bool:
    lo, hi = flwr_range()
    return lo <= _ver(version) < hi


def image_version(image: str) -> str:
    tag = interpolate(image).rsplit(":", 1)[1]
    m = re.match(r"(\d+\.\d+\.\d+)", tag)
    assert m, f"image {image!r} has no Flower version tag"
    return m.group(1)


def dockerfile_base(path: Path, build_args: dict[str, str]) -> str:
    args: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if m := re.match(r"\s*ARG\s+(\w+)(?:=(\S+))?", line):
            args[m.group(1)] = interpolate(str(build_args.get(m.group(1), m.group(2) or "")))
        if m := re.match(r"\s*FROM\s+(\S+)", line):
            return re.sub(r"\$\{?(\w+)\}?", lambda v: args.get(v.group(1), ""), m.group(1))
    raise AssertionError(f"{path}: no FROM line")


# --- schema ----------------------------------------------------------------


def _check_jsonschema(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).with_name("check-jsonschema"))
    if not Path(exe).exists():
        pytest.skip("check-jsonschema is not installed (pip install -e '.[dev]')")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_file_matches_compose_spec(path):
    r = _check_jsonschema("--builtin-schema", "vendor.compose-spec", str(path))
    assert r.returncode == 0, r.stdout + r.stderr


def test_compose_schema_check_catches_mistakes(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("services:\n  superlink:\n    image: flwr/superlink:1.41.0\n    portz: ['8000:8000']\n")
    r = _check_jsonschema("--builtin-schema", "vendor.compose-spec", str(bad))
    assert r.returncode != 0


def test_merged_compose_files_match_compose_spec(tmp_path):
    for name, overlays in {"tls": [TLS], "gpu": [GPU], "tls-gpu": [TLS, GPU]}.items():
        merged = tmp_path / f"merged-{name}.yml"
        merged.write_text(yaml.safe_dump(merge(load(BASE), *[load(o) for o in overlays])))
        r = _check_jsonschema("--builtin-schema", "vendor.compose-spec", str(merged))
        assert r.returncode == 0, f"{name}: {r.stdout}{r.stderr}"


# --- consistency -----------------------------------------------------------


def _configs():
    base = load(BASE)
    return {
        "base": base,
        "tls": merge(base, load(TLS)),
        "gpu": merge(base, load(GPU)),
        "tls+gpu": merge(base, load(TLS), load(GPU)),
    }


def test_overlays_only_touch_services_of_the_base_file():
    base = set(services(load(BASE)))
    for overlay in (TLS, GPU):
        extra = set(services(load(overlay))) - base
        assert not extra, f"{overlay.name} defines services not in docker-compose.yml: {extra}"


def test_flower_images_match_pyproject_flwr_range():
    for name, cfg in _configs().items():
        for svc_name, svc in services(cfg).items():
            image = svc.get("image", "")
            if image.startswith(FLOWER_IMAGES):
                v = image_version(image)
                assert in_flwr_range(v), f"[{name}] {svc_name}: {image} -> {v} outside pyproject's flwr range"
            build = svc.get("build")
            if build:
                v = interpolate(str(build.get("args", {}).get("FLWR_VERSION", "")))
                assert v and in_flwr_range(v), f"[{name}] {svc_name}: FLWR_VERSION build arg {v!r}"


def test_dockerfiles_exist_and_use_official_flower_images():
    seen = set()
    for name, cfg in _configs().items():
        for svc_name, svc in services(cfg).items():
            build = svc.get("build")
            if not build:
                continue
            context = ROOT / build.get("context", ".")
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            assert dockerfile.is_file(), f"[{name}] {svc_name}: {dockerfile} missing"
            base = dockerfile_base(dockerfile, build.get("args", {}))
            assert base.startswith("flwr/superexec:"), f"{dockerfile.name}: FROM {base}"
            assert in_flwr_range(image_version(base)), f"{dockerfile.name}: FROM {base}"
            assert (context / "pyproject.toml").is_file()
            text = dockerfile.read_text()
            assert 'ENTRYPOINT ["flower-superexec"]' in text
            seen.add(dockerfile.name)
    assert {"superexec.Dockerfile", "superexec-cuda.Dockerfile"} <= seen
    for df in (DEPLOY / "docker").glob("*.Dockerfile"):
        assert (df.parent / f"{df.name}.dockerignore").is_file(), f"{df.name} has no .dockerignore"
    assert "download.pytorch.org/whl/cpu" in (DEPLOY / "docker/superexec.Dockerfile").read_text()


def _role(svc: dict) -> str:
    image = interpolate(svc.get("image", ""))
    if image.startswith("flwr/superlink") and svc.get("command"):
        return "superlink"
    if image.startswith("flwr/supernode"):
        return "supernode"
    if "superexec" in image or svc.get("build"):
        return "superexec"
    return "other"


def test_topology_superlink_supernodes_and_superexecs():
    for name, cfg in _configs().items():
        svcs = services(cfg)
        roles = {n: _role(s) for n, s in svcs.items()}
        links = [n for n, r in roles.items() if r == "superlink"]
        nodes = [n for n, r in roles.items() if r == "supernode"]
        execs = [n for n, r in roles.items() if r == "superexec"]
        assert links == ["superlink"], f"[{name}] {roles}"
        link_cmd = svcs["superlink"]["command"]
        link_port = flag(link_cmd, "--port")
        assert flag(link_cmd, "--isolation") == "process"
        assert flag(link_cmd, "--host") == "0.0.0.0"
        assert "--disable-runtime-dependency-installation" in link_cmd
        assert any(str(p).split(":")[-1] == link_port for p in svcs["superlink"].get("ports", [])), \
            f"[{name}] SuperLink port {link_port} not published"
        assert len(nodes) >= 1

        node_ports = {}
        for n in nodes:
            cmd = svcs[n]["command"]
            assert flag(cmd, "--superlink") == f"superlink:{link_port}", f"[{name}] {n}"
            assert flag(cmd, "--isolation") == "process", f"[{name}] {n}"
            assert flag(cmd, "--host") == "0.0.0.0", f"[{name}] {n}"
            node_ports[n] = flag(cmd, "--port")
            assert node_ports[n], f"[{name}] {n} has no --port"

        # every SuperExec points at the SuperLink or at a SuperNode's runtime port
        targets = []
        for e in execs:
            cmd = svcs[e]["command"]
            addr = flag(cmd, "--runtime-api-address")
            assert addr, f"[{name}] {e}: no --runtime-api-address"
            host, port = addr.rsplit(":", 1)
            assert host in svcs, f"[{name}] {e} -> {addr}: no service {host}"
            if host == "superlink":
                assert port == link_port, f"[{name}] {e} -> {addr}: SuperLink port is {link_port}"
            else:
                assert host in node_ports, f"[{name}] {e} -> {addr}: {host} is not a SuperNode"
                assert port == node_ports[host], f"[{name}] {e} -> {addr}: {host} listens on {node_ports[host]}"
            deps = svcs[e].get("depends_on", [])
            assert host in deps, f"[{name}] {e} should depend_on {host}"
            targets.append(host)
        assert sorted(targets) == sorted(["superlink", *nodes]), \
            f"[{name}] one SuperExec per SuperNode plus one for the SuperLink expected, got {targets}"


def test_node_config_partitions_cover_0_to_n_minus_1():
    for name, cfg in _configs().items():
        svcs = services(cfg)
        nodes = [n for n, s in svcs.items() if _role(s) == "supernode"]
        cfgs = {n: node_config(svcs[n]["command"]) for n in nodes}
        n = len(nodes)
        assert sorted(c["partition-id"] for c in cfgs.values()) == list(range(n)), f"[{name}] {cfgs}"
        assert {c["num-partitions"] for c in cfgs.values()} == {n}, f"[{name}] {cfgs}"
        for node, c in cfgs.items():
            # the ClientApp runs in the SuperExec next to this node: data-dir and
            # state-dir must be mounted there, state on a named volume.
            exe = next(e for e, s in svcs.items() if _role(s) == "superexec"
                       and flag(s["command"], "--runtime-api-address").startswith(node + ":"))
            mounts = {interpolate(str(v)).split(":")[1]: interpolate(str(v)) for v in svcs[exe].get("volumes", [])}
            assert c["data-dir"] in mounts, f"[{name}] {exe} does not mount data-dir {c['data-dir']}"
            assert mounts[c["data-dir"]].endswith(":ro"), f"[{name}] data should be read-only"
            assert c["state-dir"] in mounts, f"[{name}] {exe} does not mount state-dir {c['state-dir']}"
            vol = mounts[c["state-dir"]].split(":")[0]
            assert vol in cfg.get("volumes", {}), f"[{name}] state of {node} is not on a named volume"


def test_volumes_and_secrets_are_declared():
    for name, cfg in _configs().items():
        declared_vols = set(cfg.get("volumes", {}) or {})
        declared_secrets = set(cfg.get("secrets", {}) or {})
        used_vols = set()
        for svc_name, svc in services(cfg).items():
            for v in svc.get("volumes", []):
                src = interpolate(str(v)).split(":")[0]
                if not src.startswith((".", "/", "~")):
                    assert src in declared_vols, f"[{name}] {svc_name}: volume {src} not declared"
                    used_vols.add(src)
            for s in svc.get("secrets", []):
                s = s if isinstance(s, str) else s["source"]
                assert s in declared_secrets, f"[{name}] {svc_name}: secret {s} not declared"
            for tok in svc.get("command", []) or []:
                if str(tok).startswith("/run/secrets/"):
                    secret = str(tok).removeprefix("/run/secrets/")
                    assert secret in (svc.get("secrets") or []), \
                        f"[{name}] {svc_name} uses {tok} without mounting secret {secret}"
        assert used_vols == declared_vols, f"[{name}] unused volumes: {declared_vols - used_vols}"
        # every named volume that a flwr container writes is chowned by volume-init
        init_vols = {str(v).split(":")[0] for v in services(cfg)["volume-init"]["volumes"]}
        assert declared_vols <= init_vols, f"[{name}] volume-init misses {declared_vols - init_vols}"


def test_offline_flower_environment_everywhere():
    for name, cfg in _configs().items():
        for svc_name, svc in services(cfg).items():
            if svc_name == "volume-init":
                continue
            env = svc.get("environment", {})
            assert env.get("FLWR_DISABLE_UPDATE_CHECK") == "1", f"[{name}] {svc_name}"
            assert env.get("FLWR_TELEMETRY_ENABLED") == "0", f"[{name}] {svc_name}"
            assert env.get("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION") == "1", f"[{name}] {svc_name}"


def test_tls_overlay_is_tls_everywhere_with_node_auth():
    cfg = merge(load(BASE), load(TLS))
    svcs = services(cfg)
    for svc_name, svc in svcs.items():
        cmd = svc.get("command") or []
        role = _role(svc)
        if role == "superlink":
            assert "--insecure" not in cmd and "--enable-supernode-auth" in cmd
            for f in ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"):
                assert flag(cmd, f), f"superlink lacks {f}"
        elif role == "supernode":
            assert "--insecure" not in cmd
            assert flag(cmd, "--root-certificates") == "/run/secrets/ca.crt"
            key = flag(cmd, "--auth-supernode-private-key")
            assert key and key.startswith("/run/secrets/supernode-"), svc_name
        elif role == "superexec" and flag(cmd, "--runtime-api-address").startswith("superlink:"):
            assert "--insecure" not in cmd and flag(cmd, "--root-certificates") == "/run/secrets/ca.crt"
    # distinct node keys
    keys = [flag(s["command"], "--auth-supernode-private-key") for s in svcs.values() if _role(s) == "supernode"]
    assert len(set(keys)) == len(keys)
    # the base file is the plain-HTTP development setup
    for svc_name, svc in services(load(BASE)).items():
        if _role(svc) in ("superlink", "supernode", "superexec"):
            assert "--insecure" in svc["command"], svc_name


def test_gpu_overlay_reserves_gpus_for_clientapps_only():
    cfg = merge(load(BASE), load(GPU))
    for svc_name, svc in services(cfg).items():
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        is_client = _role(svc) == "superexec" and not flag(svc["command"], "--runtime-api-address").startswith("superlink:")
        if is_client:
            assert devices and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"], svc_name
            assert svc["build"]["dockerfile"] == "deploy/docker/superexec-cuda.Dockerfile"
        else:
            assert not devices, f"{svc_name} should not reserve a GPU"


# --- scripts and certificates -------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_and_are_executable(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.access(script, os.X_OK), f"{script.name} is not executable"
    r = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip(), f"{script.name} --help: {r.stderr}"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_make_certs_writes_what_the_tls_overlay_mounts(tmp_path):
    out = tmp_path / "certs"
    cmd = [str(DEPLOY / "make-certs.sh"), "-o", str(out), "-n", "3", "--san", "DNS:superlink", "--docker"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr

    # every secret file of the overlay is a file make-certs.sh wrote (same name)
    secrets = load(TLS)["secrets"]
    for name, spec in secrets.items():
        rel = Path(spec["file"])
        assert rel.parent == Path("deploy/certs"), f"secret {name}: {rel} not under deploy/certs"
        assert rel.name == name, f"secret {name} should be named after its file {rel.name}"
        assert (out / rel.name).is_file(), f"make-certs.sh did not write {rel.name}"
    assert "ca.key" not in secrets

    # the certificate's SANs cover every host name clients use, and it chains to the CA
    text = subprocess.run(["openssl", "x509", "-in", str(out / "server.pem"), "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout
    for san in ("DNS:localhost", "IP Address:127.0.0.1", "DNS:superlink"):
        assert san in text, f"{san} missing from server.pem"
    subprocess.run(["openssl", "verify", "-CAfile", str(out / "ca.crt"), str(out / "server.pem")],
                   check=True, capture_output=True)

    # node keys: EC on a NIST curve, in the formats flwr loads
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

    for i in (1, 2, 3):
        priv = load_ssh_private_key((out / f"supernode-{i}.key").read_bytes(), None)
        pub = load_ssh_public_key((out / f"supernode-{i}.pub").read_bytes())
        assert isinstance(priv, ec.EllipticCurvePrivateKey) and priv.curve.name == "secp384r1"
        assert priv.public_key().public_numbers() == pub.public_numbers()

    # permissions: CA key private; --docker makes the mounted keys container-readable
    assert (out / "ca.key").stat().st_mode & 0o077 == 0
    assert (out / "supernode-1.key").stat().st_mode & 0o004
    assert out.stat().st_mode & 0o077 == 0

    # idempotent: same SANs keep everything; new SANs re-issue only the server cert
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    subprocess.run([*cmd, "--san", "IP:10.1.2.3"], capture_output=True, text=True, timeout=120, check=True)
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert after["ca.crt"] == before["ca.crt"] and after["supernode-1.key"] == before["supernode-1.key"]
    assert after["server.pem"] != before["server.pem"]


def test_connection_template_matches_scripts():
    cfg = tomllib.loads((DEPLOY / "flower-config.toml").read_text())
    links = cfg["superlink"]
    assert links["default"] in links
    local = links["privfed-local"]
    assert local["address"] == "127.0.0.1:8000" and local["root-certificates"].endswith("/deploy/certs/ca.crt")
    docker = links["privfed-docker"]
    assert docker["address"] == "127.0.0.1:8000" and docker["root-certificates"].endswith("/deploy/certs/ca.crt")
    assert links["privfed-docker-insecure"]["insecure"] is True
    script = (DEPLOY / "local-federation.sh").read_text()
    assert 'connection="privfed-local"' in script and "port=8000" in script


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_scripts_pass_shellcheck():
    r = subprocess.run(["shellcheck", "-x", *map(str, SCRIPTS)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_readme_quickstart_uses_the_scripts_and_connections():
    readme = (DEPLOY / "README.md").read_text()
    block = readme.split("## 1.", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert "deploy/local-federation.sh start" in block and "deploy/local-federation.sh stop" in block
    assert "flwr run . privfed-local --stream --run-config 'num-clients=3 num-rounds=3'" in block
    # every connection the guides use is in the template
    links = tomllib.loads((DEPLOY / "flower-config.toml").read_text())["superlink"]
    for text in (readme, (DEPLOY / "EDGE-GPU.md").read_text()):
        for name in re.findall(r"flwr (?:run \.|supernode register \S+) (privfed-[\w-]+)", text):
            assert name in links, f"connection {name} used in a guide but not in flower-config.toml"
    # every script and compose file the guide names exists (relative to deploy/ or the root)
    for rel in re.findall(r"`((?:deploy/|\.\./)?[\w./-]+\.(?:sh|yml|Dockerfile|toml|md))`", readme):
        if Path(rel).name == "config.toml":  # $FLWR_HOME/config.toml lives outside the repo
            continue
        assert (DEPLOY / rel).exists() or (ROOT / rel).exists(), f"README names {rel}, which does not exist"


def test_compose_headers_name_the_connection_of_each_mode():
    """The plain-HTTP compose needs the insecure connection: privfed-docker (TLS) fails against it."""
    for path in (BASE, GPU):
        header = "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
        if "flwr run . privfed-docker " in header:
            assert "privfed-docker-insecure" in header, path.name


def test_readme_states_the_supernode_flwr_home_default():
    script = (DEPLOY / "start-supernode.sh").read_text()
    assert 'privfed/supernode-$partition_id"' in script
    assert "privfed/supernode-<partition-id>`" in (DEPLOY / "README.md").read_text()


def test_the_serverapp_superexec_mounts_the_data_it_evaluates_on():
    """(review, session 21) The ServerApp loads the federation and the test set itself (server/runner.py), from
    /app/data in its container: that superexec mounted only `results`, so every file-based dataset failed with
    DataFileMissing before round 1."""
    for name, cfg in _configs().items():
        svcs = services(cfg)
        exe = next(e for e, s in svcs.items() if _role(s) == "superexec"
                   and flag(s["command"], "--runtime-api-address").startswith("superlink:"))
        mounts = {interpolate(str(v)).split(":")[1]: interpolate(str(v)) for v in svcs[exe].get("volumes", [])}
        assert "/app/data" in mounts and mounts["/app/data"].endswith(":ro"), f"[{name}] {exe}: {sorted(mounts)}"
