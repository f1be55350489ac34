"""What one key may hold (docs/service.md, "Security"): the server caps what a client asks.

Checked when a subscription is made: the ``queue`` it asks is at most the
server's ``max_queue`` (``queue_bytes``: ``max_queue_bytes``); a subscriber key
holds at most ``key_max_subscriptions`` subscriptions, ``key_max_queue`` queued
results and ``key_max_queue_bytes`` queued bytes over all of them; and with
``max_query_degree`` set, a subscriber's query whose estimated cost grows faster
than that power of the events is refused. The admin is held to ``max_queue``
only. Once a second, after the usage sample, a key over ``key_max_runs``,
``key_max_buffered`` or ``key_max_cpu_share`` gives up its costliest subscription
(:func:`over_keys`), counting its queries in the main engine, the worker engines
and the isolation engines alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

from yfpp.language.pattern import Contiguity, Kind, Pattern
from yfpp.service.auth import ADMIN
from yfpp.service.isolation import FEEDBACK_STAYS

if TYPE_CHECKING:
    from yfpp.service.accounting import Usage
    from yfpp.service.config import ServiceConfig
    from yfpp.service.subscriptions import Subscription, SubscriptionSpec


def estimate(plan: Any) -> dict[str, Any]:
    """A query plan's cost estimate: ``degree``, the power of the number of events its live runs and matches
    may grow with (each skip-till-any component after the first forks every run; a Kleene closure under
    skip-till-any forks without bound: None), its window and whether an equivalence key splits its runs."""
    if not isinstance(plan, Pattern):  # an event-set query: searched within its own budget
        return {"degree": 1, "window": None, "partitioned": False}
    degree: int | None = 1 + sum(c.contiguity is Contiguity.SKIP_TILL_ANY for c in plan.components[1:])
    if any(c.kind is not Kind.SINGLE and (c.inner_contiguity or c.contiguity) is Contiguity.SKIP_TILL_ANY
           for c in plan.components):
        degree = None
    return {"degree": degree, "window": plan.window, "partitioned": bool(plan.partition_by)}


def isolated(cost: dict[str, Any], config: "ServiceConfig") -> bool:
    """Whether a query of estimate ``cost`` runs in an isolation engine from the start (over ``isolate_degree``)."""
    most = config.isolate_degree
    return most is not None and (cost["degree"] is None or cost["degree"] > most)


class QuotaError(Exception):
    """A request over a quota or a server cap: ``status`` and the reason."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


def check(spec: "SubscriptionSpec", owner: str, owned: Iterable["Subscription"], config: "ServiceConfig") -> None:
    """QuotaError unless the key ``owner``, holding ``owned``, may add ``spec``."""
    if spec.queue is not None and spec.queue > config.max_queue:
        raise QuotaError(400, f"queue {spec.queue} is over the server's max_queue ({config.max_queue})")
    if spec.queue_bytes is not None and spec.queue_bytes > config.max_queue_bytes:
        raise QuotaError(400, f"queue_bytes {spec.queue_bytes} is over the server's max_queue_bytes "
                              f"({config.max_queue_bytes})")
    if owner == ADMIN:
        return
    owned = list(owned)
    if len(owned) >= config.key_max_subscriptions:
        raise QuotaError(429, f"quota: this key holds {len(owned)} subscriptions, its most "
                              f"(key_max_subscriptions={config.key_max_subscriptions})")
    queued = sum(s.queue_size for s in owned) + (spec.queue or config.queue_size)
    if queued > config.key_max_queue:
        raise QuotaError(429, f"quota: this key's subscriptions would queue up to {queued} results, over "
                              f"key_max_queue={config.key_max_queue}")
    queued_bytes = sum(s.queue_bytes for s in owned) + (spec.queue_bytes or config.queue_bytes)
    if queued_bytes > config.key_max_queue_bytes:
        raise QuotaError(429, f"quota: this key's subscriptions would queue up to {queued_bytes} bytes, over "
                              f"key_max_queue_bytes={config.key_max_queue_bytes}")


def over_keys(subs: Mapping[str, "Subscription"], usage: "Usage", config: "ServiceConfig") -> list[tuple[str, str]]:
    """``(query name, why)`` of the subscriptions to give up, after a usage sample: of ``subs`` (the service's, by
    id: copied here, as the loop changes them meanwhile; not at all without key quotas) each subscriber key over
    ``key_max_runs`` (its subscriptions' runs, in the main engine each branch's shared evenly among its queries,
    and in the worker and isolation engines), ``key_max_buffered`` (their buffered events, shared as the runs)
    or ``key_max_cpu_share`` (their fraction of the CPU of the engine thread and the other engines together),
    its costliest one by that measure (one a sample: the next sample says whether the key is still over). The
    service moves one in the main engine to an isolation engine if it can, and suspends it otherwise, or if it
    runs in one already."""
    most_runs, most_buffered, most_share = config.key_max_runs, config.key_max_buffered, config.key_max_cpu_share
    if most_runs is None and most_buffered is None and most_share is None:
        return []
    by_key: dict[str, list[tuple[float, float, float, str]]] = {}
    for sub in list(subs.values()):
        part = usage.parts.get(sub.name)
        if part is not None and sub.owner != ADMIN and sub.suspended is None:
            by_key.setdefault(sub.owner, []).append((*part, sub.name))
    out = []
    for mine in by_key.values():
        runs, share, buffered = (sum(p[i] for p in mine) for i in range(3))
        if most_runs is not None and runs > most_runs:
            name = max(mine, key=lambda p: p[0])[3]
            out.append((name, f"its key's subscriptions held {runs:,.0f} live runs, over key_max_runs={most_runs:,}"))
        elif most_buffered is not None and buffered > most_buffered:
            name = max(mine, key=lambda p: p[2])[3]
            out.append((name, f"its key's subscriptions held {buffered:,.0f} buffered events, over "
                              f"key_max_buffered={most_buffered:,}"))
        elif most_share is not None and share > most_share:
            name = max(mine, key=lambda p: p[1])[3]
            out.append((name, f"its key's subscriptions took {share:.0%} of the engine's time, over "
                              f"key_max_cpu_share={most_share:g}"))
    return out


def check_cost(cost: dict[str, Any], owner: str, config: "ServiceConfig") -> None:
    """QuotaError when a subscriber's query is estimated costlier than ``max_query_degree`` allows."""
    most = config.max_query_degree
    if owner == ADMIN or most is None or (cost["degree"] is not None and cost["degree"] <= most):
        return
    degree = "unbounded (a Kleene closure under skip-till-any)" if cost["degree"] is None else cost["degree"]
    raise QuotaError(403, f"query too costly: its runs may grow with the events to the power {degree}; this "
                          f"server admits at most {most} (fewer skip-till-any components, or a strict "
                          f"contiguity, make it cheaper)")


def check_isolable(plan: Any, cost: dict[str, Any], config: "ServiceConfig") -> None:
    """QuotaError for a feedback query over ``isolate_degree`` (anyone's): it would start in an isolation engine,
    where a feedback query cannot run (:data:`FEEDBACK_STAYS`)."""
    if isinstance(plan, Pattern) and plan.feedback and isolated(cost, config):
        degree = "unbounded" if cost["degree"] is None else cost["degree"]
        raise QuotaError(403, f"query too costly for the main engine: its runs may grow with the events to the "
                              f"power {degree}, over isolate_degree={config.isolate_degree}, and {FEEDBACK_STAYS}")
