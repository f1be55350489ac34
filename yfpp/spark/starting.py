"""The driver's JVM and Spark session started in the background, while ``yfpp spark`` reads its queries.

Reading and checking a thousand queries takes the driver 1–2 s, starting the
JVM and session 3–5 s, mostly in the JVM: side by side they share the cores
instead of taking turns. The JVM's messages (its start-up warnings, Spark's
log lines) are held back until the queries are known to be good — a query
error is then one ``yfpp: error:`` line, the JVM is killed and nothing it
said is shown — and passed on to stderr from then on. With ``quiet`` (Spark's
log off, ``yfpp spark``'s default) what the JVM said while starting is dropped
once the session is up (shown when the start failed: it may say why).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import IO, Any


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
                gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
                with self.lock:
                    self.proc = gateway.proc
                    cancelled = self.cancelled
                threading.Thread(target=self._pass_on, args=(gateway.proc.stderr,), daemon=True).start()
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
        """The session (what the JVM said so far written out, and from now on as it comes); the
        exception of a failed start raised."""
        self.thread.join()
        sys.setswitchinterval(self.interval)
        self._release(drop=self.quiet and self.error is None)
        if self.error is not None:
            raise self.error
        return self.value

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
