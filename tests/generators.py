"""Hypothesis strategies: random patterns (IR) and small event streams."""

from __future__ import annotations

from hypothesis import strategies as st

from yfpp.input.events import Event
from yfpp.language.pattern import (
    Aggregate,
    And,
    Arith,
    Compare,
    Component,
    Contiguity,
    Index,
    Kind,
    Length,
    Literal,
    Not,
    Or,
    Pattern,
    Ref,
)

TYPES = ["A", "B", "C"]
CONTIGUITIES = list(Contiguity)
_ABSENT = object()
#: Events of a stream that a pattern with up to 2^events runs is tested over (``within_reach``).
EXPONENTIAL_EVENTS = 14


def exponential(p: Pattern) -> bool:
    """Whether ``p`` may hold 2^events runs: an unwindowed Kleene that picks its first or its later events
    skip-till-any."""
    return p.window is None and any(c.kind is Kind.KLEENE and Contiguity.SKIP_TILL_ANY in (c.contiguity, c.inner)
                                    for c in p.components)


def events_within_reach(patterns: list[Pattern], most: int) -> int:
    """``most``, or ``EXPONENTIAL_EVENTS`` where a pattern is ``exponential``: over 30 events such a pattern runs to
    the run cap for minutes, and CI's fixed examples (``CI=true`` derandomizes Hypothesis) may draw one whenever a
    test's strategy changes."""
    return min(most, EXPONENTIAL_EVENTS) if any(exponential(p) for p in patterns) else most


def within_reach(patterns: list[Pattern], events: list[Event]) -> list[Event]:
    """``events``, no more of them than :func:`events_within_reach` allows."""
    return events[:events_within_reach(patterns, len(events))]


@st.composite
def streams(draw, max_events: int = 10, types=TYPES, min_events: int = 0) -> list[Event]:
    n = draw(st.integers(min_events, max_events))
    ts = 0
    out = []
    for seq in range(n):
        ts += draw(st.sampled_from([0, 0, 1, 1, 2]))
        # k, the equivalence attribute, and y are sometimes null or a list (which compare with nothing)
        attrs = {"x": draw(st.integers(0, 3)), "k": draw(st.sampled_from([0, 1] * 6 + [None, [1]]))}
        y = draw(st.sampled_from([_ABSENT, 0, 1, 2, "s", None, [1]]))
        if y is not _ABSENT:
            attrs["y"] = y
        out.append(Event(draw(st.sampled_from(types)), ts, attrs, seq))
    return out


def _single_preds(draw, v: str, earlier: list[Component]) -> list:
    c = Literal(draw(st.integers(0, 3)))
    options = [
        Compare(">", Ref(v, "x"), c),
        Compare("=", Ref(v, "x"), c),
        Compare("!=", Ref(v, "y"), c),
        Not(Compare("=", Ref(v, "y"), c)),
        Or((Compare("<", Ref(v, "x"), c), Compare("=", Ref(v, "y"), Literal(1)))),
    ]
    for u in earlier:
        if u.kind is Kind.KLEENE:
            options += [
                Compare(">=", Ref(v, "x"), Ref(u.var, "x", Index.LAST)),
                Compare(">", Ref(v, "x"), Ref(u.var, "x")),  # ∀ over u's events
                Compare("<=", Ref(v, "x"), Aggregate("max", u.var, "x", upto_prev=False)),
                Compare(">=", Length(u.var), Literal(2)),
                # u[1] beside a ∀ over u: in the same comparison, in another operand of an OR; two ∀ in an OR
                Compare(">", Ref(v, "x"), Arith("+", Ref(u.var, "x"), Ref(u.var, "x", Index.FIRST))),
                Or((Compare(">", Ref(v, "x"), Ref(u.var, "x")), Compare("<", Ref(u.var, "x", Index.FIRST), Ref(v, "x")))),
                Or((Compare(">", Ref(v, "x"), Ref(u.var, "x")), Compare("<", Ref(v, "y"), Ref(u.var, "y")))),
                Or((Compare("=", Ref(v, "x"), Literal(9)),
                    And((Not(Compare("=", Ref(u.var, "x"), c)), Compare(">", Ref(u.var, "x", Index.LAST), c))))),
            ]
        else:
            options += [
                Compare(">=", Ref(v, "x"), Ref(u.var, "x")),
                Compare("<", Ref(v, "x"), Arith("+", Ref(u.var, "x"), Literal(1))),
                Compare("=", Ref(v, "y"), Ref(u.var, "y")),
            ]
    return draw(st.lists(st.sampled_from(options), max_size=2, unique=True))


