"""The workers' pipes (:mod:`yfpp.workers.pipes`): messages whole and in each sender's order, a sender waiting while
its receiver's pipe is full, no deadlock between two processes writing to each other, a worker's crash reported."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given, settings, strategies as st

from yfpp.workers.pipes import FRAGMENT, Inbox, Outbox

CTX = multiprocessing.get_context("spawn")  # (no fork of the test process and its threads)
BIG = 100_000  #: bytes of a large message: more than a pipe holds with a few of them
ROOT = Path(__file__).resolve().parents[2]


def payload(sender: int, i: int, size: int) -> bytes:
    return bytes([sender, i % 256]) * (size // 2)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3 * FRAGMENT)), max_size=40), st.booleans())
def test_messages_of_senders_sharing_a_pipe_come_whole_in_each_senders_order(sent, exclusive):
    """Three senders write to one pipe (one sender: a pipe of its own, written in as few writes as it takes),
    messages of any size, larger than a fragment or not: each comes out whole, each sender's in its order; a sender
    whose pipe is full reads its own inbox meanwhile (here the same pipe: it never waits on itself)."""
    reading, writing = CTX.Pipe(duplex=False)
    inbox = Inbox([reading])
    senders = [Outbox(writing, s, inbox, exclusive=exclusive) for s in range(3)]
    if exclusive:
        sent = [(0, size) for _, size in sent]
    try:
        for i, (s, size) in enumerate(sent):
            senders[s].put((s, payload(s, i, size)))
        got = [inbox.get() for _ in sent]
    finally:
        writing.close()
        reading.close()
    for s in range(3):
        assert [m for m in got if m[0] == s] == [(s, payload(s, i, size)) for i, (t, size) in enumerate(sent) if t == s]


def test_the_inbox_ends_once_every_sender_closed_its_end():
    reading, writing = CTX.Pipe(duplex=False)
    inbox = Inbox([reading])
    Outbox(writing, 0).put("last")
    writing.close()
    assert inbox.get() == "last"
    try:
        inbox.get()
        raise AssertionError("an inbox whose senders are gone gave a message")
    except EOFError:
        pass
    finally:
        inbox.close()


def _send_then_read(me: int, own: object, peer: object, results: object, count: int) -> None:
    """Worker ``me``: ``count`` large messages to its peer before it reads one of the peer's, then its peer's back."""
    inbox = Inbox([own])
    to_peer = Outbox(peer, me, inbox)
    for i in range(count):
        to_peer.put((i, payload(me, i, BIG)))
    got = [inbox.get() for _ in range(count)]
    ok = got == [(i, payload(1 - me, i, BIG)) for i in range(count)]
    Outbox(results, me, inbox, exclusive=True).put((me, ok))


def test_two_workers_sending_each_other_more_than_a_pipe_holds_do_not_deadlock():
    """Two processes each write the other 20 messages of 100 kB (2 MB, a pipe holds 64 kB) before either reads:
    while a write waits, the writer reads its own inbox, so both finish, each with the other's messages in order."""
    pipes = [CTX.Pipe(duplex=False) for _ in range(2)]
    results, results_end = CTX.Pipe(duplex=False)
    procs = [CTX.Process(target=_send_then_read, args=(me, pipes[me][0], pipes[1 - me][1], results_end, 20),
                         daemon=True) for me in range(2)]
    try:
        for p in procs:
            p.start()
        results_end.close()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0, 0]
        inbox = Inbox([results])
        assert sorted(inbox.get() for _ in range(2)) == [(0, True), (1, True)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


def _send_counting(end: object, count: object, messages: int) -> None:
    out = Outbox(end, 0)
    for i in range(messages):
        out.put(payload(0, i, BIG // 4))
        with count.get_lock():
            count.value += 1


def test_a_sender_waits_while_its_receivers_pipe_is_full():
    """A receiver that does not read: its sender gets no further than the pipe holds (back-pressure, so what a
    worker sends ahead is bounded); once the receiver reads, every message comes, in order."""
    reading, writing = CTX.Pipe(duplex=False)
    holds = fcntl.fcntl(reading.fileno(), fcntl.F_GETPIPE_SZ)
    count = CTX.Value("i", 0)
    messages = 4 * holds // (BIG // 4) + 4
    proc = CTX.Process(target=_send_counting, args=(writing, count, messages), daemon=True)
    try:
        proc.start()
        writing.close()
        last, deadline = -1, time.monotonic() + 60
        while count.value != last and time.monotonic() < deadline:  # (until the sender stops: blocked)
            last = count.value
            time.sleep(1.0)
        assert count.value <= holds // (BIG // 4) + 1
        inbox = Inbox([reading])
        assert [inbox.get() for _ in range(messages)] == [payload(0, i, BIG // 4) for i in range(messages)]
        proc.join(60)
        assert proc.exitcode == 0 and count.value == messages
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        reading.close()


def test_a_worker_killed_while_the_workers_read_is_reported_not_waited_for(tmp_path):
    """``yfpp run --workers 2`` over a file the workers read, one worker killed once the first matches are written
    (its peer then waits for its scans): the command ends within a bound with an error naming the worker."""
    path, out = tmp_path / "feed.jsonl", tmp_path / "out.jsonl"
    path.write_text("".join(f'{{"type": "{"ab"[i % 2]}", "ts": {i}, "k": {i % 7}}}\n' for i in range(300_000)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-m", "yfpp", "run", "-q", "PATTERN SEQ(a x, b y) WHERE [k] WITHIN 30",
                             "-i", str(path), "--workers", "2", "-o", str(out), "--progress", "never"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.01)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 2
        os.kill(int(children[0]), 9)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0 and "stopped (exit status -9)" in err
