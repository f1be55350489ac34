"""What a checkpoint must look like before restore reads it (docs/operations.md, "What restore checks").

:func:`check_shape` checks the JSON types of every field of a checkpoint
(version 1, 2 or 3), that its references to the ``events`` and ``entries``
tables are in range, and the relations between fields that the runtime
relies on without checking them per event (stream positions and seqs below
the stream's counters, predecessor entries earlier in the stream, distinct
deadline orders…).  What depends on the registered queries (nodes, slots,
bindings) is checked by ``yfpp.state.plans`` once they are compiled.
A failure is a :class:`YfppError` ``corrupt checkpoint: <where>: expected …,
found …``.
"""

from __future__ import annotations

from typing import Any, Callable

from yfpp.errors import YfppError

Spec = Callable[[Any, dict], None]  #: checks one JSON value (``sizes``: the tables' lengths), raises _Bad


class _Bad(Exception):
    """A value that does not fit; the containers on the way up add where it is."""

    def __init__(self, want: str, found: Any) -> None:
        self.want, self.found, self.path = want, found, []


def corrupt(where: str, what: str) -> YfppError:
    return YfppError(f"corrupt checkpoint: {where}: {what}")


def _show(v: Any) -> str:
    if isinstance(v, (dict, list)):
        return f"{type(v).__name__.replace('dict', 'an object').replace('list', 'a list')} {str(v)[:40]}"
    return f"{v!r:.60}"


# --- specs --------------------------------------------------------------------------


def integer(lo: int = 0) -> Spec:
    def check(v: Any, sizes: dict) -> None:
        if type(v) is not int or not lo <= v < 1 << 63:
            raise _Bad(f"an integer >= {lo}", v)
    return check


def _number(v: Any, sizes: dict) -> None:
    """A JSON number a float holds (±inf as Python writes and reads it, never NaN)."""
    if not (type(v) is float and v == v or type(v) is int and -1e308 < v < 1e308):
        raise _Bad("a number", v)


def _float(v: Any, sizes: dict) -> None:
    """A number, or ±inf as ``_num`` writes it: ``{"$float": "inf"}``."""
    if not (isinstance(v, dict) and v.keys() == {"$float"} and v["$float"] in ("inf", "-inf")):
        _number(v, sizes)


def _string(v: Any, sizes: dict) -> None:
    if type(v) is not str or not v:
        raise _Bad("a non-empty string", v)


def _text(v: Any, sizes: dict) -> None:
    if type(v) is not str:
        raise _Bad("a string", v)


def _boolean(v: Any, sizes: dict) -> None:
    if type(v) is not bool:
        raise _Bad("true or false", v)


def _anything(v: Any, sizes: dict) -> None:
    pass


def const(value: str) -> Spec:
    def check(v: Any, sizes: dict) -> None:
        if v != value:
            raise _Bad(repr(value), v)
    return check


def either(*specs: Spec) -> Spec:
    def check(v: Any, sizes: dict) -> None:
        for spec in specs[:-1]:
            try:
                return spec(v, sizes)
            except _Bad:
                pass
        specs[-1](v, sizes)
    return check


def optional(spec: Spec) -> Spec:
    """``spec`` or null."""
    def check(v: Any, sizes: dict) -> None:
        if v is not None:
            spec(v, sizes)
    return check


def ref(table: str) -> Spec:
    """An index into the checkpoint's ``table`` (``events``, ``entries``)."""
    def check(v: Any, sizes: dict) -> None:
        if type(v) is not int or not 0 <= v < sizes[table]:
            raise _Bad(f"an index into {table} (0 to {sizes[table] - 1})", v)
    return check


def list_of(item: Spec, min_len: int = 0) -> Spec:
    def check(v: Any, sizes: dict) -> None:
        if type(v) is not list or len(v) < min_len:
            raise _Bad("a list" if not min_len else f"a list of at least {min_len}", v)
        i = 0
        try:
            for i, x in enumerate(v):
                item(x, sizes)
        except _Bad as e:
            e.path.append(f"[{i}]")
            raise
    return check


def row(*items: Spec) -> Spec:
    """A list of ``len(items)`` values, each of its own spec."""
    def check(v: Any, sizes: dict) -> None:
        if type(v) is not list or len(v) != len(items):
            raise _Bad(f"a list of {len(items)}", v)
        i = 0
        try:
            for i, (x, spec) in enumerate(zip(v, items)):
                spec(x, sizes)
        except _Bad as e:
            e.path.append(f"[{i}]")
            raise
    return check