def _kleene_preds(draw, v: str, earlier: list[Component]) -> list:
    c = Literal(draw(st.integers(0, 3)))
    options = [
        Compare(">", Ref(v, "x", Index.EACH), Ref(v, "x", Index.PREV)),
        Compare(">=", Ref(v, "x"), Ref(v, "x", Index.FIRST)),
        Compare(">", Ref(v, "x"), Aggregate("avg", v, "x")),
        Compare("<=", Ref(v, "x"), Aggregate("min", v, "x")),
        Compare("=", Ref(v, "x", Index.FIRST), c),
        Compare("<", Ref(v, "x"), c),
        Compare(">=", Length(v), Literal(2)),
        Compare(">", Ref(v, "x", Index.LAST), c),
        Compare(">", Aggregate("sum", v, "x", upto_prev=False), c),
        Compare("<", Aggregate("count", v, "y", upto_prev=False), Literal(3)),
    ]
    for u in earlier:
        if u.kind is not Kind.KLEENE:
            options.append(Compare(">=", Ref(v, "x"), Ref(u.var, "x")))
    return draw(st.lists(st.sampled_from(options), max_size=2, unique=True))


def _negation_preds(draw, n: str, before: Component, after: Component | None) -> list:
    c = Literal(draw(st.integers(0, 3)))
    options = [Compare("=", Ref(n, "x"), c), Compare("!=", Ref(n, "y"), c), Compare("=", Ref(n, "x"), Ref(before.var, "x"))]
    if after is not None and after.kind is not Kind.KLEENE:
        options.append(Compare("<", Ref(n, "x"), Ref(after.var, "x")))
    return draw(st.lists(st.sampled_from(options), max_size=2, unique=True))


@st.composite
def patterns(draw, allow_negation: bool = True, max_positives: int = 3, trailing: bool | None = None) -> Pattern:
    """A SEQ pattern; ``trailing``: True ends it in a negation (and a window), False never, None sometimes."""
    n_pos = draw(st.integers(1, max_positives))
    window = draw(st.integers(0, 6) if trailing else st.one_of(st.none(), st.integers(0, 6)))
    mixed = draw(st.booleans())
    strategy = draw(st.sampled_from(CONTIGUITIES))
    keyed = draw(st.booleans())
    comps: list[Component] = []
    where: list = []
    positives: list[Component] = []
    for i in range(n_pos):
        if i > 0 and allow_negation and draw(st.integers(0, 3)) == 0:
            for j in range(draw(st.sampled_from([1, 1, 2]))):  # negations may stand in a row
                n = Component(f"n{i}" + "b" * j, draw(st.sampled_from(TYPES)), Kind.NEGATED)
                comps.append(n)
                where += _negation_preds(draw, n.var, positives[-1], None)
        kind = draw(st.sampled_from([Kind.SINGLE, Kind.SINGLE, Kind.KLEENE]))
        contig = draw(st.sampled_from(CONTIGUITIES)) if mixed else strategy
        inner = draw(st.sampled_from(CONTIGUITIES)) if mixed and kind is Kind.KLEENE else None
        etype = draw(st.sampled_from(TYPES + [None]))
        c = Component(f"v{i}", etype, kind, contig, inner)
        preds = _kleene_preds(draw, c.var, positives) if kind is Kind.KLEENE else _single_preds(draw, c.var, positives)
        where += preds
        comps.append(c)
        positives.append(c)
    if trailing is None:
        trailing = allow_negation and window is not None and draw(st.integers(0, 4)) == 0
    if trailing:
        for j in range(draw(st.sampled_from([1, 1, 2]))):
            n = Component("nt" + "b" * j, draw(st.sampled_from(TYPES)), Kind.NEGATED)
            comps.append(n)
            where += _negation_preds(draw, n.var, positives[-1], None)
    policy = "all" if trailing else draw(st.sampled_from(["all", "all", "non_overlapping"]))
    return Pattern(tuple(comps), tuple(where), ("k",) if keyed else (), window, policy).validate()


