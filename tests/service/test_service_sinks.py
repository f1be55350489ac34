"""The push sinks on their own, over real sockets on 127.0.0.1: batched delivery, reconnects, overflow counting."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from yfpp.service.sink_urls import sink_for
from yfpp.service.sinks import Counters, Outbox

TIMEOUT = 10.0


def result(i: int) -> dict:
    return {"query": "q", "id": f"{i:016x}", "bindings": {"a": [i]}, "start": float(i), "end": float(i)}


class Listener:
    """An asyncio TCP listener recording the lines of every connection (``read=False``: accepts, never reads)."""

    def __init__(self, read: bool = True):
        self.read = read
        self.lines: list[dict] = []
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self, port: int = 0) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", port, reuse_address=True)
        return self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        if not self.read:
            await asyncio.sleep(TIMEOUT)
            return
        while line := await reader.readline():
            self.lines.append(json.loads(line))

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        await self.server.wait_closed()


async def until(cond, what: str) -> None:
    end = asyncio.get_running_loop().time() + TIMEOUT
    while not cond():
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sink(url: str, size: int = 100_000, overflow: str = "drop_oldest"):
    counters = Counters()
    outbox = Outbox(size, overflow, counters)
    sink = sink_for(url, "json")
    sink.start(outbox)
    return sink, outbox, counters


def test_tcp_sink_writes_batches_in_order_over_one_connection():
    async def main() -> None:
        listener = Listener()
        port = await listener.start()
        sink, outbox, counters = start_sink(f"tcp://127.0.0.1:{port}")
        for i in range(5000):  # one loop turn: one flush, written in chunks
            outbox.offer(result(i))
        await until(lambda: len(listener.lines) == 5000, "5000 lines")
        for i in range(5000, 5100):  # one at a time, a loop turn each
            outbox.offer(result(i))
            await asyncio.sleep(0)
        await until(lambda: len(listener.lines) == 5100, "5100 lines")
        assert listener.lines == [result(i) for i in range(5100)]
        assert listener.connections == 1
        assert (counters.delivered, counters.dropped, len(outbox.items)) == (5100, 0, 0)
        await sink.stop()
        await listener.close()

    asyncio.run(main())


def test_a_tcp_sink_counts_a_chunk_queued_until_it_counts_it_delivered():
    """Each result is queued (waiting or being sent) or delivered at every instant, also while a chunk is
    encoded: a thread other than the loop's reading the counts then sees them add up."""
    async def main() -> None:
        listener = Listener()
        port = await listener.start()
        sink, outbox, counters = start_sink(f"tcp://127.0.0.1:{port}")
        seen: list[int] = []
        encode = sink.encode

        def watched(r: dict) -> bytes:
            seen.append(len(outbox.items) + outbox.in_flight + counters.delivered)
            return encode(r)

        sink.encode = watched
        for i in range(3000):  # three chunks, the last of them short
            outbox.offer(result(i))
        await until(lambda: len(listener.lines) == 3000, "3000 lines")
        assert set(seen) == {3000} and (outbox.in_flight, counters.delivered) == (0, 3000)
        await sink.stop()
        await listener.close()

    asyncio.run(main())


def test_tcp_sink_counts_overflow_while_down_and_reconnects_when_the_listener_comes_back():
    async def main() -> None:
        port = free_port()
        sink, outbox, counters = start_sink(f"tcp://127.0.0.1:{port}", size=20)
        for i in range(50):
            outbox.offer(result(i))
        await until(lambda: counters.last_error is not None, "a connect error")
        assert (counters.dropped, len(outbox.items), counters.delivered) == (30, 20, 0)
        listener = Listener()
        await listener.start(port)  # back: the sink's backoff retry finds it
        await until(lambda: len(listener.lines) == 20, "the 20 queued results")
        assert [r["id"] for r in listener.lines] == [result(i)["id"] for i in range(30, 50)]  # drop_oldest
        await listener.close()  # the listener goes away (closing the connection) and comes back
        await until(lambda: sink.transport is None, "the sink to notice")
        listener2 = Listener()
        await listener2.start(port)
        for i in range(50, 60):
            outbox.offer(result(i))
        await until(lambda: len(listener2.lines) == 10, "10 results after the reconnect")
        assert [r["id"] for r in listener2.lines] == [result(i)["id"] for i in range(50, 60)]
        assert counters.delivered + counters.dropped + len(outbox.items) == 60
        await sink.stop()
        await listener2.close()

    asyncio.run(main())


