"""A Mosquitto broker for the MQTT tests and benchmark: on a free loopback port, with a generated
configuration (anonymous, or a password file), persistent, stopped by its PID; every wait bounded."""

from __future__ import annotations

import getpass
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

START_TIMEOUT = 10.0  #: seconds the broker may take to listen
STOP_TIMEOUT = 10.0  #: seconds it may take to save its state and exit on SIGTERM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mosquitto:
    """``mosquitto -c CONFIG`` in ``folder``: :meth:`start`, :meth:`stop` (SIGTERM: it saves its persistent
    sessions and queued messages), :meth:`start` again on the same port. ``packets``: its log (:attr:`log_file`)
    also names every packet it sends and receives (``log_type all``)."""

    def __init__(self, folder: Path, users: dict[str, str] | None = None, packets: bool = False):
        if shutil.which("mosquitto") is None:
            raise FileNotFoundError("mosquitto is not installed (apt-get install -y mosquitto)")
        self.folder, self.log_file = folder, folder / "mosquitto.log"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        lines = [f"listener {self.port} 127.0.0.1", "persistence true", f"persistence_location {folder}/",
                 "max_queued_messages 1000000", "max_inflight_messages 100", f"log_dest file {self.log_file}",
                 *(["log_type all"] if packets else ["log_type error", "log_type warning", "log_type notice"]),
                 f"user {getpass.getuser()}"]  # (as root it would otherwise run as 'mosquitto', who cannot write here)
        if users:
            passwd = folder / "passwd"
            passwd.touch(mode=0o600)
            for user, password in users.items():
                subprocess.run(["mosquitto_passwd", "-b", str(passwd), user, password], check=True, timeout=30,
                               capture_output=True)
            lines += ["allow_anonymous false", f"password_file {passwd}"]
        else:
            lines.append("allow_anonymous true")
        self.config = folder / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> "Mosquitto":
        self.proc = subprocess.Popen(["mosquitto", "-c", str(self.config)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        end = time.monotonic() + START_TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    self.stop()
                    raise RuntimeError(f"mosquitto did not start: {self.log()}")
                time.sleep(0.05)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