def _set_preds(draw, v: Component, others: list[Component]) -> list:
    """Properties of ``v``, prev() chains, and relationships with other variables of a set pattern."""
    c = Literal(draw(st.integers(0, 3)))
    x = Ref(v.var, "x")
    options = [Compare(">", x, c), Compare("!=", Ref(v.var, "y"), c), Not(Compare("=", x, c)),
               Compare("=", Ref(v.var, "k"), Ref(v.var, "k"))]  # a property of each event, not a relationship
    if v.kind is Kind.KLEENE:
        prev = Ref(v.var, "x", Index.PREV)
        options += [
            Compare("<", prev, x),
            Compare(">=", prev, x),
            Compare(">=", Length(v.var), Literal(2)),
            Compare("<=", Ref(v.var, "x", Index.FIRST), prev),
            Compare(">", Aggregate("max", v.var, "x", upto_prev=False), c),
        ]
    for u in others:
        options += [Compare("<=", Ref(u.var, "x"), x), Compare("=", Ref(u.var, "k"), Ref(v.var, "k"))]
        if v.kind is Kind.KLEENE:
            options.append(Compare("<", Ref(v.var, "x", Index.PREV), Arith("+", x, Ref(u.var, "x"))))
        if u.kind is Kind.KLEENE:
            options += [Compare(">", x, Ref(u.var, "x", Index.LAST)),
                        Or((Compare(">", x, Ref(u.var, "x")), Compare("<", Ref(u.var, "x", Index.FIRST), x)))]
    return draw(st.lists(st.sampled_from(options), max_size=2, unique=True))


@st.composite
def set_patterns(draw, max_vars: int = 4, types=TYPES) -> Pattern:
    """Event-set patterns (docs/event_sets.md): 1–3 sets of 1–4 variables in all, a window, maybe [k],
    maybe a negation between two sets or after the last one, any of the policies."""
    n_vars = draw(st.integers(1, max_vars))
    n_blocks = draw(st.integers(1, min(3, n_vars)))
    cuts = sorted(draw(st.lists(st.integers(1, n_vars - 1), min_size=n_blocks - 1, max_size=n_blocks - 1, unique=True))) if n_blocks > 1 else []
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [n_vars])]
    stam = Contiguity.SKIP_TILL_ANY
    comps: list[Component] = []
    for b, size in enumerate(sizes):
        set_id = b if size > 1 or b == 0 or draw(st.booleans()) else None
        for _ in range(size):
            kind = draw(st.sampled_from([Kind.SINGLE, Kind.KLEENE]))
            etype = draw(st.sampled_from(types + types + [None]))
            comps.append(Component(f"v{len(comps)}", etype, kind, stam, stam, set_id))
    where: list = []
    for i, c in enumerate(comps):
        where += _set_preds(draw, c, comps[:i])
    if len(sizes) > 1 and draw(st.booleans()):  # a negation between two sets
        at = sum(sizes[: draw(st.integers(1, len(sizes) - 1))])
        n = Component("n", draw(st.sampled_from(types)), Kind.NEGATED)
        before, after = comps[at - 1], comps[at]
        options = [Compare("=", Ref("n", "x"), Literal(draw(st.integers(0, 3)))), Compare(">", Ref("n", "x"), Ref(before.var, "x")),
                   # equality links through the negation (before.k = n.k AND n.k = after.k does not make before.k = after.k)
                   Compare("=", Ref(before.var, "k"), Ref("n", "k")), Compare("=", Ref("n", "k"), Ref(after.var, "k"))]
        where += draw(st.lists(st.sampled_from(options), max_size=2, unique=True))
        comps.insert(at, n)
    trailing = draw(st.integers(0, 3)) == 0
    if trailing:  # a negation after the last set: none within τ of the match's first event
        n = Component("nt", draw(st.sampled_from(types)), Kind.NEGATED)
        options = [Compare("=", Ref("nt", "x"), Literal(draw(st.integers(0, 3)))), Compare(">", Ref("nt", "x"), Ref(comps[-1].var, "x")),
                   Compare("=", Ref("nt", "k"), Ref(comps[0].var, "k"))]
        where += draw(st.lists(st.sampled_from(options), max_size=2, unique=True))
        comps.append(n)
    keyed = draw(st.integers(0, 3)) == 0
    policy = draw(st.sampled_from(["all", "all", "earliest_maximal"] + ([] if trailing else ["non_overlapping"])))
    window = draw(st.integers(0, 6))
    return Pattern(tuple(comps), tuple(where), ("k",) if keyed else (), window, policy).validate()
