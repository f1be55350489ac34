"""``GET /metrics``: Prometheus text read from the service's live counters at scrape time.

A collector (rather than metric objects updated on the hot path) keeps the
engine thread free of metric calls and drops a deleted subscription's series
with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from yfpp.service.server import Service


class ServiceCollector:
    def __init__(self, service: "Service"):
        self.service = service

    def collect(self) -> Iterator[Metric]:
        s = self.service
        yield CounterMetricFamily("yfpp_events_in", "events read from all feeds", value=s.events_in)
        yield GaugeMetricFamily("yfpp_events_per_second", "events processed per second (last second)", value=s.rate)
        yield CounterMetricFamily("yfpp_dead_letters", "malformed, unreadable and late records", value=s.dead_letters.count)
        yield CounterMetricFamily("yfpp_dead_letters_lost", "dead letters counted but not written (output failing)",
                                  value=s.dead_letters.lost)
        yield CounterMetricFamily("yfpp_checkpoint_errors", "checkpoints that failed", value=s.checkpoint_errors)
        yield GaugeMetricFamily("yfpp_engine_up", "1 while the engine thread runs, 0 once it has died",
                                value=0 if s.failed else 1)
        yield GaugeMetricFamily("yfpp_live_runs", "partial matches held by the engine", value=s.engine.stats.live_runs)
        yield GaugeMetricFamily("yfpp_inbox_depth", "batches of events (up to 256 each) waiting for the engine thread", value=s.inbox.qsize())
        yield GaugeMetricFamily("yfpp_subscriptions", "registered subscriptions", value=len(s.subs))
        families = {
            "matches": CounterMetricFamily("yfpp_subscription_matches", "results produced", labels=["subscription", "name"]),
            "delivered": CounterMetricFamily("yfpp_subscription_delivered", "results written to a destination",
                                             labels=["subscription", "name"]),
            "dropped": CounterMetricFamily("yfpp_subscription_dropped", "results dropped by a full queue",
                                           labels=["subscription", "name"]),
        }
        depth = GaugeMetricFamily("yfpp_subscription_queue_depth", "results queued for destinations",
                                  labels=["subscription", "name"])
        for sub in list(s.subs.values()):
            labels = [sub.id, sub.name]
            for key, fam in families.items():
                fam.add_metric(labels, getattr(sub.counters, key))
            depth.add_metric(labels, sub.queued)
        yield from families.values()
        yield depth


def registry_for(service: "Service") -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ServiceCollector(service))  # type: ignore[arg-type]
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