def test_drop_newest_keeps_the_first_results():
    async def main() -> None:
        port = free_port()
        sink, outbox, counters = start_sink(f"tcp://127.0.0.1:{port}", size=5, overflow="drop_newest")
        for i in range(12):
            outbox.offer(result(i))
        assert (counters.dropped, [r["id"] for r in outbox.items]) == (7, [result(i)["id"] for i in range(5)])
        listener = Listener()
        await listener.start(port)
        await until(lambda: len(listener.lines) == 5, "the 5 kept results")
        assert listener.lines == [result(i) for i in range(5)]
        await sink.stop()
        await listener.close()

    asyncio.run(main())


def test_a_reader_that_never_reads_fills_only_its_own_queue():
    async def main() -> None:
        slow = Listener(read=False)
        port = await slow.start()
        sink, outbox, counters = start_sink(f"tcp://127.0.0.1:{port}", size=100)
        big = {"pad": "x" * 1000}
        outbox.offer({**result(0), **big})
        await until(lambda: slow.connections == 1, "the connection")
        for i in range(1, 20_000):  # ~20 MB: more than the socket buffers and the sink's high-water mark hold
            outbox.offer({**result(i), **big})
            if i % 50 == 0:
                await asyncio.sleep(0)
        await until(lambda: sink.paused, "the connection to push back")
        assert counters.dropped > 0 and len(outbox.items) == 100
        assert counters.delivered + counters.dropped + len(outbox.items) == 20_000
        await sink.stop()
        await slow.close()

    asyncio.run(main())


def test_file_sink_retries_until_the_directory_exists(tmp_path: Path):
    async def main() -> None:
        target = tmp_path / "later" / "out.jsonl"
        sink, outbox, counters = start_sink(f"file:{target}")
        for i in range(3):
            outbox.offer(result(i))
        await until(lambda: counters.last_error is not None, "a write error")
        assert counters.delivered == 0 and len(outbox.items) == 3
        target.parent.mkdir()
        await until(lambda: counters.delivered == 3, "the retry")
        outbox.offer(result(3))
        await until(lambda: counters.delivered == 4, "the next write")
        await sink.stop()
        assert [json.loads(x) for x in target.read_text().splitlines()] == [result(i) for i in range(4)]

    asyncio.run(main())


def test_a_socket_connected_to_itself_is_no_destination():
    """Connecting to a port where nothing listens can connect the socket to itself (same local port); refused."""

    async def main() -> None:
        port = free_port()
        sink, outbox, counters = start_sink(f"tcp://127.0.0.1:{port}")
        loop = asyncio.get_running_loop()
        connect = loop.create_connection

        def from_same_port(factory, host, port_, **kw):  # what the kernel may pick on its own
            return connect(factory, host, port_, local_addr=("127.0.0.1", port), **kw)

        loop.create_connection = from_same_port  # type: ignore[method-assign]
        outbox.offer(result(0))
        await until(lambda: counters.last_error is not None, "the refusal")
        assert "connected to itself" in counters.last_error and counters.delivered == 0 and len(outbox.items) == 1
        await sink.stop()

    asyncio.run(main())


def loop_errors() -> list[dict]:
    """What the running loop's exception handler gets from now on (a callback's or a lost task's traceback)."""
    errors: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
    return errors


