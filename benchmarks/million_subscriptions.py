"""A million subscriptions in one engine: registration, memory and per-event cost against N.

Kinds of subscriptions (``j`` is the subscription's constant, 1..m):

* ``a-sase`` / ``a-xpath`` — one template whose constants vary (the RFID template of
  ``subscriptions_benchmark.py``: a shelf reading in zone ``Zj`` then an exit at door ``Dj``
  of the same tag within an hour);
* ``b`` — mixed, eight shapes taken in turn (SASE+ and XPath): equality with a middle
  negation, an ``and`` of an equality and a range in one XPath bracket, ``starts-with``,
  ``or``/value lists in both languages, a Kleene with a threshold, an interval
  ``lo <= level < hi`` with a trailing negation, a child-element equality; windows from
  seconds to hours;
* ``c`` — per-user alerts: ``r.device = 'Uj' AND r.celsius > t``.

One synthetic feed (shelf, register, exit, reading, alarm events, 1 s apart, seeded) is
made for each configuration: every constant value is drawn as ``r mod m + 1`` from the
same random draws ``r`` (m = the distinct constants of the configuration), so each event
finds about one subscription of a shape at every N.  The *one query* baseline of a kind is
its first subscription (of each shape, for ``b``) over the same feed drawn with m = 1: the
one query then matches every event that one of the N subscriptions would, the same
matching work.

Each configuration runs in a fresh subprocess (``--worker``), which builds the feed and the
query texts, warms the parsers up, then measures (CPU time throughout: the box is shared): registration one at a time (and through
``Engine.register_many`` in batches, when the engine has it, in another subprocess), the
resident-set growth per subscription (``/proc/self/statm`` after a collection, before and
after registering), the CPU time per event of one pass (``time.process_time``), and the
cost of unregistering a sample of 1,000 subscriptions.

    python benchmarks/million_subscriptions.py                        # 1k, 10k, 100k, every kind
    python benchmarks/million_subscriptions.py --sizes 1000 10000 --kinds a-sase c
    python benchmarks/million_subscriptions.py --million --kinds a-sase c   # adds 1M (needs memory)
    python benchmarks/million_subscriptions.py --plot                  # also benchmarks/million_subscriptions.png
    python benchmarks/million_subscriptions.py --forms --events 5000   # and-form vs brackets, intervals
    python benchmarks/million_subscriptions.py --atoms --events 3000   # a residual predicate many subscriptions share
    python benchmarks/million_subscriptions.py --churn c 10000         # subscribe/unsubscribe beside a feed
    python benchmarks/million_subscriptions.py --housekeeping b --sizes 1000 100000   # sweeps against N
    python benchmarks/million_subscriptions.py --state c --sizes 100000 --events 2000  # snapshot / restore
    python benchmarks/million_subscriptions.py --held b                # what a subscription of each shape holds
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from yfpp.engine import Engine  # noqa: E402
from yfpp.input.events import Event  # noqa: E402

HERE = Path(__file__).resolve().parent
KINDS = ("a-sase", "a-xpath", "b", "c")
SHAPES_B = (
    "PATTERN SEQ(shelf a, ~register b, exit c) WHERE skip_till_next_match(a, b, c) "
    "{{ [tag_id] AND a.zone = 'Z{j}' AND c.door = 'D{j}' }} WITHIN 2 hours",
    "[tag_id]&&//shelf[@zone='Z{j}' and @weight > 50]//exit&&(30 min)",
    "[device]&&//reading[starts-with(@sensor, 'S{j}-')]//alarm[@level = 3]&&(5 min)",
    "PATTERN SEQ(reading r, alarm x) WHERE skip_till_any_match(r, x) "
    "{{ [device] AND (r.device = 'U{j}' OR r.device = 'U{j2}') AND x.level > 2 }} WITHIN 10 minutes",
    "PATTERN SEQ(reading+ r[], alarm x) WHERE skip_till_next_match(r[], x) "
    "{{ [device] AND r[1].device = 'U{j}' AND r[1].celsius > 40 AND x.level = 3 }} WITHIN 30 seconds",
    "PATTERN SEQ(shelf a, exit c, ~register d) WHERE skip_till_next_match(a, c, d) "
    "{{ [tag_id] AND a.level >= {lo} AND a.level < {hi} }} WITHIN 10 minutes",
    "[tag_id]&&//shelf[zone='Z{j}']//!register//exit&&(1 hour)",
    "[device]&&//reading[@device='U{j}' or @device='U{j2}']//alarm[@level > 2]&&(5 seconds)",
)
TEMPLATES = {
    "a-sase": ("PATTERN SEQ(shelf a, exit c) WHERE skip_till_any_match(a, c) "
               "{{ [tag_id] AND a.zone = 'Z{j}' AND c.door = 'D{j}' }} WITHIN 1 hour",),
    "a-xpath": ("[tag_id]&&//shelf[@zone='Z{j}']//exit[@door='D{j}']&&(1 hour)",),
    "b": SHAPES_B,
    "c": ("PATTERN SEQ(reading r) WHERE r.device = 'U{j}' AND r.celsius > {t} WITHIN 1 minute",),
}


def distinct(kind: str, n: int) -> int:
    """How many distinct constants ``m`` the ``n`` subscriptions of ``kind`` use (per shape)."""
    return max(1, n // len(TEMPLATES[kind]))


def query(kind: str, k: int, m: int) -> str:
    """Subscription ``k`` (0-based) of ``kind`` when its constants range over 1..m."""
    shapes = TEMPLATES[kind]
    j = k // len(shapes) + 1
    j2 = (j + m // 2) % m + 1
    return shapes[k % len(shapes)].format(j=j, j2=j2, lo=10 * (j - 1), hi=10 * j, t=20 + (7 * j) % 30)


def feed(n_events: int, m: int, seed: int) -> list[Event]:
    """The feed with constants drawn over 1..m (the same draws for every m)."""
    rng = random.Random(seed)
    events = []
    homes: dict[int, int] = {}  # a tag's constant until it exits: its shelf zone and exit door agree
    for i in range(n_events):
        r, tag, dev = rng.randrange(1 << 30), rng.randrange(200), rng.randrange(1 << 30)
        x = rng.random()
        j, jd = homes.setdefault(tag, r) % m + 1, dev % m + 1
        if 0.4 <= x < 0.55:
            del homes[tag]
        if x < 0.3:
            ev = Event("shelf", float(i), {"tag_id": tag, "zone": f"Z{j}", "level": r % (10 * m),
                                           "weight": int(100 * rng.random())}, i)
        elif x < 0.4:
            ev = Event("register", float(i), {"tag_id": tag}, i)
        elif x < 0.55:
            ev = Event("exit", float(i), {"tag_id": tag, "door": f"D{j}"}, i)
        elif x < 0.9:
            ev = Event("reading", float(i), {"device": f"U{jd}", "sensor": f"S{jd}-{r % 7}",
                                             "celsius": round(60 * rng.random(), 1)}, i)
        else:
            ev = Event("alarm", float(i), {"device": f"U{jd}", "level": r % 5}, i)
        events.append(ev)
    return events


def rss_kib() -> int:
    """The resident set now (not the peak), after a collection."""
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def worker(args: argparse.Namespace) -> dict:
    one = args.n == 0  # the baseline: one query of each shape
    n = len(TEMPLATES[args.kind]) if one else args.n
    m = 1 if one else distinct(args.kind, n)
    texts = [query(args.kind, k, m) for k in range(n)]
    events = feed(args.events, m, args.seed)
    warm = Engine(reports=None)
    for t in TEMPLATES[args.kind]:
        warm.register(t.format(j=1, j2=2, lo=0, hi=10, t=20))  # lazy imports, parser tables
    del warm
    rss0 = rss_kib()
    eng = Engine(reports=None, freeze_registered=args.freeze_registered)
    t0 = time.process_time()
    if args.batch:
        ids = []
        for s in range(0, n, 10_000):
            chunk = texts[s:s + 10_000]
            ids += eng.register_many([(t, f"s{s + i}") for i, t in enumerate(chunk)])  # type: ignore[attr-defined]
        bad = [r for r in ids if not isinstance(r, int)]
        if bad:
            raise SystemExit(f"register_many refused: {bad[:3]}")
    else:
        ids = [eng.register(t, name=f"s{k}") for k, t in enumerate(texts)]
    reg = time.process_time() - t0
    rss1 = rss_kib()
    nodes = sum(1 for _ in eng.runtime.nfa.nodes())
    del texts
    matches = 0
    gc.collect()
    c0 = time.process_time()
    for ev in events:
        matches += len(eng.process(ev))
    matches += len(eng.flush())
    cpu = time.process_time() - c0
    sample = random.Random(args.seed).sample(ids, min(len(ids), 1000))
    t0 = time.process_time()
    for qid in sample:
        eng.unregister(qid)
    unreg = time.process_time() - t0
    return {"kind": args.kind, "n": args.n, "batch": args.batch, "events": len(events), "register_us": 1e6 * reg / n,
            "kib_per_sub": (rss1 - rss0) / n, "rss_mib": (rss1 - rss0) / 1024, "cpu_us_event": 1e6 * cpu / len(events),
            "matches": matches, "unregister_us": 1e6 * unreg / len(sample),
            "nodes": nodes}


def run_worker(kind: str, n: int, args: argparse.Namespace, batch: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--kind", kind, "--n", str(n), "--events", str(args.events),
           "--seed", str(args.seed)] + (["--batch"] if batch else []) + \
        (["--freeze-registered"] if args.freeze_registered else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr[-3000:])
        raise SystemExit(f"worker failed: {' '.join(cmd)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


HEADER = ("kind", "subscriptions", "register µs/sub (one at a time)", "register µs/sub (batched)", "RSS KiB/sub",
          "CPU µs/event", "× one query", "unregister µs", "matches", "NFA nodes")


def row(r: dict, base: dict, batched: dict | None) -> list[str]:
    return [r["kind"], f"{r['n']:,}", f"{r['register_us']:,.0f}",
            "—" if batched is None else f"{batched['register_us']:,.1f}", f"{r['kib_per_sub']:.2f}",
            f"{r['cpu_us_event']:,.1f}", f"{r['cpu_us_event'] / base['cpu_us_event']:.2f}",
            f"{r['unregister_us']:,.0f}", f"{r['matches']:,}", f"{r['nodes']:,}"]


def plot(rows: list[dict], bases: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for kind in dict.fromkeys(r["kind"] for r in rows):
        rs = [r for r in rows if r["kind"] == kind]
        ns = [r["n"] for r in rs]
        axes[0].loglog(ns, [r["register_us"] for r in rs], "o-", label=kind)
        axes[1].loglog(ns, [max(r["kib_per_sub"], 0.01) for r in rs], "o-", label=kind)
        axes[2].loglog(ns, [r["cpu_us_event"] / bases[kind]["cpu_us_event"] for r in rs], "o-", label=kind)
    for ax, title in zip(axes, ("registration µs per subscription", "RSS KiB per subscription",
                                "CPU per event ÷ one query's")):
        ax.set_title(title)
        ax.set_xlabel("subscriptions")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


FORMS = {  # issue 33's cases: one predicate written two ways, and overlapping intervals
    "and in one bracket": "[sensor]&&//reading[@sensor='S{j}' and @celsius > {t}]//reading[@celsius > {t}]&&(1 min)",
    "separate brackets": "[sensor]&&//reading[@sensor='S{j}'][@celsius > {t}]//reading[@celsius > {t}]&&(1 min)",
    "interval": ("PATTERN SEQ(shelf a, exit c) WHERE skip_till_next_match(a, c) {{ [tag_id] AND a.tag_id >= {lo} "
                 "AND a.tag_id < {hi} AND c.door = 'D{d}' }} WITHIN {w} seconds"),
}


def forms(n_events: int, seed: int) -> list[str]:
    """CPU µs per event of 1,000 subscriptions of each way of writing a predicate, and of 143 and 1,428
    overlapping intervals (the issue's figures), over one feed each."""
    rng = random.Random(seed)
    readings = [Event("reading", float(i), {"sensor": f"S{rng.randrange(1000)}", "celsius": rng.randrange(60)}, i)
                for i in range(n_events)]
    rfid = []
    for i in range(n_events):
        tag = rng.randrange(2000)
        rfid.append(Event("shelf", float(i), {"tag_id": tag}, i) if rng.random() < 0.7 else
                    Event("exit", float(i), {"tag_id": tag, "door": f"D{rng.randrange(10)}"}, i))
    cases = [(f"1,000 × {name}", FORMS[name], 1000, readings) for name in ("and in one bracket", "separate brackets")]
    cases += [(f"{n:,} × interval", FORMS["interval"], n, rfid) for n in (143, 1428)]
    out = ["| case | CPU µs/event | matches |", "|---|---|---|"]
    for label, template, n, events in cases:
        eng = Engine(reports=None)
        for k in range(n):  # (one at a time: the same call before and after register_many)
            eng.register(template.format(j=k, t=20 + k % 30, lo=k, hi=k + 50 + k % 200, d=k % 10, w=60 + k % 600))
        c0 = time.process_time()
        matches = sum(len(eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq))) for e in events)
        out.append(f"| {label} | {1e6 * (time.process_time() - c0) / len(events):,.1f} | {matches:,} |")
        print(out[-1], flush=True)
    return out


