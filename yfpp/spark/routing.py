"""Which of the scan plan's matching tasks an event goes to, from the parsed event or from its line only scanned.

Of a keyed group, task key hash (:func:`value_hash`) modulo ``n``; a hot key's time slice ``s`` (hot key
``i`` of group ``g``), task ``(s + g + i) mod n``; a sliced group's slice ``s``, task ``(s + g) mod n``; a
whole group, task ``g mod n``. :func:`destinations` routes parsed events; :func:`line_destinations` routes
lines by what :func:`yfpp.input.jsonl_scan.scan_block` found in them (each line's ts and its key values as
JSON text) to the tasks their events would go to.
"""

from __future__ import annotations

import operator
import zlib
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np
import orjson

from yfpp.input.events import MISSING, PSEUDO_ATTRS, Event
from yfpp.spark.hot_keys import hashable
from yfpp.spark.plan import Group, Slicing

if TYPE_CHECKING:
    from yfpp.spark.scan import ScanJob

Tasks = list[Any]  #: per event: one task (an int), several (a set), or None (no task matches it)


def value_hash(v: Any) -> int:
    """A hash of one key value that every process computes alike (no salted ``str`` hash) and that
    values Python finds equal share: numbers by Python's numeric hash (``7``, ``7.0``, ``True``/``1``
    alike), text by CRC-32, anything else by its repr's."""
    t = type(v)
    if t is int or t is bool or (t is float and v == v):  # NaN's hash is its identity
        return hash(v)
    return zlib.crc32((v if t is str else repr(v)).encode("utf-8", "surrogatepass"))


def key_tasks(events: list[Event], key: tuple[str, ...], n: int) -> list[int | None]:
    """The task of each event's key value among ``n`` (its :func:`value_hash` modulo ``n``; several
    attributes' hashes combined), None for an event that lacks a key attribute."""
    out: list[int | None] = []
    if len(key) == 1 and key[0] not in PSEUDO_ATTRS:  # the common case, inlined
        a = key[0]
        for ev in events:
            v = ev.attrs.get(a, MISSING)
            if v is MISSING:
                out.append(None)
                continue
            t = type(v)
            out.append((hash(v) if t is int or (t is float and v == v) else value_hash(v)) % n)
        return out
    for ev in events:
        h = 0
        for a in key:
            v = ev.get(a)
            if v is MISSING:
                out.append(None)
                break
            h = h * 1_000_003 + value_hash(v)
        else:
            out.append(h % n)
    return out


def text_tasks(texts: list[bytes], n: int) -> list[int]:
    """:func:`key_tasks` of one attribute from its scanned values (an integer, or a string without escapes, as
    JSON text): an integer's hash, a string's CRC-32 of its bytes (its UTF-8), each distinct text hashed once."""
    task = {t: (zlib.crc32(t[1:-1]) if t[:1] == b'"' else hash(int(t))) % n for t in set(texts)}
    return list(map(task.__getitem__, texts))


def destinations(job: ScanJob, events: list[Event]) -> Tasks:
    """The matching tasks each event goes to."""
    n = job.n
    return _route(job, len(events), lambda: [ev.ts for ev in events], lambda grp: key_tasks(events, grp.key, n),
                  lambda grp: map(grp.key_of, events))


def line_destinations(job: ScanJob, ts: list[float], values: dict[str, list[bytes]]) -> Tasks:
    """The matching tasks of scanned lines' events: ``ts`` each line's, ``values`` per key attribute each line's
    value as JSON text (every keyed group keyed by one of them)."""
    n = job.n

    def keys(grp: Group) -> Iterable[tuple]:
        texts = values[grp.key[0]]
        parsed = {t: (orjson.loads(t),) for t in set(texts)}
        return map(parsed.__getitem__, texts)

    return _route(job, len(ts), lambda: ts, lambda grp: text_tasks(values[grp.key[0]], n), keys)


def _route(job: ScanJob, count: int, times: Callable[[], list[float]], keyed: Callable[[Group], list],
           key_values: Callable[[Group], Iterable[tuple | None]]) -> Tasks:
    """The tasks of ``count`` events given their ts (``times``), a keyed group's task of each (``keyed``) and
    its key values (``key_values``, for the hot keys)."""
    n = job.n
    per_group: list[list[Any]] = []
    fixed: set[int] = set()  # the tasks of whole groups (and of sliced ones run whole)
    for g, grp in enumerate(job.groups):
        sl = job.slicings.get(g)
        if grp.key:
            tasks = keyed(grp)
            hot = job.hot.get(g)
            if hot:
                _hot_tasks(tasks, key_values(grp), times(), hot, g, n)
            per_group.append(tasks)
        elif sl is not None:
            per_group.append([{(s + g) % n for s in sl.reads(t)} or None for t in times()])  # (late: task 0 checks)
        else:
            fixed.add(g % n)
    if len(per_group) == 1 and not fixed:  # one keyed or sliced group: its own tasks
        return per_group[0]
    out: list[Any] = [set(fixed) for _ in range(count)]
    for tasks in per_group:
        for ds, t in zip(out, tasks):
            if type(t) is int:
                ds.add(t)
            elif t:
                ds |= t
    return [ds or None for ds in out]


def _hot_tasks(tasks: list[Any], keys: Iterable[tuple | None], times: list[float], hot: dict[Any, Slicing],
               g: int, n: int) -> None:
    """``tasks`` of group ``g`` with each hot key's events sent to the tasks of their time slices instead."""
    numbered = {key: (i, sl) for i, (key, sl) in enumerate(hot.items())}
    for j, (k, ts) in enumerate(zip(keys, times)):
        got = numbered.get(hashable(k)) if k is not None else None
        if got is not None:
            i, hsl = got
            tasks[j] = {(s + g + i) % n for s in hsl.reads(ts)} or None  # (late: task 0 checks)


def lowest(ds: int | set[int] | None) -> int:
    """The lowest of an event's destinations (task 0 for an event no task matches): the task that reports it
    when it is late or a dead letter."""
    if ds is None:
        return 0
    return ds if type(ds) is int else min(ds, default=0)


def task_indices(dests: Tasks, n: int) -> tuple[list[list[int]], bool]:
    """For each matching task (and, last, for no task), the indices of the events that go to it, in order;
    and whether each event goes to exactly one task."""
    try:
        tasks = np.array(dests, dtype=np.int64)  # one task each (a keyed group): sorted by task, in C
    except (TypeError, ValueError):
        tasks = None
    if tasks is not None and tasks.ndim == 1:
        order = np.argsort(tasks, kind="stable").tolist()
        ends = np.cumsum(np.bincount(tasks, minlength=n)).tolist()
        return [order[a:b] for a, b in zip([0] + ends[:-1], ends)] + [[]], True
    out: list[list[int]] = [[] for _ in range(n + 1)]
    for i, ds in enumerate(dests):
        if type(ds) is int:
            out[ds].append(i)
        elif ds is None:
            out[n].append(i)
        else:
            for d in ds:
                out[d].append(i)
    return out, False


def taker(idx: Sequence[int]) -> Callable[[Sequence], tuple]:
    """A function picking the items at ``idx`` of a column (a tuple: orjson and pickle write it as a list)."""
    if len(idx) == 1:
        i = idx[0]
        return lambda col: (col[i],)
    return operator.itemgetter(*idx)
