"""A subscription: its request (validated by pydantic), its engine query and its destinations."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field, field_validator

from yfpp.service.accounting import Usage
from yfpp.service.auth import ADMIN
from yfpp.service.child_delivery import COUNTED
from yfpp.service.latency import Latency
from yfpp.service.sink_policy import SinkPolicy, shown
from yfpp.service.sink_urls import check_sink, sink_for
from yfpp.service.sinks import Counters, Outbox, PushSink, as_sse_event

_NAME = re.compile(r"[A-Za-z_][\w.\-]*\Z")
SUBSCRIPTION_ID = re.compile(r"s[0-9]+")  #: the ids the registry gives (Registry.add), the names of unnamed subscriptions


class SubscriptionSpec(BaseModel):
    """``POST /subscriptions`` body; also what the registry stores."""

    model_config = {"extra": "forbid"}

    query: str = Field(min_length=1, description="SASE+ or extended-XPath query text")
    name: str | None = Field(None, max_length=200, description="query name in results (default: the id); unique")
    language: Literal["sase", "xpath"] | None = Field(None, description="default: detected from the text")
    sink: str | None = Field(None, description="tcp://HOST:PORT, http(s)://URL (webhook), mqtt(s)://HOST:PORT/TOPIC "
                                               "(the topic may name {query} or a RETURN attribute) or file:PATH; "
                                               "none: results only on GET /subscriptions/{id}/matches")
    format: Literal["json", "xml"] = Field("json", description="one JSON line or one XML element per result")
    policy: Literal["all", "non_overlapping"] | None = Field(None, description="output policy (default: the query's)")
    queue: int | None = Field(None, ge=1, le=1_000_000, description="results queued per destination (default: the server's)")
    queue_bytes: int | None = Field(None, ge=1, description="bytes (as JSON lines) queued per destination at most "
                                                            "(default: the server's queue_bytes)")
    overflow: Literal["drop_oldest", "drop_newest"] = Field("drop_oldest", description="what a full queue drops")

    @field_validator("query", "name", "sink")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        if v is not None and not v.isascii():
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"holds a lone surrogate at character {e.start}: not Unicode text") from None
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.match(v):
            raise ValueError("name must start with a letter or '_' and hold only letters, digits, '_', '.', '-'")
        if v is not None and SUBSCRIPTION_ID.fullmatch(v):
            raise ValueError(f"{v!r} has the form of a subscription id: s1, s2, … name the unnamed subscriptions")
        return v

    @field_validator("sink")
    @classmethod
    def _sink(cls, v: str | None) -> str | None:
        return None if v is None or v in ("", "pull") else check_sink(v)


#: the counts a checkpoint keeps: (name, the Counters attribute of a Subscription or of the Totals, the count in it)
COUNTS = (("matches", "counters", "matches"), ("delivered", "counters", "delivered"), ("dropped", "counters", "dropped"),
          ("sink_errors", "counters", "sink_errors"), ("pulled", "pull", "delivered"), ("pull_dropped", "pull", "dropped"))


class _Counted:
    """The counts of :data:`COUNTS` as a dict, and set back from one (a restored checkpoint's)."""

    counters: Counters
    pull: Counters

    def counts(self) -> dict[str, int]:
        return {name: getattr(getattr(self, side), count) for name, side, count in COUNTS}

    def restore_counts(self, counts: dict[str, int]) -> None:
        """Set the counts (not adding them to the totals: those are restored on their own)."""
        for name, side, count in COUNTS:
            if type(counts.get(name)) is int:
                setattr(getattr(self, side), count, counts[name])


@dataclasses.dataclass
class Totals(_Counted):
    """The service's counts over every subscription it has held since its state began, as a subscription keeps
    them: ``counters`` (matches, and the push sinks' counts), ``pull`` (the pull streams')."""

    counters: Counters = dataclasses.field(default_factory=Counters)
    pull: Counters = dataclasses.field(default_factory=Counters)


class Subscription(_Counted):
    """One registered subscription: engine query id, owner (a key id), counters, push destination and pull
    listeners."""

    def __init__(self, sid: str, spec: SubscriptionSpec, qid: int, queue_size: int, totals: Totals | None = None,
                 owner: str = ADMIN, policy: SinkPolicy | None = None, queue_bytes: int | None = None):
        self.id = sid
        self.spec = spec
        self.qid = qid
        self.owner = owner
        self.policy = policy
        self.name = spec.name or sid
        self.cost: dict[str, Any] | None = None  #: the plan's cost estimate (quotas.estimate), once registered here
        self.usage: Usage | None = None  #: the service's samples of each query's runs and CPU
        self.suspended: str | None = None  #: why the service suspended it (over max_cpu_share), if it did
        totals = totals if totals is not None else Totals()
        self.counters = Counters(totals.counters)  #: matches, and the push sink's counts
        self.pull = Counters(totals.pull)  #: the pull streams' delivered and dropped
        self.latency = Latency()  #: from each result's event's arrival to the result's delivery (push or pull)
        self.queue_size = spec.queue or queue_size
        self.queue_bytes = spec.queue_bytes or queue_bytes  #: each destination's queue in bytes at most (None: no cap)
        self.outbox: Outbox | None = None
        self.sink: PushSink | None = None
        self.listeners: set[Outbox] = set()
        #: (its query isolated, delivering itself) told whether pull-stream readers listen, as that changes
        self.on_listeners: Callable[[bool], None] | None = None
        self.elsewhere: dict[int, dict[str, Any]] = {}  #: the counts each isolation engine reported last, by pid

    def start(self) -> None:
        """Start delivering to the push destination (on the running loop)."""
        if self.spec.sink is not None:
            self.outbox = Outbox(self.queue_size, self.spec.overflow, self.counters, self.latency, self.queue_bytes)
            self.sink = sink_for(self.spec.sink, self.spec.format, self.policy)
            self.sink.start(self.outbox)

    async def stop(self) -> None:
        if self.sink is not None:
            await self.sink.stop()
            self.sink = None

    async def change(self, spec: "SubscriptionSpec", qid: int, queue_size: int, queue_bytes: int | None = None) -> None:
        """Take ``spec`` (and the engine query ``qid``) in place, keeping the id, the counters, the pull streams
        and what the push sink still held (queued again, to the new sink if it changed)."""
        held = self.outbox.held() if self.outbox is not None else []
        unsent = len(self.outbox.unsent()) if self.outbox is not None else 0
        await self.stop()
        self.counters.add("delivered", -unsent)  # (counted delivered, maybe not: sent again)
        self.spec, self.qid, self.name = spec, qid, spec.name or self.id
        self.queue_size = spec.queue or queue_size
        self.queue_bytes = spec.queue_bytes or queue_bytes
        self.outbox = None
        self.start()
        self.take_back(held)  # (no push sink any more: what it held is dropped)

    def deliver(self, result: dict, arrived: float | None = None) -> None:
        """A result from the engine, whose event arrived at ``arrived`` (``time.monotonic()``; default: now):
        count it and queue it for every destination.

        With no push sink, ``delivered`` counts the results given to pull streams and ``dropped`` those made
        while none listened (so ``matches - delivered - dropped = queued`` holds for every subscription)."""
        self.counters.add("matches")
        if self.outbox is not None:
            self.outbox.offer(result, arrived)
        elif self.listeners:
            self.counters.add("delivered")
        else:
            self.counters.add("dropped")
        if self.listeners:
            self._to_streams(result, arrived)

    def discard(self, n: int) -> bool:
        """``n`` results made: counted as :meth:`deliver` counts them with no destination (``matches`` and
        ``dropped``) if it has none (True), else not counted (False: :meth:`deliver` them)."""
        if self.outbox is not None or self.listeners:
            return False
        self.counters.add("matches", n)
        self.counters.add("dropped", n)
        return True

    def tally(self, counts: dict[str, Any]) -> None:
        """Counts of an isolation engine delivering its results itself (``child_delivery``: cumulative since
        the child began, with its ``pid`` and, but for those a dead child left, the latencies since its last
        report): what they add to that child's last ones, added."""
        last = self.elsewhere.get(counts["pid"], {})
        for count in COUNTED:
            self.counters.add(count, counts[count] - last.get(count, 0))
        if counts["last_error_at"] is not None and counts["last_error_at"] != last.get("last_error_at"):
            self.counters.last_error, self.counters.last_error_at = counts["last_error"], counts["last_error_at"]
        if "latency" in counts:  # (not in those a child that died left)
            self.latency.merge(*counts["latency"])
        self.elsewhere[counts["pid"]] = counts

    def take_back(self, results: list[dict]) -> None:
        """What an isolation engine's sink held at its stop (counted as matches there): queued for the push sink
        here, or dropped (counted) with none."""
        self.counters.touch()
        for result in results:
            if self.outbox is not None:
                self.outbox.offer(result)
            else:
                self.counters.add("dropped")

    def to_listeners(self, results: list[dict], arrived: float | None) -> None:
        """Results counted by its isolation engine, which delivers them itself: to the pull streams."""
        if self.listeners:
            for result in results:
                self._to_streams(result, arrived)

    def _to_streams(self, result: dict, arrived: float | None) -> None:
        """``result`` to every pull stream, encoded once for all of them."""
        event, size = as_sse_event(result)
        for listener in self.listeners:
            listener.offer(event, arrived, size)

    def unlisten(self, box: Outbox) -> None:
        """A pull-stream listener gone."""
        self.listeners.discard(box)
        if not self.listeners and self.on_listeners is not None:
            self.on_listeners(False)

    def requeue(self, result: dict) -> None:
        """A result kept by a checkpoint or at a stop, counted in the counts restored with it: queued again."""
        if self.outbox is not None:
            self.counters.touch()
            self.outbox.offer(result)

    def listen(self) -> Outbox:
        """A new pull-stream listener's own bounded outbox (its drops count in ``pull.dropped``)."""
        box = Outbox(self.queue_size, self.spec.overflow, self.pull, self.latency, self.queue_bytes)
        if not self.listeners and self.on_listeners is not None:
            self.on_listeners(True)
        self.listeners.add(box)
        return box

    @property
    def queued(self) -> int:
        """Results waiting for the push sink, or being sent."""
        here = len(self.outbox.items) + self.outbox.in_flight if self.outbox else 0
        return here + sum(counts["queued"] for counts in self.elsewhere.values())

    @property
    def pull_queued(self) -> int:
        """Results waiting for the pull streams, or being sent."""
        return sum(len(b.items) + b.in_flight for b in list(self.listeners))

    def info(self) -> dict[str, Any]:
        c = self.counters
        return {
            "id": self.id, "name": self.name, "query": self.spec.query, "language": self.spec.language,
            "owner": self.owner, "sink": shown(self.spec.sink), "format": self.spec.format, "policy": self.spec.policy,
            "queue": self.queue_size, "queue_bytes": self.queue_bytes, "overflow": self.spec.overflow, "cost": self.cost,
            "usage": self.usage.of(self.name) if self.usage else None, "latency": self.latency.info(),
            "suspended": self.suspended,
            "counters": {"matches": c.matches, "delivered": c.delivered, "dropped": c.dropped,
                         "queued": self.queued, "sink_errors": c.sink_errors, "last_error": c.last_error,
                         "last_error_at": c.last_error_at, "listeners": len(self.listeners),
                         "pulled": self.pull.delivered, "pull_dropped": self.pull.dropped,
                         "pull_queued": self.pull_queued},
        }