ATOMS = {  # subscriptions sharing a predicate that is not their index key (issue 33, deliver 4)
    "second component": ("PATTERN SEQ(shelf a, exit c) WHERE skip_till_any_match(a, c) {{ [tag_id] AND "
                         "a.zone = 'Z{j}' AND c.door = 'D1' }} WITHIN 1 hour"),
    "root residual": "PATTERN SEQ(reading r) WHERE r.device = 'U{d}' AND r.celsius > 30 AND r.sensor = 'S{j}'",
}


class _Counted:
    """A check counting its evaluations in ``per_event`` by itself (one that reads what a run has bound)."""

    def __init__(self, check: Any, per_event: Counter) -> None:
        self.check, self.per_event, self.key = check, per_event, check

    def __call__(self, ev: Any, vec: tuple) -> bool:
        self.per_event[self.key] += 1
        return self.check(ev, vec)


class _CountedAtom(_Counted):
    """A check of the event alone counting its evaluations by what it computes: a check of the event alone still
    (it has an ``atom_key``)."""

    def __init__(self, check: Any, per_event: Counter) -> None:
        super().__init__(check, per_event)
        self.key = check.atom_key()

    def atom_key(self) -> Any:
        return self.key


def _counted(check: Any, per_event: Counter) -> _Counted:
    return (_Counted if getattr(check, "atom_key", None) is None else _CountedAtom)(check, per_event)


