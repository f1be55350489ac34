"""What ``yfpp run`` tells about a run: ``--stats`` (text or JSON) and the progress line."""

from __future__ import annotations

import json
import time
from typing import IO, Any, Callable, TextIO

from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine


def run_figures(engine: Engine, events: int, elapsed: float, dead: DeadLetters) -> dict[str, Any]:
    """The ``--stats`` figures as a JSON-safe dict (the same keys in ``--stats-json``)."""
    c = engine.stats
    plans = [*engine.queries.values(), *(m.plan for m in engine.set_queries.values())]
    return {
        "events": events,
        "elapsed_s": round(elapsed, 6),
        "events_per_s": round(events / max(elapsed, 1e-9), 1),
        "runs_started": c.runs_started,
        "runs_created": c.runs_created,
        "runs_touched_per_event": round(c.runs_touched / max(events, 1), 4),
        "peak_runs": c.peak_runs,
        "peak_buffer": c.peak_buffer,
        "dead_letters": dead.count,
        "dead_letters_by_reason": dict(dead.by_reason),
        "failed_events": c.failed,
        "runs_shed": {str(p.name): c.shed_runs.get(p.name, 0) for p in plans},
        "derived_events": engine.feedback.derived,
        "derived_dropped": engine.feedback.dropped,
        "matches": {str(p.name): c.matches.get(p.name, 0) for p in plans},
        "event_sets": {str(m.plan.name): {"strategy": engine.strategy, **m.stats()} for m in engine.set_queries.values()},
    }


def format_figures(f: dict[str, Any]) -> str:
    """The figures of :func:`run_figures` as the ``--stats`` text block."""
    dead = f"{f['dead_letters']:,}" + (f"  ({f['dead_letters_by_reason']})" if f["dead_letters"] else "")
    lines = [
        f"events            {f['events']:,}",
        f"elapsed           {f['elapsed_s']:.3f} s",
        f"events/s          {f['events_per_s']:,.0f}",
        f"runs started      {f['runs_started']:,}",
        f"run objects made  {f['runs_created']:,}  (starts, splits, Kleene takes)",
        f"runs touched/ev   {f['runs_touched_per_event']:.2f}",
        f"peak runs         {f['peak_runs']:,}",
        f"peak buffer       {f['peak_buffer']:,} entries",
        f"dead letters      {dead}",
        f"failed events     {f['failed_events']:,}  (rolled back, in the dead letters)",
        f"runs shed         {sum(f['runs_shed'].values()):,}  (over a per-query cap)",
        *([f"derived events    {f['derived_events']:,}  ({f['derived_dropped']:,} dropped by the loop guards)"]
          if f["derived_events"] or f["derived_dropped"] else []),
        "matches per query:",
        *(f"  {name:<24} {n:,}" + (f"  ({f['runs_shed'][name]:,} runs shed)" if f["runs_shed"].get(name) else "")
          + (f"  (event sets, {_details(f['event_sets'][name])})" if name in f["event_sets"] else "")
          for name, n in f["matches"].items()),
    ]
    return "\n".join(lines) + "\n"


def _details(sets: dict[str, Any]) -> str:
    """``match-window: windows 13, candidates 3, …`` for one event-set query."""
    rest = ", ".join(f"{k} {v:,}" for k, v in sets.items() if k != "strategy")
    return f"{sets['strategy']}: {rest}"


def write_figures_json(f: dict[str, Any], out: IO[str]) -> None:
    json.dump(f, out, indent=2)
    out.write("\n")


class Progress:
    """A one-line progress display: events, rate, live runs, matches — and, when the input's
    size is known (``position()`` gives bytes read of ``total`` bytes), percentage and ETA."""

    def __init__(self, stream: TextIO, every: float = 0.5, total: int | None = None,
                 position: Callable[[], int] | None = None):
        self.stream = stream
        self.every = every
        self.total = total if total and position is not None else None
        self.position = position
        self.start = self.last = time.perf_counter()

    def update(self, n: int, engine: Engine, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last < self.every:
            return
        self.last = now
        c = engine.stats
        elapsed = max(now - self.start, 1e-9)
        line = f"\r{n:,} events  {n / elapsed:,.0f} ev/s  {c.live_runs:,} runs  {sum(c.matches.values()):,} matches"
        if self.total is not None and self.position is not None:
            line += "  " + percent_eta(self.position(), self.total, elapsed)
        self.stream.write(line + " ")
        self.stream.flush()

    def done(self, n: int, engine: Engine) -> None:
        self.update(n, engine, force=True)
        self.stream.write("\n")


def percent_eta(done: int, total: int, elapsed: float) -> str:
    """``"42%  ETA 0:13"`` for ``done`` of ``total`` bytes after ``elapsed`` seconds."""
    frac = min(max(done / total, 0.0), 1.0)
    if frac <= 0:
        return "0%  ETA ?"
    left = int(elapsed * (1 - frac) / frac + 0.5)
    h, m, sec = left // 3600, left % 3600 // 60, left % 60
    return f"{frac:.0%}  ETA " + (f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}")
