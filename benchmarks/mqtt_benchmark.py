"""MQTT through a real broker: events/s and end-to-end latency at N subscriptions.

Setup, all on 127.0.0.1: Mosquitto (tests/mosquitto.py) on a free port; ``yfpp serve`` in this process
(``BackgroundService``, no state) reading ``sensors/{sensor}`` at QoS 1; N subscriptions
``SEQ(reading r) WHERE r.sensor = k``, each with its own MQTT sink ``alerts/{query}`` (QoS 1, one shared
connection); a publisher and a collector (paho clients, their own threads).

* throughput: E events published at QoS 1 as fast as the publisher goes (event i on sensor i mod N, so
  each event matches one subscription); events/s is E over the time from the first publish to the last
  alert received; every alert must arrive (checked);
* latency: events paced at ``--rate``/s; each carries its publish time, which its alert RETURNs; the
  latency is the alert's arrival time minus it (publisher → broker → service → engine → sink → broker →
  collector): p50, p99, max.

    python benchmarks/mqtt_benchmark.py --subs 100 --events 5000
    python benchmarks/mqtt_benchmark.py --subs 10000 --events 5000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import paho.mqtt.client as paho  # noqa: E402

from bench_common import commit  # noqa: E402
from tests.mosquitto import Mosquitto  # noqa: E402
from yfpp.service.client import Client  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.server import BackgroundService  # noqa: E402

QUERY = "PATTERN SEQ(reading r) WHERE r.sensor = {k} WITHIN 1 s RETURN alert(sent = r.sent)"


def client(port: int, on_message=None) -> paho.Client:
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    if on_message is not None:
        c.on_message = on_message
    c.max_inflight_messages_set(100)
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def wait(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def run(subs: int, events: int, rate: float, paced: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        broker = Mosquitto(Path(folder)).start()
        try:
            cfg = ServiceConfig(port=0, state=None, log_level="warning", max_subscriptions=max(subs, 10_000),
                                mqtt=f"{broker.url}?qos=1", mqtt_topics=["sensors/{sensor}"],
                                subscription_metrics=False)
            with BackgroundService(cfg) as svc:
                api = Client(f"http://127.0.0.1:{svc.port}", timeout=60)
                t = time.perf_counter()
                for k in range(subs):
                    api.subscribe(QUERY.format(k=k), name=f"q{k}", sink=f"{broker.url}/alerts/{{query}}?qos=1")
                setup = time.perf_counter() - t
                arrivals: list[tuple[float, dict]] = []
                lock = threading.Lock()

                def got(c, u, m) -> None:
                    now = time.time()
                    with lock:
                        arrivals.append((now, json.loads(m.payload)))

                collector = client(broker.port, got)
                subscribed = threading.Event()
                collector.on_subscribe = lambda *a: subscribed.set()
                collector.subscribe("alerts/#", 1)
                subscribed.wait(10)
                pub = client(broker.port)
                # throughput
                cpu0, t0 = time.process_time(), time.perf_counter()
                infos = [pub.publish(f"sensors/{i % subs}", json.dumps({"type": "reading", "ts": i, "sent": time.time()}), 1)
                         for i in range(events)]
                wait(lambda: len(arrivals) >= events, 600, f"{events} alerts (have {len(arrivals)})")
                elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                assert all(i.is_published() for i in infos)
                # latency, paced
                with lock:
                    arrivals.clear()
                for i in range(paced):
                    pub.publish(f"sensors/{i % subs}", json.dumps({"type": "reading", "ts": events + i, "sent": time.time()}), 1)
                    time.sleep(1 / rate)
                wait(lambda: len(arrivals) >= paced, 120, f"{paced} paced alerts")
                lat = sorted((now - r["emit"]["attrs"]["sent"]) * 1000 for now, r in arrivals)
                pub.loop_stop()
                collector.loop_stop()
        finally:
            broker.stop()
    return {"subs": subs, "events": events, "setup_s": round(setup, 1), "events_per_s": round(events / elapsed),
            "cpu_s_per_wall_s": round(cpu / elapsed, 2), "paced_rate": rate,
            "latency_ms_p50": round(statistics.median(lat), 1), "latency_ms_p99": round(lat[int(0.99 * (len(lat) - 1))], 1),
            "latency_ms_max": round(lat[-1], 1), "commit": commit()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subs", type=int, default=100)
    ap.add_argument("--events", type=int, default=5000, help="events of the throughput phase")
    ap.add_argument("--rate", type=float, default=100.0, help="events/s of the latency phase")
    ap.add_argument("--paced", type=int, default=300, help="events of the latency phase")
    a = ap.parse_args()
    print(json.dumps(run(a.subs, a.events, a.rate, a.paced)))


if __name__ == "__main__":
    main()
