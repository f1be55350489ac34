"""CPU of a live source's receiver alone (``yfpp.spark.live_receiver``), without Spark.

* **TCP**: a producer process sends ``--mib`` MiB of JSON lines on loopback; a :class:`TcpReceiver` spools and
  publishes them (as the receiver task does on an executor): its CPU seconds, MiB and lines per CPU second.
* **MQTT**: the receiver appends and publishes each message before paho acknowledges it; ``--messages``
  appends of one 100-byte frame to a spool give the rate that bounds (an fsync of the segment, then one of
  the published end: the disk's, not the CPU's), against the same frames written with one fsync each.

    PYTHONPATH=. python benchmarks/live_receiver_benchmark.py --mib 200 --messages 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from yfpp.spark.live_parse import frame
from yfpp.spark.live_receiver import Feed, TcpReceiver
from yfpp.spark.live_spool import Spool

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
    """Per round: ``messages`` appended and published one by one, against the same frames written with one
    fsync each (what the driver's spool did per message before the receiver moved to an executor)."""
    message = frame("rfid/r1", b"x" * 100)

    def published(folder: str) -> None:
        spool = Spool(folder)
        for _ in range(messages):
            spool.append(message, 1, 0)
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
        for write in (published, one_fsync):
            with tempfile.TemporaryDirectory() as folder:
                wall = time.monotonic()
                write(folder)
                rates.append(messages / (time.monotonic() - wall))
        out.append(f"mqtt: {messages:,} messages, appended and published one by one: {rates[0]:,.0f} per s; "
                   f"with one fsync each: {rates[1]:,.0f} per s")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=200, help="MiB of JSON lines the TCP producer sends")
    ap.add_argument("--messages", type=int, default=1000, help="MQTT messages appended one by one, per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the MQTT measure (alternating)")
    args = ap.parse_args()
    print(tcp(args.mib))
    print("\n".join(mqtt(args.messages, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
