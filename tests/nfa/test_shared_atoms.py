"""Atomic predicates many nodes hold, evaluated once per event (``yfpp.nfa.shared_atoms``): against the reference
evaluator with many subscriptions sharing atoms, the evaluations counted, and what registration decides."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.language.query_text import parse_query
from yfpp.nfa.predicates import atom_key
from yfpp.nfa.shared_atoms import is_shared
from yfpp.reference.oracle import reference_matches

TEMPLATES = [  # constants from small pools: many subscriptions hold the same atoms, at roots and below
    "PATTERN SEQ(a e, b f) WHERE skip_till_any_match(e, f) {{ [k] AND e.x = {v} AND f.y = {u} }} WITHIN {w}",
    "PATTERN SEQ(a e) WHERE e.x = {v} AND e.y > {t} AND e.k = {u}",
    "PATTERN SEQ(a e, b f) WHERE skip_till_next_match(e, f) {{ [k] AND e.y >= {t} AND e.y < {u} AND f.x = '{s}' }}"
    " WITHIN {w}",
    "PATTERN SEQ(b+ e[], a f) WHERE skip_till_next_match(e[], f) {{ [k] AND e[i].y > {t} AND f.x = {v} }} WITHIN {w}",
    "[k]&&//a[@x = '{s}'][@y > {t}]//b[@y = '{s}']&&({w})",
    "PATTERN SEQ(a e, ~c g, b f) WHERE skip_till_next_match(e, g, f) {{ [k] AND e.x = {v} AND g.y = {u} AND "
    "f.y = {u} }} WITHIN {w}",
]
VALUES = [0, 1, 2, 1.0, "1", "x", True, None]


def text(template: int, v: int, u: int, t: int, s: str, w: int) -> str:
    return TEMPLATES[template].format(v=v, u=u, t=t, s=s, w=w)


subscriptions = st.tuples(st.integers(0, len(TEMPLATES) - 1), st.integers(0, 2), st.integers(0, 2),
                          st.integers(-1, 2), st.sampled_from(["1", "x"]), st.integers(2, 6))
events = st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(VALUES), st.sampled_from(VALUES),
                            st.sampled_from([1, 2])), max_size=12)


def stream_of(evs: list) -> list[Event]:
    return [Event(t, float(i), {k: v for k, v in (("x", x), ("y", y), ("k", key)) if v is not None}, i)
            for i, (t, x, y, key) in enumerate(evs)]


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(subscriptions, min_size=2, max_size=14), events, st.integers(0, 13))
def test_subscriptions_sharing_atoms_match_each_query_alone(subs, evs, dropped):
    """Every subscription gives the reference evaluator's matches of its query alone, however many atoms it
    shares with the others (one removed before the events: its atoms are forgotten, the others' kept)."""
    stream = stream_of(evs)
    eng = Engine()
    ids = [eng.register(text(*sub), f"q{j}") for j, sub in enumerate(subs)]
    gone = f"q{dropped % len(subs)}"
    eng.unregister(ids[dropped % len(subs)])
    got: Counter = Counter()
    for e in stream:
        got.update((m["query"], tuple((k, tuple(v)) for k, v in m["bindings"].items()))
                   for m in eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq)))
    got.update((m["query"], tuple((k, tuple(v)) for k, v in m["bindings"].items())) for m in eng.flush())
    want: Counter = Counter()
    for j, sub in enumerate(subs):
        if f"q{j}" != gone:
            for binds, _ in reference_matches(parse_query(text(*sub)), stream):
                want[(f"q{j}", tuple((k, tuple(b)) for k, b in binds.items()))] += 1
    assert got == want


class Counted:
    """A check of the event alone that counts its evaluations in ``per_event`` by its atom key (an event-only
    check still: it has an ``atom_key``)."""

    def __init__(self, check, per_event: Counter) -> None:
        self.check, self.per_event, self.key = check, per_event, atom_key(check)

    def __call__(self, ev, vec):
        self.per_event[self.key] += 1
        return self.check(ev, vec)

    def atom_key(self):
        return self.key


def count_evaluations(eng: Engine, per_event: Counter) -> None:
    """Wrap what each node's checks of the event alone evaluate (a shared atom's own check once) to count it."""
    done = set()
    for node in eng.runtime.nfa.nodes():
        for field in ("begin", "take"):
            checks = []
            for c in getattr(node, field):
                if is_shared(c):
                    if id(c) not in done:
                        done.add(id(c))
                        c.cell[2] = Counted(c.cell[2], per_event)
                    checks.append(c)
                else:
                    checks.append(Counted(c, per_event) if atom_key(c) is not None else c)
            setattr(node, field, tuple(checks))