def record(fields: dict[str, Spec], optional_fields: dict[str, Spec] | None = None) -> Spec:
    """An object with ``fields`` (and, if present, ``optional_fields``); other keys are left alone."""
    later = optional_fields or {}

    def check(v: Any, sizes: dict) -> None:
        if type(v) is not dict:
            raise _Bad("an object", v)
        key = ""
        try:
            for key, spec in fields.items():
                if key not in v:
                    raise _Bad(f"a field {key!r}", v)
                spec(v[key], sizes)
            for key, spec in later.items():
                if key in v:
                    spec(v[key], sizes)
        except _Bad as e:
            if e.want != f"a field {key!r}":
                e.path.append(f".{key}")
            raise
    return check


def mapping(value: Spec) -> Spec:
    """An object of any keys, each value of ``value``'s spec."""
    def check(v: Any, sizes: dict) -> None:
        if type(v) is not dict:
            raise _Bad("an object", v)
        key = ""
        try:
            for key, x in v.items():
                value(x, sizes)
        except _Bad as e:
            e.path.append(f".{key}")
            raise
    return check


def _value(v: Any, sizes: dict) -> None:
    """A vec slot, key or aggregate (``_Writer.value``): a JSON scalar or one of the ``$`` objects."""
    if v is None or type(v) in (bool, int, str) or (type(v) is float and v == v):
        return
    if not (isinstance(v, dict) and len(v) == 1):
        raise _Bad("a value (a JSON scalar or a $-object)", v)
    (tag, x), = v.items()
    spec = _TAGGED.get(tag)
    if spec is None:
        raise _Bad("a value (a JSON scalar or a $-object)", v)
    try:
        spec(x, sizes)
    except _Bad as e:
        e.path.append(f".{tag}")
        raise


INT, NUM, FLOAT, STR, BOOL, ANY, VALUE = integer(), _number, _float, _string, _boolean, _anything, _value
EVENT, ENTRY = ref("events"), ref("entries")
NAME = either(STR, INT)  #: a query's name: its own, or its id
SEQ = either(INT, STR)  #: an input event's seq, or a derived event's (its match's id)
NODE = row(INT, INT)  #: [query id, component index], resolved against the queries later
_TAGGED: dict[str, Spec] = {
    "$float": either(const("inf"), const("-inf"), const("nan")),
    "$missing": const(True),
    "$tuple": list_of(VALUE),
    "$event": EVENT,
    "$kleene": row(EVENT, EVENT, integer(1), VALUE, optional(list_of(EVENT, 1))),
}

BINDING = list_of(list_of(EVENT, 1), 1)  #: per variable, its events
CONTIGUITY = either(*(const(c) for c in ("strict", "partition", "skip_till_next", "skip_till_any")))
RUN = record({
    "state": either(row(NODE, const("in")), row(NODE, const("wait"), CONTIGUITY, optional(NODE))),
    "vec": list_of(VALUE, 2), "entry": optional(ENTRY), "version": list_of(INT, 1), "first_ts": NUM,
    "first_pos": INT, "key": VALUE, "born": INT, "tick": INT, "ptick": INT, "blocked": list_of(NODE),
})
MATCH = record(
    {"query": NAME, "id": STR, "bindings": mapping(list_of(SEQ)), "start": NUM, "end": NUM},
    {"emit": record({"type": STR, "attrs": mapping(ANY)})},
)
EVENT_RECORD = record(
    {"type": STR, "ts": NUM, "attrs": mapping(ANY), "seq": SEQ, "pos": integer(-1)},
    {"from": record({"query": NAME, "events": list_of(SEQ), "depth": integer(1)}), "xml": STR},
)
SET_STATE = {  # by strategy: what set_checkpoint.save writes
    "direct": record({
        "counters": mapping(INT), "reported": BOOL, "tick": INT, "next_order": INT, "size": INT,
        "held": optional(list_of(row(INT, list_of(BINDING, 1)))),
        "buffers": list_of(row(VALUE, list_of(row(EVENT, INT)))), "events_seen": INT,
        "cuts": list_of(row(VALUE, row(INT, NUM))),
        "pending": list_of(row(INT, BINDING, VALUE, INT, NUM, BOOL)),
    }),
    "match-window": record({
        "counters": mapping(INT), "reported": BOOL, "tick": INT, "next_order": INT, "size": INT,
        "held": optional(list_of(row(INT, list_of(BINDING, 1)))),
        "windows": list_of(row(VALUE, list_of(INT), INT, list_of(INT), INT,
                               list_of(row(EVENT, INT, list_of(row(INT, INT)))))),
        "deadlines": list_of(row(NUM, INT, VALUE)),
    }),
}