def test_an_unexpected_connect_error_is_recorded_and_retried():
    """A connect step raising what no network error is (ValueError) fails like a refusal: recorded, retried, queue kept."""

    async def main() -> None:
        errors = loop_errors()
        listener = Listener()
        port = await listener.start()
        sink, outbox, counters = start_sink(f"tcp://127.0.0.1:{port}")
        loop = asyncio.get_running_loop()
        connect = loop.create_connection
        calls = []

        def broken_once(*args, **kw):
            calls.append(args)
            if len(calls) == 1:
                raise ValueError("no such host form")
            return connect(*args, **kw)

        loop.create_connection = broken_once  # type: ignore[method-assign]
        for i in range(3):
            outbox.offer(result(i))
        await until(lambda: counters.last_error is not None, "the error")
        assert counters.last_error == f"tcp://127.0.0.1:{port}: ValueError: no such host form"
        assert counters.delivered == 0 and len(outbox.items) == 3
        await until(lambda: len(listener.lines) == 3, "the retry")
        assert listener.lines == [result(i) for i in range(3)] and len(calls) == 2 and errors == []
        await sink.stop()
        await listener.close()

    asyncio.run(main())


def test_an_unexpected_write_error_drops_the_connection_and_resends_on_the_next():
    async def main() -> None:
        errors = loop_errors()
        listener = Listener()
        port = await listener.start()
        sink, outbox, counters = start_sink(f"tcp://127.0.0.1:{port}")
        encoded = sink.encoded

        def broken_once(batch: list[dict]) -> bytes:
            sink.encoded = encoded  # type: ignore[method-assign]
            raise RuntimeError("write refused")

        sink.encoded = broken_once  # type: ignore[method-assign]
        for i in range(3):
            outbox.offer(result(i))
        await until(lambda: len(listener.lines) == 3, "the results on a new connection")
        assert listener.lines == [result(i) for i in range(3)] and listener.connections == 2
        assert "RuntimeError: write refused" in counters.last_error and counters.delivered == 3 and errors == []
        await sink.stop()
        await listener.close()

    asyncio.run(main())


def test_a_file_path_open_refuses_is_recorded_and_retried(tmp_path: Path):
    async def main() -> None:
        errors = loop_errors()
        target = tmp_path / "out.jsonl"
        sink, outbox, counters = start_sink(f"file:{target}\0")  # a path open() refuses (ValueError)
        for i in range(3):
            outbox.offer(result(i))
        await until(lambda: counters.last_error is not None, "the error")
        assert counters.last_error.endswith("ValueError: embedded null byte")
        assert counters.delivered == 0 and len(outbox.items) == 3
        sink.path = str(target)  # the next retry can open it
        await until(lambda: counters.delivered == 3, "the retry")
        await sink.stop()
        assert [json.loads(x) for x in target.read_text().splitlines()] == [result(i) for i in range(3)]
        assert errors == []

    asyncio.run(main())


@pytest.mark.parametrize("url, error", [("http://127.0.0.1:9/\0", "InvalidURL"),  # httpx does not wrap these
                                        ("http://127.0.0.1:99999/", "ExceptionGroup")])
def test_a_webhook_whose_client_raises_unwrapped_keeps_its_task_and_queue(url: str, error: str):
    pytest.importorskip("httpx", reason="the webhook sink needs pip install -e '.[serve]' in yfpp's clone")

    async def main() -> None:
        errors = loop_errors()
        sink, outbox, counters = start_sink(url)
        for i in range(3):
            outbox.offer(result(i))
        await until(lambda: counters.last_error is not None, "the error")
        assert counters.last_error.startswith(f"{url}: {error}: ")
        await asyncio.sleep(0.3)  # a retry or two, each given the batch back
        assert counters.delivered == 0 and len(outbox.items) + outbox.in_flight == 3 and not sink._task.done()
        await sink.stop()
        assert errors == []

    asyncio.run(main())
