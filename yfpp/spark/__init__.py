"""yfpp on PySpark (``pip install -e '.[spark]'`` in yfpp's clone; see docs/spark.md).

* :func:`read_events_df` — XML / JSON-lines files as an event DataFrame with global seq numbers;
* :func:`match` — the matches of queries over an event DataFrame (batch);
* :func:`stream_matches` — the same over a streaming DataFrame, state kept per key.

pyspark is imported only when one of these is first used.

Modules: ``cli`` (``yfpp spark``), ``starting`` (the JVM and session started while queries are read),
``inputs``, ``parse`` and ``read`` (inputs through Spark's file systems, parsed on the executors), ``plan``
(query groups, partition and slice plans), ``ranges`` (byte ranges of the input, read once each), ``scan`` and ``batch`` (the scan and shuffle plans of a batch
job), ``line_scan`` and ``line_kernels`` (the scan plan's plain JSON lines routed unparsed by a compiled scan, numba), ``hot_keys`` (a keyed group's hot keys cut into time slices), ``shuffle_hot`` (the shuffle plan's hot key
hashes, found by a Spark aggregation), ``ingest`` and ``stream`` (a directory
stream), ``stream_hot`` (a stream's hot keys cut into time slices), ``stream_stats`` (a stream's stages for ``--stats``), ``shipped`` (the state function's query groups, unpickled once per Python worker), ``source`` (the socket source), ``live_sources`` (``tcp://``, ``mqtt://``: the data source's planning half; ``kafka://``), ``live_receiver`` (their receiver task on an executor), ``live_spool`` (the spool and its published offsets), ``live_parse`` (their spooled chunks parsed on the executors), ``costs`` (per-step
costs for ``--stats``, JVM options, the class-data archive), ``timeline`` (``--stats``' timeline: the run's
milestones and Spark's jobs, seconds since the process started), ``errors`` (a failure of the JVM, the
cluster manager, a source or a sink as one line naming Spark's cause), ``shipping`` (yfpp's packages sent to a
cluster's executors, what they need checked and their Python workers warmed at job start), ``machine_cache``
(what a machine keeps between applications: the shipped zip, the line scan's kernels beside numba's cache), ``table`` (``--table`` writes, appending across runs).
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {"match": "batch", "read_events_df": "read", "stream_matches": "stream", "read_stream": "stream"}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'yfpp.spark' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"yfpp.spark.{_EXPORTS[name]}"), name)