def _count_atoms(eng: Engine, per_event: Counter) -> None:
    """Wrap every begin and take check of ``eng``'s nodes (the check a shared atom evaluates, where one holds it)
    to count its evaluations in ``per_event``."""
    wrapped: set[int] = set()
    for node in eng.runtime.nfa.nodes():
        for field in ("begin", "take"):
            checks = []
            for check in getattr(node, field):
                cell = getattr(check, "cell", None)  # (a shared atom: count what it evaluates)
                if cell is None:
                    checks.append(_counted(check, per_event))
                else:
                    if id(check) not in wrapped:
                        wrapped.add(id(check))
                        cell[2] = _counted(cell[2], per_event)
                    checks.append(check)
            setattr(node, field, tuple(checks))


def _atoms_feed(case: str, n: int, n_events: int, seed: int) -> list[Event]:
    """The feed of an ``ATOMS`` case: ``second component``, 20 tags, shelf zones drawn over the N subscriptions'
    zones, so an exit finds the runs of its tag in about a hundred branches, each testing ``c.door = 'D1'``;
    ``root residual``, readings of ten devices, each finding its device's N/10 subscriptions through the hash
    index, each testing ``r.celsius > 30``."""
    rng = random.Random(seed)
    if case == "second component":
        return [Event("shelf", float(i), {"tag_id": rng.randrange(20), "zone": f"Z{rng.randrange(1, n + 1)}"}, i)
                if rng.random() < 0.7 else
                Event("exit", float(i), {"tag_id": rng.randrange(20), "door": f"D{rng.randrange(1, 4)}"}, i)
                for i in range(n_events)]
    return [Event("reading", float(i), {"device": f"U{rng.randrange(10)}", "celsius": rng.randrange(60),
                                        "sensor": f"S{rng.randrange(n)}"}, i) for i in range(n_events)]


