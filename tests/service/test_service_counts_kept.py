"""The counters a checkpoint stores, over real sockets on 127.0.0.1: only the subscriptions changed since the last
checkpoint are looked at (``yfpp.service.counts_kept``), and the registry holds what a walk over every
subscription would have stored; the files of a kill -9 right after a checkpoint restore every counter."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.service.test_service_scale import PAIR, config, pairs  # noqa: E402
from tests.service_helpers import LineListener, send, wait_for  # noqa: E402
from yfpp.service.client import Client  # noqa: E402
from yfpp.service.server import BackgroundService, Service  # noqa: E402


def every_count(svc: Service) -> dict[str, dict[str, int]]:
    """(on the loop) The counts a checkpoint that walked every subscription stored: each one's not all 0, with the
    results a TCP connection may still buffer not counted delivered, and the totals."""
    counts = {"": svc.totals.counts()}
    for sid, sub in svc.subs.items():
        counts[sid] = sub.counts()
        if sub.outbox is not None:
            unsent = len(sub.outbox.unsent())
            counts[sid]["delivered"] -= unsent
            counts[""]["delivered"] -= unsent
    return {sid: c for sid, c in counts.items() if sid == "" or any(c.values())}


def stored(state: Path) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """The registry's counts table and its kept results by subscription."""
    with sqlite3.connect(state / "subscriptions.sqlite") as db:
        counts = {sid: json.loads(c) for sid, c in db.execute("SELECT sub, counts FROM counts")}
        kept = dict(db.execute("SELECT sub, count(*) FROM queued GROUP BY sub").fetchall())
    return counts, kept


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(["add", "delete", "events", "checkpoint"]), st.integers(0, 5)),
                      min_size=1, max_size=10), crash_at=st.integers(0, 3))
def test_a_checkpoint_stores_the_counts_a_walk_over_every_subscription_stores_and_a_kill_9_restores_them(
        tmp_path_factory, monkeypatch, steps, crash_at):
    """Subscriptions of which only some match (keys 0-2 in the events, 0-5 in the queries), some with a file
    sink, added and deleted between events and checkpoints: after each checkpoint the registry holds exactly
    the counts (and the totals) of a walk over every subscription at that moment; the files a kill -9 leaves
    right after one restore each counter as it was then, and the results kept are delivered after."""
    tmp = tmp_path_factory.mktemp("state")
    records = pairs(60, 3)
    crash = tmp / "crash"
    fed, checkpoints, seen = 0, 0, {}
    held = Service._held

    def held_and_seen(self, also):  # (the same moment on the loop: what a walk over every subscription gives)
        seen.update(every_count(self))
        return held(self, also)

    monkeypatch.setattr(Service, "_held", held_and_seen)
    with BackgroundService(config(tmp, checkpoint_every=3600, file_sink_dir=str(tmp))) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe_many([{"query": PAIR.format(k=k), "name": f"q{k}",
                           **({"sink": f"file:{tmp}/q{k}.jsonl"} if k % 2 else {})} for k in range(4)])
        for i, (step, k) in enumerate([*steps, ("checkpoint", 0)]):
            sids = sorted(svc.subs)
            if step == "add":
                c.subscribe(PAIR.format(k=k), name=f"n{i}", sink=f"file:{tmp}/n{i}.jsonl" if k % 2 else None)
            elif step == "delete" and sids:
                c.unsubscribe(sids[k % len(sids)])
            elif step == "events":
                send(svc.feed_port("jsonl"), b"".join(records[fed:fed + 5 * k]))
                fed = min(fed + 5 * k, len(records))
                wait_for(lambda: svc.events_in == fed, what="the events")
            elif step == "checkpoint":
                seen.clear()
                assert svc.save_checkpoint()
                counts, kept = stored(tmp / "state")
                assert counts == seen
                checkpoints += 1
                if checkpoints == crash_at + 1 or (i == len(steps) and not crash.exists()):
                    if crash.exists():
                        shutil.rmtree(crash)
                    shutil.copytree(tmp / "state", crash / "state")  # the files a kill -9 now leaves
                    at_crash = (counts, kept)
    monkeypatch.undo()
    counts, kept = at_crash
    with BackgroundService(config(crash, file_sink_dir=str(tmp))) as svc:
        assert set(counts) - {""} <= set(svc.subs)
        for sid, sub in [("", svc.totals), *svc.subs.items()]:  # (the results kept are queued again, then delivered)
            want = {**dict.fromkeys(sub.counts(), 0), **counts.get(sid, {})}
            want["delivered"] += sum(kept.values()) if sid == "" else kept.get(sid, 0)
            wait_for(lambda sub=sub, want=want: sub.counts() == want, what=f"{sid or 'the totals'}: the counts restored")


def test_results_a_push_sink_holds_stay_kept_at_each_checkpoint_while_its_counts_stand_still(tmp_path):
    """A subscription whose sink is down holds its results, its counts not moving: each later checkpoint still
    looks at it and keeps them (a kill -9 then loses none)."""
    out = LineListener(listen=False)
    records = pairs(40, 1)
    try:
        with BackgroundService(config(tmp_path, checkpoint_every=3600)) as svc:
            Client(f"http://127.0.0.1:{svc.port}").subscribe_many(
                [{"query": PAIR.format(k=0), "name": "down", "sink": out.url}, {"query": PAIR.format(k=1)}])
            send(svc.feed_port("jsonl"), b"".join(records))
            sub = svc.subs["s1"]
            wait_for(lambda: sub.counters.matches > 0 and svc.events_in == len(records), what="the matches")
            for _ in range(3):
                assert svc.save_checkpoint()
                counts, kept = stored(tmp_path / "state")
                assert kept == {"s1": sub.queued} and counts["s1"]["matches"] == sub.counters.matches
    finally:
        out.close()
