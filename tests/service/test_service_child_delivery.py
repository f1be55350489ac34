"""An isolation engine delivering its query's results itself (yfpp.service.child_delivery): to a TCP or file
sink from the child, under the same sink policy, with only counts through the service; what the child held
is kept by a checkpoint (at least once) and counted dropped if the child dies. Real sockets on 127.0.0.1,
each wait bounded."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.service.test_service_isolation import alone, config, key, stream  # noqa: E402
from tests.service_helpers import jsonl, listeners, wait_for  # noqa: E402,F401
from yfpp.service.client import Client  # noqa: E402
from yfpp.service.server import BackgroundService  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="isolation engines are forked")


def _routed(svc) -> list[int]:
    """How many results of ``heavy`` the service's process routes from now on (in a one-item list)."""
    seen, route = [0], svc._route_batch

    def counting(batch, arrived):
        batch = list(batch)
        seen[0] += sum(r["query"] == "heavy" for r in batch)
        route(batch, arrived)

    svc._route_batch = counting
    return seen


def test_the_child_delivers_to_a_tcp_sink_and_the_service_only_counts(tmp_path, listeners):
    heavy_out, light_out = listeners(), listeners()
    events = stream(300, 3) + [{"type": "c", "ts": 300}]
    expected = alone("//a//b", events)
    with BackgroundService(config(tmp_path, isolate_degree=1)) as svc:
        routed = _routed(svc)
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("//a//b", name="heavy", sink=heavy_out.url)  # isolated from the start
        c.subscribe("PATTERN SEQ(c x)", name="light", sink=light_out.url)
        c.post_events(jsonl(events))
        assert sorted(key(json.loads(x)) for x in heavy_out.wait_lines(len(expected))) == expected
        light_out.wait_lines(sum(e["type"] == "c" for e in events))
        info = wait_for(lambda: (s := c.subscription("s1"))["counters"]["delivered"] == len(expected) and s,
                        what="the child's counts")
        assert info["counters"]["matches"] == len(expected) and info["counters"]["dropped"] == 0
        assert info["counters"]["queued"] == 0 and info["latency"]["window"] == min(1024, len(expected))
        assert routed[0] == 0  # (none of its results went through the service's process)
        (child,) = c.health()["isolated"]
        peers = {conn.getpeername()[1] for conn in heavy_out.conns}
        assert peers <= _ports_of(child["pid"])  # (the connection is the child's own)