def _atoms_engine(texts: list[str], shared: bool) -> Engine:
    """An engine of ``texts``; ``shared`` False: every check left where it stands, as before atoms were shared
    (the registry's ``add`` switched off while they register)."""
    from yfpp.nfa.shared_atoms import SharedAtoms

    real = SharedAtoms.add
    if not shared:
        SharedAtoms.add = lambda self, node, mate=None: None  # type: ignore[method-assign]
    try:
        eng = Engine(reports=None)
        for t in texts:
            eng.register(t)
    finally:
        SharedAtoms.add = real  # type: ignore[method-assign]
    return eng


@contextmanager
def _per_run(on: bool) -> Iterator[None]:
    """While ``on``: a wait state's candidates tested per run again, as before (``moves._tested_once`` off)."""
    import yfpp.runtime.moves as moves

    real = moves._tested_once
    if on:
        moves._tested_once = lambda cands, ev: (cands, None)
    try:
        yield
    finally:
        moves._tested_once = real


def _atoms_pass(eng: Engine, events: list[Event], per_event: Counter | None) -> tuple[float, int, int, int]:
    """One pass of ``events`` (copies): CPU µs per event, matches, and with ``per_event`` (counting) the atom
    evaluations in all and the most evaluations of one atom in one event."""
    total = most = matches = 0
    c0 = time.process_time()
    for e in events:
        matches += len(eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq)))
        if per_event is not None:
            total += sum(per_event.values())
            most = max(most, max(per_event.values(), default=0))
            per_event.clear()
    return 1e6 * (time.process_time() - c0) / len(events), matches, total, most


