"""MQTT in and out through a real Mosquitto broker (tests/mosquitto.py): ``yfpp run -i mqtt://…``, the
service's MQTT feed and sink, a broker restart under a QoS 1 feed, bad payloads, a refused login."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

paho = pytest.importorskip("paho.mqtt.client", reason="MQTT needs pip install -e '.[serve]' (paho-mqtt)")
pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.mosquitto import Mosquitto  # noqa: E402
from tests.service_helpers import wait_for  # noqa: E402
from yfpp.input.dead_letters import DeadLetters  # noqa: E402
from yfpp.errors import YfppError  # noqa: E402
from yfpp.service import mqtt  # noqa: E402
from yfpp.service.client import Client, ServiceError  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.server import BackgroundService  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "yfpp" / "data" / "sample_rfid.jsonl"
SHOPLIFTING = ROOT / "queries" / "shoplifting.sase"
EACH = "PATTERN SEQ(r x) WITHIN 1 s RETURN got(n = x.n)"  #: a match per event: its n
TIMEOUT = 30.0

needs_broker = pytest.mark.skipif(
    __import__("shutil").which("mosquitto") is None,
    reason="mosquitto is not installed (apt-get install -y mosquitto; .ci/run installs it)")


@pytest.fixture
def broker(tmp_path):
    b = Mosquitto(tmp_path).start()
    yield b
    b.stop()


def publisher(b: Mosquitto, **login: str):
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    if login:
        c.username_pw_set(login["user"], login["password"])
    c.connect("127.0.0.1", b.port)
    c.loop_start()
    return c


def publish_all(c, messages: list[tuple[str, bytes]], qos: int = 1) -> None:
    infos = [c.publish(topic, payload, qos) for topic, payload in messages]
    for i in infos:
        i.wait_for_publish(TIMEOUT)
        assert i.is_published()


def collector(b: Mosquitto, topic: str) -> tuple[object, list[tuple[str, bytes]]]:
    """A subscriber to ``topic`` (subscribed when returned) and the messages it got."""
    got: list[tuple[str, bytes]] = []
    subscribed = threading.Event()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    c.on_message = lambda cl, u, m: got.append((m.topic, m.payload))
    c.on_subscribe = lambda *a: subscribed.set()
    c.connect("127.0.0.1", b.port)
    c.subscribe(topic, 1)
    c.loop_start()
    assert subscribed.wait(TIMEOUT)
    return c, got


def sample_messages() -> list[tuple[str, bytes]]:
    """The sample's events on ``rfid/{zone}``-style topics: one per message, then three in a JSON array."""
    lines = SAMPLE.read_bytes().splitlines()
    out, i = [], 0
    while i < len(lines):
        k = 1 if (i // 4) % 2 else 3
        part = lines[i:i + k]
        out.append((f"rfid/{json.loads(part[0])['type']}", part[0] if k == 1 else b"[" + b",".join(part) + b"]"))
        i += k
    return out


def yfpp_run(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yfpp", "run", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def results_of(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def matches(results: list[dict]) -> list[tuple]:
    return sorted((r["query"], json.dumps(r["bindings"], sort_keys=True), r["start"], r["end"],
                   json.dumps(r.get("emit"), sort_keys=True)) for r in results)


# --- without a broker ---------------------------------------------------------------------------


@pytest.mark.parametrize("url, error", [
    ("mqtt://bob:secret@h/t", "not in the URL"),
    ("mqtt://h/t?qos=2", "qos must be 0 or 1"),
    ("mqtt://h/t?clean=0", "needs client_id"),
    ("mqtt://h/t?colour=red", "unknown option"),
    ("http://h/t", "mqtt://HOST"),
    ("mqtt://:1883/t", "no broker host"),
    ("mqtt://h/t?password_file=/x", "needs a user name"),
])
def test_bad_urls_are_clear_errors(url, error):
    with pytest.raises(YfppError, match=error):
        mqtt.parse_url(url)


def test_url_topic_options_and_password_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(mqtt.PASSWORD_ENV, "pw")
    b, topic, opts = mqtt.parse_url("mqtts://bob@h/sensors/#?qos=1&client_id=c&clean=0&format=xml")
    assert (b.host, b.port, b.tls, b.username, b.password, b.qos, b.client_id, b.clean) == \
           ("h", 8883, True, "bob", "pw", 1, "c", False)
    assert (topic, opts) == ("sensors/#", {"format": "xml"})
    (tmp_path / "pw").write_text("from-file\n")
    assert mqtt.parse_url(f"mqtt://bob@h:1884/t?password_file={tmp_path}/pw")[0].password == "from-file"


def test_topic_templates_name_levels():
    t = mqtt.Topic("sensors/{site}/{sensor}")
    assert t.filter == "sensors/+/+"
    assert t.attributes("sensors/north/7") == {"site": "north", "sensor": 7}
    assert t.attributes("sensors/north") is None and t.attributes("other/north/7") is None
    assert mqtt.Topic("a/{x}/#").attributes("a/b/c/d") == {"x": "b"}
    for bad in ("a/#/b", "a/x+", "a/{x}y", ""):
        with pytest.raises(YfppError):
            mqtt.Topic(bad)
    assert mqtt.topic_for("alerts/{zone}/{query}", {"query": "q", "emit": {"attrs": {"zone": "Z/1"}}}) == "alerts/Z_1/q"
    assert mqtt.topic_for("alerts/{nothing}", {"query": "q"}) == "alerts/_"


def test_message_events_and_dead_letters_with_topic_and_position():
    dl = DeadLetters(None)
    reports: list[tuple] = []
    dl.report = lambda *a: reports.append(a)  # type: ignore[method-assign]
    spec = mqtt.Topic("s/{site}")
    evs = mqtt.message_events(b'[{"type":"a","ts":1,"site":"own"},{"type":"b","ts":2}]', "s/n", spec, 1, dl, {})
    assert [(e.type, e.attrs["site"]) for e in evs] == [("a", "own"), ("b", "n")]
    assert [e.type for e in mqtt.message_events(b'<r ts="1"/><q ts="2"/>', "s/n", spec, 2, dl, {})] == ["r", "q"]
    assert mqtt.message_events(b'{"type":"a","ts":1}\n{bad', "s/n", spec, 3, dl, {})[0].type == "a"
    assert mqtt.message_events(b"garbage", "s/n", spec, 4, dl, {}) == []
    assert mqtt.message_events(b"[1,", "s/n", spec, 5, dl, {}) == []
    assert mqtt.message_events(b"", "s/n", spec, 6, dl, {}) == []  # a retained message cleared
    assert [r[1] for r in reports] == ["mqtt s/n message 3 line 2", "mqtt s/n message 4", "mqtt s/n message 5"]


def test_sink_urls_are_checked_when_subscribing():
    from yfpp.service.sink_urls import check_sink

    assert check_sink("mqtt://127.0.0.1:1883/alerts/{zone}?qos=1")
    for bad in ("mqtt://h:1883/alerts/#", "mqtt://h:1883", "mqtt://h/t?password_file=/etc/shadow",
                "mqtt://h/t?client_id=x", "mqtt://bad host/t"):
        with pytest.raises(ValueError):
            check_sink(bad)


# --- through the broker ------------------------------------------------------------------------


@needs_broker
def test_yfpp_run_over_mqtt_equals_yfpp_run_over_the_file(broker):
    want = yfpp_run("-q", str(SHOPLIFTING), "-i", str(SAMPLE))
    assert want.returncode == 0, want.stderr
    # a persistent session made first, so the broker queues what is published before the run connects
    url = f"{broker.url}/rfid/{{kind}}?qos=1&client_id=roundtrip&clean=0"
    first = yfpp_run("-q", str(SHOPLIFTING), "-i", url, "--idle-stop", "0.5")
    assert first.returncode == 0, first.stderr
    pub = publisher(broker)
    publish_all(pub, sample_messages())
    pub.loop_stop()
    got = yfpp_run("-q", str(SHOPLIFTING), "-i", url, "--idle-stop", "2")
    assert got.returncode == 0, got.stderr
    assert results_of(got.stdout) == results_of(want.stdout) and results_of(want.stdout)


@needs_broker
def test_service_feed_to_mqtt_sink_round_trip(broker, tmp_path):
    want = [r for r in results_of(yfpp_run("-q", str(SHOPLIFTING), "-i", str(SAMPLE)).stdout)]
    cfg = ServiceConfig(port=0, state=None, log_level="warning", dead_letters=str(tmp_path / "dead.jsonl"),
                        mqtt=f"{broker.url}?qos=1", mqtt_topics=["rfid/{kind}"])
    sink_client, alerts = collector(broker, "alerts/#")
    with BackgroundService(cfg) as svc:
        client = Client(f"http://127.0.0.1:{svc.port}")
        sub = client.subscribe(SHOPLIFTING.read_text(), name="shoplifting", sink=f"{broker.url}/alerts/{{zone}}/{{query}}?qos=1")
        pub = publisher(broker)
        publish_all(pub, sample_messages())
        wait_for(lambda: len(alerts) >= len(want), TIMEOUT, f"{len(want)} alerts (have {len(alerts)})")
        wait_for(lambda: svc.subs[sub["id"]].counters.delivered >= len(want), TIMEOUT, "the acknowledgements")
        info = client.subscription(sub["id"])
        # (the events after the last match may still be on their way when its alert has come)
        wait_for(lambda: client.health()["mqtt"][0]["events"] >= 300, TIMEOUT, "the feed's 300 events counted")
        health = client.health()
        pub.loop_stop()
    sink_client.loop_stop()
    results = [json.loads(p) for _, p in alerts]
    assert matches(results) == matches(want)
    assert sorted(t for t, _ in alerts) == sorted(f"alerts/{r['emit']['attrs']['zone']}/shoplifting" for r in want)
    assert info["counters"]["delivered"] == len(want)
    assert (info["counters"]["dropped"], info["counters"]["sink_errors"]) == (0, 0)
    assert health["mqtt"][0]["events"] == 300 and health["mqtt"][0]["connected"]


@needs_broker
def test_xml_sink_qos0(broker):
    cfg = ServiceConfig(port=0, state=None, log_level="warning", mqtt=f"{broker.url}/in", mqtt_topics=[])
    sink_client, got = collector(broker, "out/#")
    with BackgroundService(cfg) as svc:
        Client(f"http://127.0.0.1:{svc.port}").subscribe(EACH, name="each", sink=f"{broker.url}/out/{{n}}", format="xml")
        pub = publisher(broker)
        publish_all(pub, [("in", b'<r ts="1" n="5"/>')])
        wait_for(lambda: got, TIMEOUT, "the XML result")
        pub.loop_stop()
    sink_client.loop_stop()
    topic, payload = got[0]
    assert topic == "out/5" and payload.startswith(b'<match query="each"') and not payload.endswith(b"\n")


@needs_broker
def test_broker_restart_under_a_qos1_feed_loses_nothing(tmp_path):
    b = Mosquitto(tmp_path).start()
    try:
        cfg = ServiceConfig(port=0, state=None, log_level="warning", file_sink_dir=str(tmp_path),
                            mqtt=f"{b.url}/r?qos=1&client_id=yfpp-restart&clean=0")
        with BackgroundService(cfg) as svc:
            client = Client(f"http://127.0.0.1:{svc.port}")
            out = tmp_path / "each.jsonl"
            client.subscribe(EACH, name="each", sink=f"file:{out}")

            def seen() -> set[int]:
                return {json.loads(x)["emit"]["attrs"]["n"] for x in out.read_text().splitlines()} if out.exists() else set()

            pub = publisher(b)
            first = [("r", json.dumps({"type": "r", "ts": i, "n": i}).encode()) for i in range(2000)]
            publish_all(pub, first)  # every one acknowledged: the broker holds what it has not delivered
            pub.loop_stop()
            b.stop()  # SIGTERM: it saves the session and its queued messages
            b.start()
            pub = publisher(b)
            publish_all(pub, [("r", json.dumps({"type": "r", "ts": i, "n": i}).encode()) for i in range(2000, 2500)])
            pub.loop_stop()
            # (QoS 1 is at least once: a message in flight at the stop may come twice; none may be missing)
            wait_for(lambda: seen() == set(range(2500)), TIMEOUT, f"all 2500 events (have {len(seen())})")
            feed = svc.mqtt_feeds[0].info()
        assert feed["connects"] == 2  # it reconnected, and the messages published meanwhile were kept for it
    finally:
        b.stop()


@needs_broker
def test_bad_payloads_are_dead_letters_and_the_feed_goes_on(broker, tmp_path):
    dead = tmp_path / "dead.jsonl"
    cfg = ServiceConfig(port=0, state=None, log_level="warning", dead_letters=str(dead),
                        mqtt=f"{broker.url}?qos=1", mqtt_topics=["plant/{line}", {"topic": "xml/#", "format": "xml"}])
    with BackgroundService(cfg) as svc:
        pub = publisher(broker)
        publish_all(pub, [("plant/a", b"not an event"), ("plant/a", b'{"type":"r","ts":1}\n{"type":"r"'),
                          ("xml/x", b'{"type":"r","ts":2}'), ("plant/b", b'{"type":"r","ts":3,"n":1}')])
        wait_for(lambda: svc.events_in >= 2, TIMEOUT, "the good events")
        wait_for(lambda: svc.dead_letters.count >= 3, TIMEOUT, "the dead letters")
        pub.loop_stop()
    positions = [json.loads(x)["position"] for x in dead.read_text().splitlines()]
    assert positions == ["mqtt plant/a message 1", "mqtt plant/a message 2 line 2", "mqtt xml/x message 3 line 1"]


@needs_broker
def test_wrong_password_is_a_clear_error(tmp_path):
    b = Mosquitto(tmp_path, users={"bob": "right"}).start()
    try:
        url = f"mqtt://bob@127.0.0.1:{b.port}/t"
        wrong = yfpp_run("-q", EACH, "-i", url, "--idle-stop", "0.5", env={mqtt.PASSWORD_ENV: "wrong"})
        assert wrong.returncode == 2
        assert "refused it: Not authorized (check the user name and password)" in wrong.stderr
        assert "Traceback" not in wrong.stderr
        cfg = ServiceConfig(port=0, state=None, log_level="warning", mqtt=url + "?password_file=/nonexistent")
        with pytest.raises(YfppError, match="password file"):
            BackgroundService(cfg)
        os.environ[mqtt.PASSWORD_ENV] = "right"
        try:
            ok = yfpp_run("-q", EACH, "-i", url, "--idle-stop", "0.5")
        finally:
            del os.environ[mqtt.PASSWORD_ENV]
        assert ok.returncode == 0, ok.stderr
    finally:
        b.stop()


@needs_broker
def test_feeds_added_over_the_api_feed_persist_and_stop_when_deleted(broker, tmp_path):
    """POST /feeds/mqtt (admin key only) connects and feeds; the feed survives a restart; DELETE stops it."""
    admin = "admin-key-for-the-feeds-test"
    cfg = ServiceConfig(port=0, state=str(tmp_path / "state"), log_level="warning", admin_key=admin)
    pub = publisher(broker)
    with BackgroundService(cfg) as svc:
        client = Client(f"http://127.0.0.1:{svc.port}", token=admin)
        sub = client.subscribe(EACH, name="each")["id"]
        subscriber = Client(client.url, token=client.create_key("alice", "subscriber")["key"])
        with pytest.raises(ServiceError) as refused:
            subscriber.add_mqtt_feed(broker.url, ["r/#"])
        assert refused.value.status == 403
        with pytest.raises(ServiceError) as refused:
            subscriber.mqtt_feeds()
        assert refused.value.status == 403
        feed = client.add_mqtt_feed(f"{broker.url}?qos=1", ["r/{site}", {"topic": "x/#", "format": "xml"}])
        assert feed["id"] == "m1" and feed["connected"] and feed["topics"] == ["r/{site}", "x/#"]
        publish_all(pub, [("r/north", b'{"type":"r","ts":1,"n":1}'), ("x/1", b'<r ts="2" n="2"/>'),
                          ("r/north", b"not an event")])
        wait_for(lambda: svc.subs[sub].counters.matches >= 2, TIMEOUT, "the matches of the feed's events")
        wait_for(lambda: client.mqtt_feeds()[0]["dead_letters"] == 1, TIMEOUT, "the dead letter")
        listed = client.mqtt_feeds()
        assert [(f["id"], f["connected"], f["messages"], f["events"], f["dead_letters"]) for f in listed] == \
            [("m1", True, 3, 2, 1)]
        with pytest.raises(ServiceError) as refused:
            subscriber.remove_mqtt_feed("m1")
        assert refused.value.status == 403
    with BackgroundService(cfg) as svc:  # restarted: the feed is back, connecting in the background
        before = svc.subs[sub].counters.matches  # (the counters go on from the stop's)
        client = Client(f"http://127.0.0.1:{svc.port}", token=admin)
        wait_for(lambda: client.mqtt_feeds()[0]["connected"], TIMEOUT, "the stored feed's connection")
        publish_all(pub, [("r/south", b'{"type":"r","ts":3,"n":3}')])
        wait_for(lambda: svc.subs[sub].counters.matches >= before + 1, TIMEOUT, "a match after the restart")
        client.remove_mqtt_feed("m1")
        assert client.mqtt_feeds() == []
        with pytest.raises(ServiceError) as missing:
            client.remove_mqtt_feed("m1")
        assert missing.value.status == 404
        publish_all(pub, [("r/south", b'{"type":"r","ts":4,"n":4}')])
        client.post_events(b'{"type":"r","ts":5,"n":5}\n')  # (after it: the engine has taken what came before)
        wait_for(lambda: svc.subs[sub].counters.matches >= before + 2, TIMEOUT, "the posted event's match")
        assert svc.subs[sub].counters.matches == before + 2 and svc.events_taken == 2
    pub.loop_stop()


@needs_broker
@pytest.mark.parametrize("broker_url, status, error", [
    ("mqtt://bob:secret@127.0.0.1:{port}", 400, "not in the URL"),
    ("mqtt://bob@127.0.0.1:{port}?password_file=/etc/passwd", 400, "cannot name a key or password file"),
    ("mqtt://127.0.0.1:{port}/r", 400, "not part of the broker URL"),
    ("mqtt://127.0.0.1:{port}?cert=/etc/ssl/x.pem", 400, "client certificate"),
    ("mqtt://10.1.2.3:{port}", 403, "not allowed by the server's sink policy"),
    ("mqtt://127.0.0.1:{closed}", 502, "cannot connect"),
])
def test_feeds_over_the_api_refused_with_clear_errors(broker, broker_url, status, error):
    from tests.mosquitto import free_port

    with BackgroundService(ServiceConfig(port=0, state=None, log_level="warning")) as svc:
        client = Client(f"http://127.0.0.1:{svc.port}", timeout=TIMEOUT)
        with pytest.raises(ServiceError) as refused:
            client.add_mqtt_feed(broker_url.format(port=broker.port, closed=free_port()), ["r/#"])
        assert refused.value.status == status and error in refused.value.body["error"]
        assert client.mqtt_feeds() == []


def test_openapi_lists_the_mqtt_feed_routes_and_their_answers():
    import urllib.request

    with BackgroundService(ServiceConfig(port=0, state=None, log_level="warning")) as svc:
        api = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{svc.port}/openapi.json", timeout=TIMEOUT).read())
    answers = {(path, method): set(op["responses"]) for path, ops in api["paths"].items() for method, op in ops.items()}
    # (413 on every route: the body cap answers before any route)
    assert answers[("/feeds/mqtt", "post")] == {"201", "400", "401", "403", "409", "413", "422", "502", "503"}
    assert answers[("/feeds/mqtt", "get")] == {"200", "401", "403", "413"}
    assert answers[("/feeds/mqtt/{fid}", "delete")] == {"204", "401", "403", "404", "413", "422", "503"}
