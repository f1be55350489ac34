"""Messages of ``yfpp run --workers N`` written by the thread that sends them: no feeder thread.

A ``multiprocessing.Queue`` writes each message from a feeder thread of the sending process: in a worker, every
scan or batch of matches sent woke that thread, which took the GIL from the matching (thousands of context
switches a run; benchmarks/RESULTS.md, "Workers"). Here a process's **inbox** is one pipe that every sender
writes to (:class:`Inbox`), and a sender writes to it itself (:class:`Outbox`): each message pickled and cut into
fragments of at most ``PIPE_BUF`` bytes, each tagged with its sender, which a pipe takes whole or not at all, so
the senders' fragments never mix; the receiver puts each sender's fragments together again.

Back-pressure is the pipe's: a sender waits while its receiver's pipe is full, so it is never more than a pipe
(64 KiB on Linux) and one message ahead of its receiver. No deadlock when two processes write to each other
with both pipes full: a sender that waits reads its own inbox meanwhile (into a local queue, which holds what
its peers sent it and it has not taken: no more than they send before they wait for it).
"""

from __future__ import annotations

import os
import pickle
import select
import struct
from collections import deque
from typing import Any

FRAGMENT = select.PIPE_BUF  #: the most bytes a pipe takes whole from one write (4096 on Linux)
_HEAD = struct.Struct("!IH?")  # a fragment's sender, its length, and whether it ends its message
_BODY = FRAGMENT - _HEAD.size  # the most bytes of a message a fragment carries
_READ = 1 << 16  # bytes read from a pipe at a time


class Inbox:
    """The reading ends of a process's inbox pipes (``conns``, ``multiprocessing`` connections, kept open with it):
    :meth:`get` gives the messages in the order each sender sent them (the senders' interleaved)."""

    def __init__(self, conns: list[Any]):
        self._conns = conns
        self._buffers = {conn.fileno(): b"" for conn in conns}  # per pipe, the bytes read short of a whole fragment
        self._poll = select.poll()
        for fd in self._buffers:
            os.set_blocking(fd, False)
            self._poll.register(fd, select.POLLIN)
        self._parts: dict[int, list[bytes]] = {}  # per sender, the fragments of its message under way
        self._ready: deque[bytes] = deque()  # whole messages, pickled, not taken yet

    @property
    def fds(self) -> list[int]:
        """The pipes still open at their other end."""
        return list(self._buffers)

    def get(self) -> Any:
        """The next message, waiting for one; ``EOFError`` when there is none and every sender has closed its end."""
        while not self._ready:
            if not self._buffers:
                raise EOFError("every sender closed its end of the inbox")
            for fd, _ in self._poll.poll():
                if fd in self._buffers:  # (not a pipe closed meanwhile: close())
                    self.read(fd)
        return pickle.loads(self._ready.popleft())

    def read(self, fd: int) -> None:
        """What the pipe ``fd`` holds read into the local queue (without waiting)."""
        got = [self._buffers.get(fd, b"")]
        ended = False
        while True:
            try:
                data = os.read(fd, _READ)
            except BlockingIOError:
                break
            if not data:  # (every writing end closed: not polled again)
                ended = True
                break
            got.append(data)
        data = b"".join(got)
        view, at, head = memoryview(data), 0, _HEAD.size
        while len(data) - at >= head:
            sender, size, last = _HEAD.unpack_from(data, at)
            if len(data) - at - head < size:
                break
            part = view[at + head:at + head + size]
            at += head + size
            if last:
                parts = self._parts.pop(sender, None)
                self._ready.append(part.tobytes() if parts is None else b"".join((*parts, part)))
            else:
                self._parts.setdefault(sender, []).append(part.tobytes())
        if ended:
            self._poll.unregister(fd)
            self._buffers.pop(fd, None)
        elif fd in self._buffers:
            self._buffers[fd] = data[at:]

    def close(self) -> None:
        """Every pipe closed, and the messages not taken dropped, even while a thread reads them: its next
        :meth:`get` finds no message and no pipe (``EOFError``)."""
        self._buffers, self._ready = {}, deque()
        for conn in self._conns:
            conn.close()


class Outbox:
    """A writing end (``conn``) of a receiver's inbox pipe, for sender ``sender`` (a number the receiver tells the
    senders apart by); ``exclusive``: the pipe has no other writer (a message is written in as few writes as the pipe
    takes, not a fragment at a time). :meth:`put` pickles and writes a message, waiting while the pipe is full;
    meanwhile it reads ``inbox`` (this process's own, if any: its peers may be waiting to write to it)."""

    def __init__(self, conn: Any, sender: int, inbox: Inbox | None = None, exclusive: bool = False):
        self._conn = conn
        self.fd = conn.fileno()
        os.set_blocking(self.fd, False)
        self.sender = sender
        self.exclusive = exclusive
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLOUT)
        self.inbox = inbox
        for fd in inbox.fds if inbox is not None else ():
            self._poll.register(fd, select.POLLIN)

    def put(self, msg: Any) -> None:
        """``msg`` written (``BrokenPipeError`` when the receiver closed its end)."""
        data = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
        view, size = memoryview(data), len(data)
        frames = (_HEAD.pack(self.sender, min(_BODY, size - at), at + _BODY >= size) + view[at:at + _BODY]
                  for at in range(0, size, _BODY))
        if self.exclusive:
            self._write(memoryview(b"".join(frames)))
        else:
            for frame in frames:
                while True:
                    try:
                        os.write(self.fd, frame)  # (at most PIPE_BUF bytes: written whole, or not at all)
                        break
                    except BlockingIOError:
                        self._wait()

    def _write(self, view: memoryview) -> None:
        """``view`` written to a pipe of one writer, as much at a time as it takes."""
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except BlockingIOError:
                self._wait()

    def _wait(self) -> None:
        """Until the pipe has room (or its reader is gone), reading the own inbox meanwhile."""
        while True:
            ready = False
            for fd, _ in self._poll.poll():
                if fd == self.fd:
                    ready = True
                elif self.inbox is not None:
                    self.inbox.read(fd)
                    if fd not in self.inbox.fds:
                        self._poll.unregister(fd)
            if ready:
                return

    def close(self) -> None:
        self._conn.close()