def atoms(n_events: int, seed: int, sizes: list[int], rounds: int = 5) -> list[str]:
    """Subscriptions sharing an atomic predicate that is not their index key (``ATOMS``), each atom shared
    (evaluated once per event, and once for the runs of a wait state) against every check left where it stands
    and tested per run: evaluations per event (a counting
    wrapper around every check, one pass each) and CPU µs per event (engines not wrapped, ``rounds`` passes
    each in turn, unshared then shared; the median of each and of the ratios of the pairs)."""
    out = ["| case | subscriptions | atom evaluations per event | most evaluations of one atom in one event "
           "| CPU µs/event, unshared | CPU µs/event, shared | ratio (min–max) | matches |",
           "|---|---|---|---|---|---|---|---|"]
    print("\n".join(out), flush=True)
    for case, template in ATOMS.items():
        for n in sizes:
            events = _atoms_feed(case, n, n_events, seed)
            texts = [template.format(j=k, d=k % 10) for k in range(n)]
            counts = []
            for shared in (False, True):
                eng = _atoms_engine(texts, shared)
                per_event: Counter = Counter()
                _count_atoms(eng, per_event)
                with _per_run(not shared):
                    counts.append(_atoms_pass(eng, events, per_event))
            cpu: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(rounds):
                for shared in (False, True):
                    eng = _atoms_engine(texts, shared)
                    with _per_run(not shared):
                        cpu[shared].append(_atoms_pass(eng, events, None)[0])
            ratios = sorted(a / b for a, b in zip(cpu[True], cpu[False]))
            (_, matches, before, most_before), (_, matches_after, after, most_after) = counts
            assert matches == matches_after, (case, n, matches, matches_after)
            out.append(f"| {case} | {n:,} | {before / n_events:,.1f} → {after / n_events:,.1f} | {most_before:,} → "
                       f"{most_after:,} | {sorted(cpu[False])[rounds // 2]:,.1f} | {sorted(cpu[True])[rounds // 2]:,.1f} "
                       f"| {ratios[rounds // 2]:.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f}) | {matches:,} |")
            print(out[-1], flush=True)
    return out