def _ports_of(pid: int) -> set[int]:
    """The local ports of the TCP sockets process ``pid`` holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_the_child_writes_a_file_sink_under_the_sink_policy(tmp_path):
    """A file sink in the child is opened as the service opens it: a symbolic link put in its way after the
    subscription is not followed; the failure is reported to the subscription."""
    sinks, secret = tmp_path / "sinks", tmp_path / "secret"
    sinks.mkdir()
    secret.write_text("")
    events = stream(200, 4)
    expected = alone("//a//b", events)
    with BackgroundService(config(tmp_path, isolate_degree=1, max_isolated=2, file_sink_dir=str(sinks))) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("//a//b", name="heavy", sink="file:heavy.jsonl")  # isolated from the start, both
        c.subscribe("//a//b", name="evil", sink="file:evil.jsonl")
        assert sorted(i["name"] for i in svc.isolation.info()) == ["evil", "heavy"]
        (sinks / "evil.jsonl").symlink_to(secret)
        c.post_events(jsonl(events))
        wait_for(lambda: c.subscription("s1")["counters"]["delivered"] == len(expected), what="the file written")
        lines = (sinks / "heavy.jsonl").read_bytes().splitlines()
        assert sorted(key(json.loads(x)) for x in lines) == expected
        evil = wait_for(lambda: (k := c.subscription("s2")["counters"])["sink_errors"] and k, what="refused")
        assert evil["delivered"] == 0 and evil["last_error"]
    assert secret.read_text() == ""


def test_what_the_child_held_at_a_checkpoint_is_delivered_after_a_crash(tmp_path, listeners):
    """The sink refuses connections: the child holds every result. A checkpoint keeps them with the counts
    at that point; a service started from that state (as after kill -9) delivers them, at least once."""
    out = listeners(listen=False)
    events = stream(200, 6)
    expected = alone("//a//b", events)
    with BackgroundService(config(tmp_path, isolate_degree=1)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("//a//b", name="heavy", sink=out.url)
        c.post_events(jsonl(events))
        wait_for(lambda: c.subscription("s1")["counters"]["matches"] == len(expected), what="the child matching")
        assert svc.save_checkpoint()
        kept, counts = svc.registry.kept_queued().get("s1", []), svc.registry.kept_counts()["s1"]
        assert sorted(key(r) for r in kept) == expected
        assert counts["matches"] - counts["delivered"] - counts["dropped"] == len(kept) == counts["matches"]
        shutil.copytree(tmp_path / "state", tmp_path / "crashed")  # (the state as a kill -9 now leaves it)
    out.listen()
    with BackgroundService(config(tmp_path, isolate_degree=1, state=str(tmp_path / "crashed"))) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        assert svc.isolation.info()[0]["name"] == "heavy"  # (restored in a child)
        assert sorted(key(json.loads(x)) for x in out.wait_lines(len(expected))) == expected
        wait_for(lambda: c.subscription("s1")["counters"]["delivered"] == len(expected), what="counted delivered")


def test_what_a_dead_child_had_queued_is_counted_dropped(tmp_path, listeners):
    out = listeners(listen=False)
    events = stream(120, 8)
    n = len(alone("//a//b", events))
    with BackgroundService(config(tmp_path, isolate_degree=1)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("//a//b", name="heavy", sink=out.url)
        c.post_events(jsonl(events))
        counters = wait_for(lambda: (k := c.subscription("s1")["counters"])["queued"] == n and k["sink_errors"] and k,
                            what="queued, the sink failing")
        assert counters["matches"] == n and "Connection failed" in counters["last_error"]
        os.kill(svc.isolation.info()[0]["pid"], signal.SIGKILL)
        wait_for(lambda: c.subscription("s1")["suspended"], what="suspended")
        counters = c.subscription("s1")["counters"]
        assert counters["dropped"] == n and counters["queued"] == 0 and counters["delivered"] == 0


def test_a_webhook_a_pull_stream_and_sink_changes_with_the_child_delivering(tmp_path, listeners):
    """The child posts to a webhook; a pull stream opened meanwhile gets the results made while it listens
    (sent back for it); a changed sink takes over in the child; one the child cannot reach (MQTT) has the
    service deliver from then on."""
    import http.server
    import threading

    from tests.service.test_service import _Hook
    from yfpp.service.client import ServiceError

    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    _Hook.bodies = []
    tcp = listeners()
    events = stream(400, 12)
    made = [alone("//a//b", events[:n]) for n in (0, 100, 200, 300, 400)]
    new = [sorted(set(made[i + 1]) - set(made[i])) for i in range(4)]
    try:
        with BackgroundService(config(tmp_path, isolate_degree=1)) as svc:
            c = Client(f"http://127.0.0.1:{svc.port}")
            c.subscribe("//a//b", name="heavy", sink=f"http://127.0.0.1:{hook.server_address[1]}/hook")
            c.post_events(jsonl(events[:100]))

            def posted() -> list[tuple]:
                return sorted(key(json.loads(x)) for x in b"".join(_Hook.bodies).splitlines())

            wait_for(lambda: posted() == new[0], what="the webhook's results")
            got: list[tuple] = []

            def read() -> None:
                try:
                    for r in Client(c.url).matches("s1", timeout=10):
                        got.append(key(r))
                except (ServiceError, OSError):
                    pass

            threading.Thread(target=read, daemon=True).start()
            wait_for(lambda: c.subscription("s1")["counters"]["listeners"] == 1, what="the stream open")
            c.post_events(jsonl(events[100:200]))
            wait_for(lambda: sorted(got) == new[1], what="the stream's results")
            wait_for(lambda: posted() == sorted(new[0] + new[1]), what="the webhook's, again")
            c._request("PUT", "/subscriptions/s1", json.dumps({"sink": tcp.url}).encode())
            c.post_events(jsonl(events[200:300]))
            assert sorted(key(json.loads(x)) for x in tcp.wait_lines(len(new[2]))) == new[2]
            c._request("PUT", "/subscriptions/s1", json.dumps({"sink": "mqtt://127.0.0.1:1/t"}).encode())
            c.post_events(jsonl(events[300:]))
            total = sum(map(len, new))
            counters = wait_for(lambda: (k := c.subscription("s1")["counters"])["matches"] == total and k,
                                what="the service counting them")
            assert counters["delivered"] == len(new[0]) + len(new[1]) + len(new[2])
            assert counters["queued"] + counters["dropped"] == len(new[3])  # (no broker there)
            assert c.subscription("s1")["usage"]["engine"] == "isolated"
    finally:
        hook.shutdown()
