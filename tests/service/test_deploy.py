"""deploy/ and docs/deploy.md: the walkthrough run as written (on free ports), the systemd unit verified,
the sample settings loaded, the Dockerfile and compose file checked (Docker itself is not run here)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.mosquitto import Mosquitto, free_port
from tests.test_docs import blocks

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TIMEOUT = 30.0


def walkthrough() -> list[str]:
    """The shell commands of docs/deploy.md's section 1, after the install block, lines joined."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text.split("## 1.", 1)[1].split("\n## 2.", 1)[0]
    start = text.index(section)
    cmds = []
    for b in blocks(ROOT / "docs" / "deploy.md"):
        body_at = text.index(b.text)
        if b.info == "sh" and start <= body_at < start + len(section) and "apt-get" not in b.text:
            cmds += [c for c in b.text.replace("\\\n", " ").splitlines() if c.strip()]
    return cmds


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None or shutil.which("mosquitto") is None,
                    reason="mosquitto and mosquitto-clients are not installed (.ci/run installs them)")
def test_the_walkthrough_runs_as_written(tmp_path):
    pytest.importorskip("paho.mqtt.client", reason="MQTT needs pip install -e '.[serve]'")
    cmds = walkthrough()
    assert [shlex.split(c)[0] for c in cmds] == ["yfpp", "yfpp", "mosquitto_sub", "mosquitto_pub", "mosquitto_pub"]
    broker = Mosquitto(tmp_path).start()
    http = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "YFPP_SERVER": f"http://127.0.0.1:{http}"}

    def local(cmd: str) -> list[str]:
        cmd = cmd.replace("127.0.0.1:1883", f"127.0.0.1:{broker.port}").replace("-h 127.0.0.1", f"-h 127.0.0.1 -p {broker.port}")
        args = shlex.split(cmd.split(" #")[0].rstrip(" &"))
        return [sys.executable, "-m", "yfpp", *args[1:]] if args[0] == "yfpp" else args

    serve = subprocess.Popen([*local(cmds[0]), "--port", str(http), "--log-level", "warning"], env=env, cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    listener = None
    try:
        end = time.monotonic() + TIMEOUT
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http}/health", timeout=1).close()
                break
            except OSError:
                assert serve.poll() is None and time.monotonic() < end, serve.stderr.read() if serve.poll() else "no start"
                time.sleep(0.1)
        sub = subprocess.run(local(cmds[1]), env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert sub.stdout.strip() == "s1", sub.stderr
        listener = subprocess.Popen([*local(cmds[2]), "-C", "1", "-W", str(int(TIMEOUT))], stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)  # (mosquitto_sub has subscribed)
        for cmd in cmds[3:]:
            subprocess.run(local(cmd), check=True, timeout=TIMEOUT)
        out, _ = listener.communicate(timeout=TIMEOUT + 5)
        page = urllib.request.urlopen(f"http://127.0.0.1:{http}/", timeout=5).read()
    finally:
        for p in (listener, serve):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(TIMEOUT)
        broker.stop()
    topic, _, payload = out.strip().partition(" ")
    assert topic == "alerts/north"
    expected = re.sub(r'"id":"…"', '"id":"ID"', [x for x in blocks(ROOT / "docs" / "deploy.md") if "alerts/north {" in x.text][0].text)
    assert re.sub(r'"id":"[0-9a-f]+"', '"id":"ID"', out.strip()) == expected.strip()
    assert b"<title>yfpp serve</title>" in page
    assert serve.returncode == 0


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (no systemd here)")
def test_systemd_unit_verifies(tmp_path):
    exe = shutil.which("yfpp") or pytest.skip("the yfpp command is not installed (pip install -e .)")
    unit = tmp_path / "yfpp.service"
    unit.write_text((DEPLOY / "yfpp.service").read_text().replace("/opt/yfpp/bin/yfpp", exe))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [x for x in r.stderr.splitlines() if "yfpp.service" in x]
    assert r.returncode == 0 and not problems, r.stderr


def test_sample_settings_load():
    from yfpp.service.config import ServiceConfig

    cfg = ServiceConfig.load(str(DEPLOY / "service.toml"), {})
    assert cfg.mqtt.startswith("mqtt://mosquitto:1883") and cfg.mqtt_topics == ["sensors/{site}/{sensor}"]


def test_dockerfile_and_compose():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    docker = (DEPLOY / "Dockerfile").read_text()
    users = re.findall(r"^USER (\S+)", docker, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")  # the service runs unprivileged
    assert "pip wheel" in docker and '"${WHEEL}[serve]"' in docker
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert set(compose["services"]) == {"mosquitto", "yfpp"}
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert not source.startswith(".") or (DEPLOY / source).exists(), source
    assert compose["services"]["yfpp"]["build"]["dockerfile"] == "deploy/Dockerfile"