def churn(kind: str, n: int, seed: int) -> str:
    """CPU µs per subscribe + unsubscribe beside a feed: ``n`` subscriptions of ``kind``, 2,000 events, then 1,000
    rounds of (register one, unregister one at random, process one event), less 1,000 events alone; and where
    the time goes: registering, unregistering, and what the events cost beyond events alone (routes made again
    after a change)."""
    m = distinct(kind, n)
    eng = Engine(reports=None)
    ids = eng.register_many([query(kind, k, m) for k in range(n)])
    events = feed(4000, m, seed)
    for ev in events[:2000]:
        eng.process(ev)
    rng = random.Random(seed)
    texts = [query(kind, n + i, m) for i in range(1000)]
    spent = [0.0, 0.0, 0.0]  # register, unregister, process
    clock = time.process_time
    c0 = clock()
    for i, ev in enumerate(events[2000:3000]):
        t0 = clock()
        ids.append(eng.register(texts[i]))
        t1 = clock()
        eng.unregister(ids.pop(rng.randrange(len(ids) - 1)))
        t2 = clock()
        eng.process(ev)
        t3 = clock()
        spent[0] += t1 - t0
        spent[1] += t2 - t1
        spent[2] += t3 - t2
    changing = clock() - c0
    c0 = clock()
    for ev in events[3000:]:
        eng.process(ev)
    plain = clock() - c0
    per = 1e6 / 1000
    return (f"{kind}, {n:,} subscriptions: {per * (changing - plain):,.0f} µs CPU per subscribe + unsubscribe "
            f"beside the feed ({per * spent[0]:,.0f} registering, {per * spent[1]:,.0f} unregistering, "
            f"{per * (spent[2] - plain):,.0f} in events beyond their cost alone; an event alone: "
            f"{per * plain:,.1f} µs): {2e6 / max(per * (changing - plain), 1e-9):,.0f} changes per CPU second")


def housekeeping(kind: str, n: int, n_events: int, seed: int) -> str:
    """What sweeping, pruning and deadline checks cost beside ``n`` subscriptions of ``kind``: over the feed
    (each event finds about one subscription of a shape at every n, so the live state is alike), the sweeps'
    CPU per event and per object they visit; then over idle events (of the subscribed types, constants that
    no subscription names: no run begins) the CPU per event.  Both should not grow with n."""
    import yfpp.runtime.runtime as rt_module

    m = distinct(kind, n)
    eng = Engine(reports=None)
    eng.register_many([query(kind, k, m) for k in range(n)])
    events = feed(n_events, m, seed)
    swept = [0, 0.0, 0]  # sweeps, CPU seconds, what they visit (stored states and runs, stacks, candidate keys)
    real_sweep = rt_module.sweep

    def timed(rt) -> None:
        swept[2] += sum(len(s) + sum(len(r) for r in s.values()) for s in rt._stores()) + len(rt.buffer.stacks()) \
            + sum(len(s.buckets) for s in rt.negations.holding)
        t0 = time.process_time()
        real_sweep(rt)
        swept[1] += time.process_time() - t0
        swept[0] += 1

    rt_module.sweep = timed
    try:
        c0 = time.process_time()
        for ev in events:
            eng.process(ev)
        busy = time.process_time() - c0
    finally:
        rt_module.sweep = real_sweep
    eng.flush()
    t = events[-1].ts
    idle = []
    for i in range(n_events):  # no run begins: the types every subscription reads, no constant any names
        kind_ = ("shelf", "exit", "reading", "alarm")[i % 4]
        attrs = {"tag_id": i % 200, "zone": "Znone", "door": "Dnone", "device": "Unone", "sensor": "none",
                 "celsius": 0, "level": -1, "weight": 0}
        idle.append(Event(kind_, t + 1 + i, attrs, n_events + i))
    c0 = time.process_time()
    for ev in idle:
        eng.process(ev)
    quiet = time.process_time() - c0
    per_sweep = swept[2] / max(swept[0], 1)
    return (f"| {kind} | {n:,} | {1e6 * busy / n_events:,.1f} | {swept[0]:,} | {1e6 * swept[1] / n_events:,.2f} | "
            f"{per_sweep:,.0f} | {1e9 * swept[1] / max(swept[2], 1):,.0f} | {1e6 * quiet / n_events:,.2f} |")