def _set_state(v: Any, sizes: dict) -> None:
    SET_STATE["match-window" if isinstance(v, dict) and "windows" in v else "direct"](v, sizes)


_BIG = 1 << 63


def _index(v: Any) -> bool:
    """Does ``v`` pass ``INT``?"""
    return type(v) is int and 0 <= v < _BIG


def _one_loop(spec: Spec, fits: Callable[[Any], bool]) -> Spec:
    """``spec`` of a list (a million rows, in a checkpoint of a million subscriptions) whose items that ``fits``
    (each value of its item's spec) pass in one loop: at the first that does not, ``spec`` checks the list, for
    its error."""
    def check(v: Any, sizes: dict) -> None:
        if type(v) is not list or not all(map(fits, v)):
            spec(v, sizes)
    return check


_query_rows = _one_loop(  # version 3's queries: [id, name, shape, its constants or IR, since_tick]
    list_of(row(INT, optional(STR), optional(INT), ANY, optional(INT))),
    lambda q: (type(q) is list and len(q) == 5 and _index(q[0]) and (q[1] is None or type(q[1]) is str and q[1] != "")
               and (q[2] is None or _index(q[2])) and (q[4] is None or _index(q[4]))))
_branches = _one_loop(  # [node, cap_check, reported]
    list_of(row(NODE, INT, INT)),
    lambda b: (type(b) is list and len(b) == 3 and type(b[0]) is list and len(b[0]) == 2 and _index(b[0][0])
               and _index(b[0][1]) and _index(b[1]) and _index(b[2])))


CHECKPOINT = record(
    {
        "options": record({}, {
            "max_delay": NUM, "max_held": integer(1), "policy": optional(STR), "max_runs_per_query": integer(1),
            "max_buffer_per_query": integer(1), "strategy": STR, "merge_runs": BOOL, "full_events": BOOL,
            "max_feedback_depth": integer(1), "max_derived_per_event": integer(1),
        }),
        "queries": either(
            list_of(record({"id": INT, "name": optional(STR), "text": optional(STR), "pattern": ANY,
                            "since_tick": optional(INT)})),  # versions 1 and 2
            _query_rows,  # version 3, beside "shapes"
        ),
        "next_query_id": INT,
        "stream": record({"next_seq": INT, "watermark": row(FLOAT, FLOAT), "next_arrival": INT, "tick": INT, "now": FLOAT,
                          "next_sweep": INT}),
        "held": list_of(row(FLOAT, FLOAT, INT, EVENT)),
        "runs": list_of(RUN),
        "buffer": list_of(row(NODE, list_of(ENTRY))),
        "negations": list_of(row(NODE, VALUE, list_of(INT), list_of(EVENT))),
        "pending": list_of(record({"query": INT, "key": VALUE, "vec": list_of(VALUE, 1), "last_pos": INT,
                                   "deadline": FLOAT, "order": INT, "match": MATCH},
                                  {"depth": INT, "rank": row(INT, list_of(INT, 1), list_of(list_of(INT)))})),
        "partition_ticks": list_of(row(list_of(STR, 1), list_of(row(VALUE, INT)))),
        "branches": _branches,
        "versions": record({"next_root": INT, "next_branch": integer(1), "next_order": INT}),
        "counters": record(
            {"events": INT, "runs_started": INT, "runs_created": INT, "runs_touched": INT, "peak_runs": INT,
             "peak_buffer": INT, "failed": INT, "matches": list_of(row(NAME, INT)),
             "shed_runs": list_of(row(NAME, INT))},
            {"derived": INT, "derived_dropped": INT, "released_early": INT},
        ),
        "dead_letters": record({"count": INT, "by_reason": mapping(INT)}),
        "events": list_of(EVENT_RECORD),
        "entries": list_of(record({"event": EVENT, "unit": INT, "preds": list_of(row(list_of(INT, 1), optional(ENTRY)))})),
    },
    {"set_queries": list_of(row(INT, _set_state)),
     "shapes": list_of(row(list_of(_text, 1), STR, BOOL))},  # version 3: [text around the constants, policy, feedback]
)


