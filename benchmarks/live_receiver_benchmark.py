"""CPU of a live source's receiver alone (``yfpp.spark.live_receiver``), without Spark.

* **TCP**: a producer process sends ``--mib`` MiB of JSON lines on loopback; a :class:`TcpReceiver` spools and
  publishes them (as the receiver task does on an executor): its CPU seconds, MiB and lines per CPU second.
* **MQTT, the spool**: ``--messages`` 100-byte frames appended and published one by one (an fsync of the
  segment, then one of the published end: the disk's, not the CPU's), appended and published in batches of
  :data:`BATCH` (mosquitto's default window of unacknowledged messages: what a receiver acknowledging in
  batches publishes at once when the broker waits for it), and written with one fsync each.
* **MQTT, end to end**: a Mosquitto broker (tests/mosquitto.py) on loopback, a :class:`MqttReceiver` (QoS 1,
  a persistent session) with its task loop on a thread, as on an executor; ``--messages`` 100-byte messages
  published at once: the messages spooled a second (from the first publication to the last one published).

    PYTHONPATH=. python benchmarks/live_receiver_benchmark.py --mib 200 --messages 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.mosquitto import Mosquitto  # noqa: E402
from yfpp.spark.live_parse import frame  # noqa: E402
from yfpp.spark.live_receiver import Feed, MqttReceiver, TcpReceiver  # noqa: E402
from yfpp.spark.live_spool import Spool, read_published  # noqa: E402

BATCH = 20  #: messages appended and published at once in the spool's batched measure

LINE = json.dumps({"type": "shelf", "ts": 1700000000.5, "tag_id": "t-000123", "reader": "r7"}).encode() + b"\n"
PRODUCER = """
import socket, sys
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
conn.sendall(bytes.fromhex(sys.argv[1]) * int(sys.argv[2]))
conn.close()
"""


def tcp(mib: int) -> str:
    n = (mib << 20) // len(LINE)
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, LINE.hex(), str(n)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(producer.stdout.readline())
        with tempfile.TemporaryDirectory() as folder:
            receiver = TcpReceiver(Feed(f"tcp://127.0.0.1:{port}", folder), Spool(folder))
            receiver.connect()
            cpu, wall = time.process_time(), time.monotonic()
            while receiver.spool.end.records < n:
                receiver.step()
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
            receiver.close()
            receiver.spool.close()
    finally:
        producer.kill()
        producer.wait()
    return (f"tcp: {n:,} lines, {mib} MiB: receiver {cpu:.2f} CPU-s, {wall:.2f} s wall; {mib / cpu:.0f} MiB and "
            f"{n / cpu / 1e6:.2f} M lines per CPU-s")


def mqtt(messages: int, rounds: int) -> list[str]:
    """Per round: ``messages`` appended and published one by one, in batches of :data:`BATCH`, and written with
    one fsync each (what the driver's spool did per message before the receiver moved to an executor)."""
    message = frame("rfid/r1", b"x" * 100)

    def published(folder: str) -> None:
        spool = Spool(folder)
        for _ in range(messages):
            spool.append(message, 1, 0)
        spool.close()

    def batched(folder: str) -> None:
        spool = Spool(folder)
        with spool.lock:
            for i in range(messages):
                spool.write(message, 1, 0)
                if i % BATCH == BATCH - 1:
                    spool.sync()
            spool.sync()
        spool.close()

    def one_fsync(folder: str) -> None:
        with open(os.path.join(folder, "segment"), "ab") as f:
            for _ in range(messages):
                f.write(message)
                f.flush()
                os.fsync(f.fileno())

    out = []
    for _ in range(rounds):
        rates = []
        for write in (published, batched, one_fsync):
            with tempfile.TemporaryDirectory() as folder:
                wall = time.monotonic()
                write(folder)
                rates.append(messages / (time.monotonic() - wall))
        out.append(f"mqtt spool: {messages:,} messages, appended and published one by one: {rates[0]:,.0f} per s; "
                   f"in batches of {BATCH}: {rates[1]:,.0f} per s; with one fsync each: {rates[2]:,.0f} per s")
    return out


def step_until(receiver: MqttReceiver, done: threading.Event) -> None:
    """The receiver task's loop, until ``done``."""
    while not done.is_set():
        receiver.step()


def broker(messages: int) -> str:
    """``messages`` published at QoS 1 to a receiver through Mosquitto: the messages spooled a second."""
    import paho.mqtt.client as paho

    with tempfile.TemporaryDirectory() as folder:
        mosquitto = Mosquitto(Path(folder)).start()
        url = f"mqtt://127.0.0.1:{mosquitto.port}/rfid/r1?qos=1&client_id=bench&clean=0"
        receiver = MqttReceiver(Feed.of(url, f"{folder}/spool", {}), Spool(f"{folder}/spool"))
        pub = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
        done = threading.Event()
        try:
            receiver.connect()
            threading.Thread(target=step_until, args=(receiver, done), daemon=True).start()
            pub.max_inflight_messages_set(0)  # (no window on the publishing side)
            pub.connect("127.0.0.1", mosquitto.port)
            pub.loop_start()
            wall = time.monotonic()
            for _ in range(messages):
                pub.publish("rfid/r1", b"x" * 100, 1)
            while read_published(f"{folder}/spool").end.records < messages:
                time.sleep(0.001)
            wall = time.monotonic() - wall
        finally:
            done.set()
            pub.loop_stop()
            pub.disconnect()
            receiver.close()
            receiver.spool.close()
            mosquitto.stop()
    return f"mqtt through mosquitto: {messages:,} messages at QoS 1 spooled and published: {messages / wall:,.0f} per s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=200, help="MiB of JSON lines the TCP producer sends")
    ap.add_argument("--messages", type=int, default=1000, help="MQTT messages appended one by one, per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the MQTT measure (alternating)")
    args = ap.parse_args()
    print(tcp(args.mib))
    print("\n".join(mqtt(args.messages, args.rounds)))
    for _ in range(args.rounds):
        print(broker(args.messages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
