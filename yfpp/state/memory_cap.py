"""The engine's memory cap: a registration is refused, with an error, once the process's resident set has reached
it — never left to run the machine out of memory (docs/operations.md, "Memory caps").

The resident set is read from ``/proc/self/statm`` (Linux; elsewhere the peak from ``getrusage``), not at every
registration: far below the cap it is read again only after as many registrations as could, at
:data:`KIB_PER_QUERY_BOUND` each, come within :data:`NEAR_KIB` of it (:data:`MAX_SKIP` at most); near the cap,
at every one.
"""

from __future__ import annotations

import gc
import os
import sys
from contextlib import contextmanager
from typing import Iterator

from yfpp.errors import YfppError

#: a generous bound on what one registration adds (the subscriptions of benchmarks/RESULTS.md take 1–15 KiB)
KIB_PER_QUERY_BOUND = 64
NEAR_KIB = 64 * 1024  #: within this of the cap, every registration reads the resident set
MAX_SKIP = 1024  #: and at least every this many (runs and buffered events grow it too)
DEFAULT_SHARE = 0.8  #: the default cap: this share of the machine's physical memory


def rss_kib() -> int:
    """The process's resident set now, in KiB (the peak where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak // 1024 if sys.platform == "darwin" else peak  # (bytes on macOS, KiB elsewhere)


def physical_mib() -> int | None:
    """The machine's physical memory in MiB, if the system says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (OSError, ValueError, AttributeError):
        return None


def default_cap_mib() -> int | None:
    """``YFPP_MAX_MEMORY_MB`` if set, else :data:`DEFAULT_SHARE` of physical memory (None: unknown, no cap)."""
    env = os.environ.get("YFPP_MAX_MEMORY_MB")
    if env is not None:
        if not env.strip().isdigit() or int(env) < 1:
            raise YfppError(f"YFPP_MAX_MEMORY_MB must be an integer >= 1 (MiB), not {env!r}")
        return int(env)
    total = physical_mib()
    return None if total is None else max(1, int(total * DEFAULT_SHARE))


class MemoryCap:
    """Refuses registrations once the resident set reaches ``limit_mib`` (None: never)."""

    __slots__ = ("_skip", "limit_mib")

    def __init__(self, limit_mib: int | None) -> None:
        self.limit_mib = limit_mib
        self._skip = 0  # registrations to admit before reading the resident set again

    def admit(self) -> None:
        """Raise a :class:`YfppError` if one more query may not be registered."""
        if self.limit_mib is None:
            return
        if self._skip:
            self._skip -= 1
            return
        used, limit = rss_kib(), self.limit_mib * 1024
        if used >= limit:
            raise YfppError(f"the process holds {used // 1024:,} MiB, at the engine's memory cap max_memory_mb="
                            f"{self.limit_mib:,}: registration refused (unregister some queries, or give "
                            f"Engine(max_memory_mb=…) / YFPP_MAX_MEMORY_MB more; docs/operations.md, \"Memory caps\")")
        self._skip = min(MAX_SKIP, max(0, limit - used - NEAR_KIB) // KIB_PER_QUERY_BOUND)


#: ``gc.set_threshold`` of a process that matches (``yfpp run``, ``yfpp serve``, the worker processes, a Spark task):
#: runs, buffered events and matches form no reference cycles, and the collector rescanning them every 700
#: allocations took a tenth to a third of the time
RARE_COLLECTIONS = (100_000, 50, 100)

_FEW = 50_000  #: objects made while paused below which :func:`collection_paused` leaves them young


@contextmanager
def collection_paused(freeze: bool = False) -> Iterator[None]:
    """No garbage collection while queries register (``Engine.register``, ``register_many``, a checkpoint's
    restore) or a snapshot is taken: the objects a registration makes live on, and collecting them as they come
    made a batch half again as long; a snapshot's hold no cycle.
    After, they go to the oldest generation unscanned (frozen and unfrozen), where the next full collection
    finds them, not the first young one (which would walk all of them at once) — unless objects are frozen
    already (``yfpp serve`` freezes a restored engine's): those stay so. A few objects made (fewer than
    :data:`_FEW`: a query or two) stay young: asking whether objects are frozen walks every frozen one (0.2 s in a
    service of 100,000 subscriptions, at each ``POST /subscriptions``), a young collection only those few.
    ``freeze``: after, every object is frozen (``gc.freeze``, the application's too: ``Engine(freeze_registered=True)``)."""
    collecting = gc.isenabled()
    gc.disable()
    young = gc.get_count()[0]
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if collecting:
            if not freeze and gc.get_count()[0] - young >= _FEW and not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