# --- checking -----------------------------------------------------------------------


def check_shape(data: dict) -> None:
    """Raise ``corrupt checkpoint: …`` unless ``data`` has a checkpoint's shape and consistent counters."""
    sizes = {"events": len(data.get("events", ())), "entries": len(data.get("entries", ()))}
    try:
        CHECKPOINT(data, sizes)
    except _Bad as e:
        where = "".join(reversed(e.path)).lstrip(".") or "the checkpoint"
        raise corrupt(where, f"expected {e.want}, found {_show(e.found)}") from None
    _check_relations(data)


def _check_relations(data: dict) -> None:
    """What the runtime takes for granted between fields: orders, positions, counters past what was given."""
    stream, events = data["stream"], data["events"]
    ids = [q[0] if isinstance(q, list) else q["id"] for q in data["queries"]]
    if data["version"] >= 3:
        if "shapes" not in data or any(not isinstance(q, list) for q in data["queries"]):
            raise corrupt("queries", "version 3 keeps queries as rows beside their shapes")
        shapes = len(data["shapes"])
        if any(q[2] is not None and not (type(q[2]) is int and 0 <= q[2] < shapes and isinstance(q[3], list)
                                         and all(isinstance(c, str) for c in q[3])) for q in data["queries"]):
            raise corrupt("queries", "a query's shape must be one of shapes, its constants strings")
    if ids != sorted(set(ids)) or any(i >= data["next_query_id"] for i in ids):
        raise corrupt("queries", "ids must increase and be below next_query_id")
    for i, ev in enumerate(events):
        if ev["pos"] > stream["tick"] or (type(ev["seq"]) is int and ev["seq"] >= stream["next_seq"]):
            raise corrupt(f"events[{i}]", "pos and seq must be below the stream's tick and next_seq")
    for i, rec in enumerate(data["entries"]):
        pos = events[rec["event"]]["pos"]
        if any(p is not None and events[data["entries"][p]["event"]]["pos"] >= pos for _, p in rec["preds"]):
            raise corrupt(f"entries[{i}]", "a predecessor entry must hold an earlier event")
    for i, (ts, sk, _, ev) in enumerate(data["held"]):
        if ts != events[ev]["ts"]:
            raise corrupt(f"held[{i}]", "ts differs from its event's")
    arrivals = [h[2] for h in data["held"]]  # (ties in the reorder buffer's heap go by arrival)
    if len(set(arrivals)) != len(arrivals) or any(a >= stream["next_arrival"] for a in arrivals):
        raise corrupt("held", "arrivals must be distinct and below next_arrival")
    for i, (_, _, positions, evs) in enumerate(data["negations"]):
        if len(positions) != len(evs) or positions != sorted(positions):
            raise corrupt(f"negations[{i}]", "positions must be ascending, one per event")
    versions = data["versions"]
    labels = [r["version"] for r in data["runs"]] + [v for rec in data["entries"] for v, _ in rec["preds"]]
    if any(v[0] >= versions["next_root"] or any(b >= versions["next_branch"] for b in v[1:]) for v in labels):
        raise corrupt("versions", "next_root and next_branch must be above every run's version")
    _distinct("pending", [p["order"] for p in data["pending"]], versions["next_order"])
    qids = [qid for qid, _ in data.get("set_queries", ())]
    if len(set(qids)) != len(qids):
        raise corrupt("set_queries", "a query's state is there twice")
    for qid, state in data.get("set_queries", ()):
        orders = [p[0] for p in state.get("pending", ())] + [d[1] for d in state.get("deadlines", ())]
        _distinct(f"set query {qid}", orders, state["next_order"])


def _distinct(where: str, orders: list[int], nxt: int) -> None:
    """Deadline orders break ties in a heap: they must differ, and the next one must be new."""
    if len(set(orders)) != len(orders) or any(o >= nxt for o in orders):
        raise corrupt(where, "deadline orders must be distinct and below the next order")
