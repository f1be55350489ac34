"""The driver's JVM and Spark session started in the background, while ``yfpp spark`` reads its queries.

Reading and checking a thousand queries takes the driver 1–2 s, starting the
JVM and session 3–5 s, mostly in the JVM: side by side they share the cores
instead of taking turns. The JVM's messages (its start-up warnings, Spark's
log lines) are held back until the queries are known to be good — a query
error is then one ``yfpp: error:`` line, the JVM is killed and nothing it
said is shown — and passed on to stderr from then on. With ``quiet`` (Spark's
log off, ``yfpp spark``'s default) what the JVM said while starting is dropped
once the session is up (shown when the start failed and :mod:`yfpp.spark.errors` finds no cause in
it). The end of what the JVM said is kept (:meth:`StartingSession.jvm`): when the JVM dies — out of
memory, or spark-submit refusing ``--master`` — the cause is there, not in the Python error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import deque
from typing import IO, Any

from yfpp.errors import YfppError
from yfpp.spark.errors import Jvm, error_text, jvm_gone, spark_cause

#: Lines of the JVM's stderr kept for :meth:`StartingSession.jvm`.
KEPT_LINES = 400


class StartingSession:
    """``builder.getOrCreate()`` run on a thread of its own; :meth:`result` waits for the session,
    :meth:`cancel` kills the JVM it started. The interpreter switches threads every 0.5 ms
    meanwhile (5 ms by default), so that the starting thread's many short calls to the JVM do not
    wait for the reading thread's time slices."""

    def __init__(self, builder: Any, quiet: bool = False):
        self.quiet = quiet
        self.value: Any = None
        self.error: BaseException | None = None
        self.proc: subprocess.Popen | None = None
        self.cancelled = False
        self.lock = threading.Lock()
        self.held: list[bytes] | None = []  # the JVM's stderr lines, until the queries are known good
        self.tail: deque[bytes] = deque(maxlen=KEPT_LINES)  # its last lines, for the cause of a failure
        self.reader: threading.Thread | None = None
        self.jvm_up: float | None = None  # the epoch second the JVM's gateway answered (a JVM this started)
        self.builder_options: dict[str, str] = dict(getattr(builder, "_options", {}))
        self.interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self.interval, 0.0005))
        self.thread = threading.Thread(target=self._start, args=(builder,), name="yfpp: start JVM + session",
                                       daemon=True)
        self.thread.start()

    def _start(self, builder: Any) -> None:
        from pyspark import SparkConf, SparkContext
        from pyspark.java_gateway import launch_gateway

        try:
            if SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
                conf = SparkConf()  # what getOrCreate gives the JVM it launches
                for key, value in builder._options.items():
                    conf.set(key, value)
                # the JVM's stderr is read from the start, so that a JVM which exits before the gateway is up
                # (spark-submit refusing --master) still says why
                read_end, write_end = os.pipe()
                self.reader = threading.Thread(target=self._pass_on, args=(os.fdopen(read_end, "rb"),), daemon=True)
                self.reader.start()
                try:
                    gateway = launch_gateway(conf, popen_kwargs={"stderr": write_end})
                finally:
                    os.close(write_end)
                self.jvm_up = time.time()
                with self.lock:
                    self.proc = gateway.proc
                    cancelled = self.cancelled
                if cancelled:
                    gateway.proc.kill()
                    return
                SparkContext._ensure_initialized(gateway=gateway, conf=conf)
            self.value = builder.getOrCreate()
        except BaseException as e:
            self.error = e

    def _pass_on(self, stream: IO[bytes]) -> None:
        """The JVM's stderr: held while :attr:`held` is a list, then written to ours."""
        for line in iter(stream.readline, b""):
            with self.lock:
                self.tail.append(line)
                if self.cancelled:
                    continue
                if self.held is not None:
                    self.held.append(line)
                    continue
            _write(line)

    def _release(self, drop: bool) -> None:
        with self.lock:
            held, self.held = self.held, None
        for line in () if drop else held or ():
            _write(line)

    def result(self) -> Any:
        """The session (what the JVM said so far written out — with ``quiet``, dropped — and from now on
        as it comes). A failed start raises :class:`YfppError` naming its cause (:func:`spark_cause`, what
        the JVM said dropped with ``quiet``), or its own exception when no cause is found."""
        self.thread.join()
        sys.setswitchinterval(self.interval)
        if self.error is None:
            self._release(drop=self.quiet)
            return self.value
        cause = spark_cause(self.error, self.master, self.jvm(wait=5.0 if jvm_gone(error_text(self.error)) else 0.0))
        self._release(drop=self.quiet and cause is not None)
        if cause is not None:
            master = self.master
            where = f" with --master {master}" if master and not master.startswith("local") else ""
            raise YfppError(f"cannot start Spark{where}: {cause}") from None
        raise self.error

    @property
    def master(self) -> str | None:
        return self.builder_options.get("spark.master")

    def jvm(self, wait: float = 0.0) -> Jvm:
        """The end of what the JVM said, and its exit status once it has exited (waited for up to ``wait``
        seconds, and as long again for its last words to be read)."""
        proc = self.proc
        code = None
        if proc is not None:
            try:
                code = proc.wait(wait) if wait else proc.poll()
            except subprocess.TimeoutExpired:
                pass
        if self.reader is not None and (code is not None or proc is None):
            self.reader.join(wait)
        with self.lock:
            said = b"".join(self.tail).decode("utf-8", "replace")
        return Jvm(said, code)

    def cancel(self) -> None:
        """Kill the JVM this started (what it said dropped) and forget its gateway, or stop the session
        it joined; wait for the starting thread to end."""
        from pyspark import SparkContext

        with self.lock:
            self.cancelled = True
            proc = self.proc
        if proc is not None:
            proc.kill()
        self.thread.join()
        sys.setswitchinterval(self.interval)
        if self.value is not None and proc is None:
            self.value.stop()
        proc = self.proc
        if proc is not None:
            proc.kill()
            proc.wait()
            SparkContext._active_spark_context = None
            gateway, SparkContext._gateway, SparkContext._jvm = SparkContext._gateway, None, None
            if gateway is not None:
                try:
                    gateway.shutdown()
                except Exception:
                    pass


def _write(line: bytes) -> None:
    try:
        sys.stderr.write(line.decode("utf-8", "replace"))
        sys.stderr.flush()
    except (OSError, ValueError):  # our stderr closed
        pass
