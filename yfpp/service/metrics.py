"""``GET /metrics``: Prometheus text read from the service's live counts at scrape time (docs/service.md, "Metrics").

A collector (rather than metric objects updated on the hot path) keeps the
engine thread free of metric calls and drops a deleted subscription's series
with it.  Every ``_total`` counts since this process started, from 0 (a restart
is the counter reset Prometheus expects); what the engine state has counted
since it began, restored from its checkpoint, is a ``yfpp_state_*`` gauge.
:func:`render` takes seconds with thousands of subscriptions: the app calls it
on a thread of its own, never on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

if TYPE_CHECKING:
    from yfpp.service.server import Service

#: The counts kept per subscription and in total: (metric name, help, the Counters attribute of a Subscription
#: or of the Totals, the count in it).
COUNTS = (
    ("matches", "results produced", "counters", "matches"),
    ("delivered", "results written to the push sink", "counters", "delivered"),
    ("dropped", "results dropped by the push sink's full queue", "counters", "dropped"),
    ("sink_errors", "failures of the push sink (connect, lost connection, write, POST), each retry too",
     "counters", "sink_errors"),
    ("pulled", "results written to pull streams", "pull", "delivered"),
    ("pull_dropped", "results dropped by a pull stream's full queue", "pull", "dropped"),
)
LABELS = ["subscription", "name"]


class ServiceCollector:
    def __init__(self, service: "Service"):
        self.service = service

    def collect(self) -> Iterator[Metric]:
        s = self.service
        dl = s.dead_letters
        yield CounterMetricFamily("yfpp_events_in", "events given to the engine by this process", value=s.events_taken)
        yield GaugeMetricFamily("yfpp_state_events_in", "events the engine state has taken since it began "
                                "(restored from the checkpoint at start; /health events_in)", value=s.events_in)
        yield GaugeMetricFamily("yfpp_events_per_second", "events processed per second (last second)", value=s.rate)
        yield CounterMetricFamily("yfpp_dead_letters", "malformed, unreadable and late records reported by this process",
                                  value=dl.reported)
        yield GaugeMetricFamily("yfpp_state_dead_letters", "dead letters since the engine state began "
                                "(restored from the checkpoint at start; /health dead_letters)", value=dl.count)
        yield CounterMetricFamily("yfpp_dead_letters_lost", "dead letters counted but not written (output failing)",
                                  value=dl.lost)
        yield CounterMetricFamily("yfpp_checkpoint_errors", "checkpoints that failed", value=s.checkpoint_errors)
        yield GaugeMetricFamily("yfpp_engine_up", "1 while the engine thread runs, 0 once it has died",
                                value=0 if s.failed else 1)
        yield GaugeMetricFamily("yfpp_live_runs", "partial matches held by the engine", value=s.live_runs)
        yield GaugeMetricFamily("yfpp_inbox_depth", "batches of events (up to 256 each) waiting for the engine thread", value=s.inbox.qsize())
        subs = list(s.subs.values())
        yield GaugeMetricFamily("yfpp_subscriptions", "registered subscriptions", value=len(subs))
        for name, text, side, count in COUNTS:
            yield CounterMetricFamily(f"yfpp_{name}", f"{text}, all subscriptions (deleted ones too)",
                                      value=getattr(getattr(s.totals, side), count))
        yield GaugeMetricFamily("yfpp_queue_depth", "results waiting for push sinks, all subscriptions",
                                value=sum(sub.queued for sub in subs))
        if s.config.subscription_metrics:
            yield from _per_subscription(subs)


def _per_subscription(subs: list) -> Iterator[Metric]:
    """The families with a series per subscription (labels ``subscription``, ``name``)."""
    for name, text, side, count in COUNTS:
        family = CounterMetricFamily(f"yfpp_subscription_{name}", text, labels=LABELS)
        for sub in subs:
            family.add_metric([sub.id, sub.name], getattr(getattr(sub, side), count))
        yield family
    depth = GaugeMetricFamily("yfpp_subscription_queue_depth", "results waiting for the push sink", labels=LABELS)
    for sub in subs:
        depth.add_metric([sub.id, sub.name], sub.queued)
    yield depth
    runs = GaugeMetricFamily("yfpp_subscription_runs", "live runs of its shared-NFA branch (last sample)", labels=LABELS)
    cpu = CounterMetricFamily("yfpp_subscription_cpu_seconds", "engine CPU attributed to it, by its share of the "
                              "live runs (an estimate)", labels=LABELS)
    shed = CounterMetricFamily("yfpp_subscription_runs_shed", "runs the engine's caps shed against its query "
                               "(last sample)", labels=LABELS)
    buffered = GaugeMetricFamily("yfpp_subscription_buffered_events", "events its shared-NFA branch holds for its "
                                 "runs (last sample)", labels=LABELS)
    for sub in subs:
        use = sub.usage.of(sub.name) if sub.usage else {"runs": 0, "cpu_s": 0.0}
        runs.add_metric([sub.id, sub.name], use["runs"])
        cpu.add_metric([sub.id, sub.name], use["cpu_s"])
        shed.add_metric([sub.id, sub.name], use.get("runs_shed", 0))
        buffered.add_metric([sub.id, sub.name], use.get("buffered", 0))
    yield runs
    yield cpu
    yield shed
    yield buffered
    latency = HistogramMetricFamily("yfpp_subscription_latency_seconds", "from the arrival of a result's event "
                                    "to the result's delivery (push sink or pull stream)", labels=LABELS)
    for sub in subs:
        latency.add_metric([sub.id, sub.name], sub.latency.cumulative(), sub.latency.sum)
    yield latency


def registry_for(service: "Service") -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ServiceCollector(service))  # type: ignore[arg-type]
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