def test_each_atom_is_evaluated_at_most_once_per_event():
    """Fifty alerts of one device (found together through the hash index), and fifty subscriptions whose second
    component is the same exit door (runs of one tag in fifty branches): each atom once per event."""
    eng = Engine()
    for j in range(50):
        eng.register(f"PATTERN SEQ(reading r) WHERE r.device = 'U1' AND r.celsius > 30 AND r.sensor = 'S{j}'")
        eng.register(f"PATTERN SEQ(shelf a, exit c) WHERE skip_till_any_match(a, c) {{ [tag_id] AND a.zone = 'Z{j}' "
                     f"AND c.door = 'D1' }} WITHIN 1 hour")
    per_event: Counter = Counter()
    count_evaluations(eng, per_event)
    feed = [Event("shelf", float(i), {"tag_id": 7, "zone": f"Z{i}"}, i) for i in range(50)]
    feed += [Event("exit", 50.0, {"tag_id": 7, "door": "D1"}, 50),
             Event("reading", 51.0, {"device": "U1", "celsius": 40, "sensor": "S3"}, 51),
             Event("reading", 52.0, {"device": "U1", "celsius": 20, "sensor": "S3"}, 52)]
    most, matches = [], 0
    for ev in feed:
        matches += len(eng.process(ev))
        most.append(max(per_event.values(), default=0))
        per_event.clear()
    assert matches == 50 + 1  # the exit ends a run in each of the 50 branches; the first reading is S3's alert
    assert max(most) == 1


def test_a_predicate_of_one_node_is_evaluated_once_for_its_many_runs():
    """One query, fifty runs of one tag waiting for its exit: the exit's ``c.door = 'D1'`` is evaluated once for
    them all (the wait state's candidates tested before its runs), and each run still checks its own window."""
    eng = Engine()
    eng.register("PATTERN SEQ(shelf a, exit c) WHERE skip_till_any_match(a, c) { [tag_id] AND c.door = 'D1' } "
                 "WITHIN 30 seconds")
    per_event: Counter = Counter()
    count_evaluations(eng, per_event)
    for i in range(50):
        eng.process(Event("shelf", float(i), {"tag_id": 7}, i))
    assert len(eng.process(Event("exit", 55.0, {"tag_id": 7, "door": "D1"}, 50))) == 25  # the shelves of 25..49 s
    assert per_event == {("eq", "door", "D1"): 1}
    per_event.clear()
    assert eng.process(Event("exit", 56.0, {"tag_id": 7, "door": "D2"}, 51)) == []
    assert per_event == {("eq", "door", "D1"): 1}


def test_an_event_given_again_is_evaluated_again():
    """The answers are of one event: the same event object, changed and given again, is evaluated again."""
    eng = Engine()
    for j in range(3):
        eng.register(f"PATTERN SEQ(reading r) WHERE r.device = 'U1' AND r.celsius > 30 AND r.sensor = 'S{j}'")
    ev = Event("reading", 1.0, {"device": "U1", "celsius": 40, "sensor": "S1"}, 1)
    assert len(eng.process(ev)) == 1
    ev.attrs["celsius"] = 20
    assert eng.process(ev) == []
    ev.attrs["celsius"] = 35
    assert len(eng.process(ev)) == 1


def test_registration_shares_only_atoms_an_event_can_reach_twice():
    """Per-user alerts of distinct users (roots a hash index never finds together) keep their checks as they are;
    a second alert of one user shares the atoms of both; unregistering gives back what was shared."""
    eng = Engine()
    ids = [eng.register(f"PATTERN SEQ(reading r) WHERE r.device = 'U{j}' AND r.celsius > 30") for j in range(100)]
    atoms = eng.runtime.nfa.atoms
    assert not atoms.atoms and not atoms.single
    twin = eng.register("PATTERN SEQ(reading r) WHERE r.device = 'U5' AND r.celsius > 30 AND r.sensor = 'S'")
    assert set(atoms.atoms) == {("eq", "device", "U5"), (">", "celsius", int, 30)}
    assert [a.holders for a in atoms.atoms.values()] == [2, 2]
    eng.unregister(twin)
    eng.unregister(ids[5])
    assert not atoms.atoms and not atoms.single and not atoms.paired
    for qid in ids:
        if qid != ids[5]:
            eng.unregister(qid)
    assert not atoms.atoms and not atoms.single and not atoms.paired


def test_an_equality_is_one_atom_whatever_number_type_its_constant_has():
    """``x = 1`` and ``x = 1.0`` hold for the same values (one atom); ``x = true`` does not (another)."""
    eng = Engine()
    for lit in ("1", "1.0", "true"):
        eng.register(f"PATTERN SEQ(a e, b f) WHERE skip_till_any_match(e, f) {{ [k] AND e.z = 'p' AND f.x = {lit} }}")
    assert set(eng.runtime.nfa.atoms.atoms) == {("eq", "x", 1)}
    out = []
    for i, (t, x) in enumerate([("a", None), ("b", 1), ("b", True), ("b", 1.0), ("b", "1")]):
        attrs = {"k": 1, "z": "p"} if t == "a" else {"k": 1, "x": x}
        out.append(sorted(m["query"] for m in eng.process(Event(t, float(i), attrs, i))))
    assert out == [[], [0, 1], [2], [0, 1], []]