def state(kind: str, n: int, n_events: int, seed: int) -> str:
    """Snapshot and restore of an engine of ``n`` subscriptions of ``kind`` after ``n_events`` of the feed: CPU
    seconds each way (to and from the JSON text), the checkpoint's bytes per subscription, the RSS after it;
    and the CPU of ``yfpp explain``'s summary of the restored engine."""
    m = distinct(kind, n)
    eng = Engine(reports=None)
    t0 = time.process_time()
    eng.register_many([query(kind, k, m) for k in range(n)])
    reg = time.process_time() - t0
    for ev in feed(n_events, m, seed):
        eng.process(ev)
    t0 = time.process_time()
    text = json.dumps(eng.snapshot(), separators=(",", ":"))
    save = time.process_time() - t0
    del eng
    gc.collect()
    t0 = time.process_time()
    back = Engine.restore(json.loads(text), reports=None)
    load = time.process_time() - t0
    from yfpp.output.explain_summary import summary, summary_text

    t0 = time.process_time()
    lines = summary_text(summary(back)).count("\n") + 1
    explain = time.process_time() - t0
    return (f"| {kind} | {n:,} | {reg:,.1f} | {save:,.2f} | {load:,.1f} | {len(text) / n:,.1f} | "
            f"{len(back.queries) + len(back.set_queries):,} | {rss_kib() / 1024:,.0f} | {explain:,.2f} ({lines} lines) |")


STATE_HEADER = ("| kind | subscriptions | register_many CPU s | snapshot CPU s | restore CPU s | checkpoint bytes/sub "
                "| queries restored | RSS MiB after | explain summary CPU s |\n|---|---|---|---|---|---|---|---|---|")


HOUSEKEEPING_HEADER = ("| kind | subscriptions | CPU µs/event | sweeps | sweep CPU µs/event | objects visited per sweep "
                       "| sweep CPU ns per visited object | idle CPU µs/event |\n|---|---|---|---|---|---|---|---|")


def _tracked() -> tuple[int, int]:
    """The objects the cyclic collector tracks, and the references they hold (what a full collection visits)."""
    objects = gc.get_objects()
    return len(objects), sum(len(gc.get_referents(o)) for o in objects)


def held(kind: str, n: int) -> list[str]:
    """Per shape of ``kind``: the objects Python's cyclic collector tracks, the references they hold (a full
    collection's work follows these) and the bytes (tracemalloc) that one subscription adds, over
    ``register_many`` of ``n`` of the shape after 50 of it (its plan, lazy imports)."""
    import tracemalloc

    lines = ["| shape | tracked objects / sub | references they hold / sub | bytes / sub (tracemalloc) |",
             "|---|---|---|---|"]
    for shape in TEMPLATES[kind]:
        def texts(start: int, count: int) -> list[tuple[str, None]]:
            return [(shape.format(j=j, j2=j + 7, lo=10 * (j - 1), hi=10 * j, t=20 + (7 * j) % 30), None)
                    for j in range(start, start + count)]

        eng, batch = Engine(reports=None), texts(1000, n)
        eng.register_many(texts(1, 50))  # type: ignore[attr-defined]
        gc.collect()
        tracked, refs = _tracked()
        tracemalloc.start()
        eng.register_many(batch)  # type: ignore[attr-defined]
        del batch
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        tracked_after, refs_after = _tracked()
        lines.append(f"| `{shape[:60]}…` | {(tracked_after - tracked) / n:.1f} | {(refs_after - refs) / n:.1f} "
                     f"| {grown / n:,.0f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--sizes", nargs="+", type=int, default=[1_000, 10_000, 100_000])
    p.add_argument("--million", action="store_true", help="also 1,000,000 subscriptions (several GiB before issue 33)")
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=33)
    p.add_argument("--plot", action="store_true", help="write benchmarks/million_subscriptions.png")
    p.add_argument("--no-batch", action="store_true", help="skip the register_many measurement")
    p.add_argument("--freeze-registered", action="store_true", help="the engines measured are made with "
                   "Engine(freeze_registered=True): each registration ends with gc.freeze()")
    p.add_argument("--rows", type=Path, help="append each measurement to this JSON-lines file, and plot every row in it")
    p.add_argument("--forms", action="store_true", help="only the ways of writing a predicate (and, brackets, intervals)")
    p.add_argument("--atoms", action="store_true", help="only subscriptions sharing a predicate that is not their "
                   "index key: evaluations per event and CPU, atoms shared or not (--sizes, 1,000 and 10,000 by default)")
    p.add_argument("--churn", nargs=2, metavar=("KIND", "N"), help="only the cost of subscribing and unsubscribing "
                   "beside a feed, N subscriptions of KIND")
    p.add_argument("--housekeeping", metavar="KIND", help="only what sweeping, pruning and deadline checks cost "
                   "beside --sizes subscriptions of KIND, over the feed and over idle events")
    p.add_argument("--state", metavar="KIND", help="only snapshot and restore of --sizes subscriptions of KIND")
    p.add_argument("--held", metavar="KIND", help="only what one subscription of each shape of KIND holds: objects "
                   "the cyclic collector tracks, the references they hold and bytes (1,000 of a shape registered after 50 "
                   "of it)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kind", help=argparse.SUPPRESS)
    p.add_argument("--housekeeping-one", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--batch", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        os._exit(0)  # (not freeing a million subscriptions object by object at exit: minutes under load)
    if args.held:
        print("\n".join(held(args.held, 1_000)))
        return
    if args.churn:
        print(churn(args.churn[0], int(args.churn[1]), args.seed))
        return
    if args.housekeeping:
        print(HOUSEKEEPING_HEADER)
        for n in args.sizes:  # each in a fresh process: one engine's memory at a time
            done = subprocess.run([sys.executable, __file__, "--housekeeping-one", args.housekeeping, str(n),
                                   "--events", str(args.events), "--seed", str(args.seed)],
                                  capture_output=True, text=True, check=True)
            print(done.stdout.strip(), flush=True)
        return
    if args.state:
        print(STATE_HEADER)
        for n in args.sizes:
            print(state(args.state, n, args.events, args.seed), flush=True)
        return
    if args.housekeeping_one:
        print(housekeeping(args.housekeeping_one[0], int(args.housekeeping_one[1]), args.events, args.seed))
        return
    if args.forms:
        forms(args.events, args.seed)
        return
    if args.atoms:
        atoms(args.events, args.seed, args.sizes if args.sizes != [1_000, 10_000, 100_000] else [1_000, 10_000])
        return
    sizes = sorted(set(args.sizes) | ({1_000_000} if args.million else set()))
    batched_api = hasattr(Engine, "register_many") and not args.no_batch
    rows, bases, lines = [], {}, ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    print(lines[0], lines[1], sep="\n", flush=True)
    for kind in args.kinds:
        base = bases[kind] = run_worker(kind, 0, args)
        print(f"| {kind} | one query | {base['register_us']:,.0f} | | | {base['cpu_us_event']:,.1f} | 1 | | "
              f"{base['matches']:,} | {base['nodes']} |", flush=True)
        for n in sizes:
            r = run_worker(kind, n, args)
            b = run_worker(kind, n, args, batch=True) if batched_api else None
            rows.append(r)
            if args.rows:
                with args.rows.open("a") as f:
                    f.write(json.dumps({"row": r, "base": base}) + "\n")
            line = "| " + " | ".join(row(r, base, b)) + " |"
            lines.append(line)
            print(line, flush=True)
    if args.plot:
        if args.rows:  # every run's rows (one per kind and size: the latest)
            recorded = {}
            for line in args.rows.read_text().splitlines():
                d = json.loads(line)
                recorded[(d["row"]["kind"], d["row"]["n"])] = d["row"]
                bases.setdefault(d["row"]["kind"], d["base"])
            rows = sorted(recorded.values(), key=lambda r: (r["kind"], r["n"]))
        plot(rows, bases, HERE / "million_subscriptions.png")
        print(f"wrote {HERE / 'million_subscriptions.png'}")


if __name__ == "__main__":
    main()
