"""An extended-XPath query and its hand-written equivalent give the same matches.

The equivalent is SASE+ text when one strategy covers the query (every
positive step after the first, and a Kleene first step, has the same axis),
else the pattern IR built by hand (SASE+ text cannot mix contiguities).  Its
predicates are SASE+ comparisons on the typed attributes where the XPath
query has XPath predicates on the event's element.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from yfpp.engine import Engine
from yfpp.language.pattern import Arith, Compare, Component, Contiguity, Expr, Kind, Literal, Not, Pattern, Ref

TYPES = ("A", "B", "C", None)  # None: `*` / ANY

#: (XPath predicate, SASE+ predicate on variable {v}, IR predicate)
PREDICATES = (
    ("@x > 1", "{v}.x > 1", lambda v: Compare(">", Ref(v, "x"), Literal(1))),
    ("@x = 2", "{v}.x = 2", lambda v: Compare("=", Ref(v, "x"), Literal(2))),
    ("@y = 's'", "{v}.y = 's'", lambda v: Compare("=", Ref(v, "y"), Literal("s"))),
    ("not(@y = 's')", "NOT({v}.y = 's')", lambda v: Not(Compare("=", Ref(v, "y"), Literal("s")))),
    ("@x + @k >= 2", "{v}.x + {v}.k >= 2", lambda v: Compare(">=", Arith("+", Ref(v, "x"), Ref(v, "k")), Literal(2))),
)


@dataclass(frozen=True)
class Step:
    var: str
    axis: str
    event_type: str | None
    negated: bool
    kleene: bool
    plus_last: bool  # `B[p]+` rather than `B+[p]`
    predicate: int | None

    def xpath(self) -> str:
        name = self.event_type or "*"
        pred = f"[{PREDICATES[self.predicate][0]}]" if self.predicate is not None else ""
        plus = "+" if self.kleene else ""
        body = f"{name}{pred}{plus}" if self.plus_last else f"{name}{plus}{pred}"
        return f"{self.axis}{'!' if self.negated else ''}{body}"


@dataclass(frozen=True)
class Query:
    steps: tuple[Step, ...]
    partitioned: bool
    window: int | None

    def xpath(self) -> str:
        parts = (["[k]"] if self.partitioned else []) + ["".join(s.xpath() for s in self.steps)]
        return "&&".join(parts + ([f"({self.window})"] if self.window is not None else []))

    def contiguity(self, axis: str) -> Contiguity:
        if axis == "//":
            return Contiguity.SKIP_TILL_ANY
        return Contiguity.PARTITION if self.partitioned else Contiguity.STRICT

    def uniform_axis(self) -> str | None:
        """The one axis of all positive steps (a single first step's does not count)."""
        first, *rest = [s for s in self.steps if not s.negated]
        axes = {s.axis for s in rest} | ({first.axis} if first.kleene else set())
        return axes.pop() if len(axes) == 1 else ("//" if not axes else None)

    def sase(self, axis: str) -> str:
        def component(s: Step) -> str:
            name = s.event_type or "ANY"
            if s.negated:
                return f"~{name} {s.var}"
            return f"{name}+ {s.var}[]" if s.kleene else f"{name} {s.var}"

        strategy = {
            Contiguity.SKIP_TILL_ANY: "skip_till_any_match",
            Contiguity.PARTITION: "partition_contiguity",
            Contiguity.STRICT: "strict_contiguity",
        }[self.contiguity(axis)]
        conds = (["[k]"] if self.partitioned else []) + [
            PREDICATES[s.predicate][1].format(v=s.var) for s in self.steps if s.predicate is not None
        ]
        text = f"PATTERN SEQ({', '.join(component(s) for s in self.steps)}) "
        text += f"WHERE {strategy}({', '.join(s.var for s in self.steps)}) {{ {' AND '.join(conds)} }}"
        return text + (f" WITHIN {self.window}" if self.window is not None else "")

    def pattern(self) -> Pattern:
        components = []
        for i, s in enumerate(self.steps):
            kind = Kind.NEGATED if s.negated else Kind.KLEENE if s.kleene else Kind.SINGLE
            # the first single step's and the negations' contiguity must not matter
            c = Contiguity.SKIP_TILL_NEXT if (i == 0 and not s.kleene) or s.negated else self.contiguity(s.axis)
            components.append(Component(s.var, s.event_type, kind, c, self.contiguity(s.axis) if s.kleene else None))
        where: list[Expr] = [PREDICATES[s.predicate][2](s.var) for s in self.steps if s.predicate is not None]
        return Pattern(tuple(components), tuple(where), ("k",) if self.partitioned else (), self.window)


@st.composite
def queries(draw) -> Query:
    uniform = draw(st.booleans())
    base = draw(st.sampled_from(["/", "//"]))
    window = draw(st.none() | st.integers(0, 4))
    n = draw(st.integers(1, 4))

    def step(var: str, negated: bool) -> Step:
        return Step(
            var=var,
            axis=base if uniform else draw(st.sampled_from(["/", "//"])),
            event_type=draw(st.sampled_from(TYPES)),
            negated=negated,
            kleene=not negated and draw(st.integers(0, 3)) == 0,
            plus_last=draw(st.booleans()),
            predicate=draw(st.none() | st.integers(0, len(PREDICATES) - 1)),
        )

    steps, negs = [], 0
    for i in range(1, n + 1):
        if i > 1 and draw(st.integers(0, 2)) == 0:
            negs += 1
            steps.append(step(f"n{negs}", True))
        steps.append(step(f"e{i}", False))
    if window is not None and draw(st.integers(0, 3)) == 0:
        steps.append(step(f"n{negs + 1}", True))
    return Query(tuple(steps), draw(st.booleans()), window)


@st.composite
def streams(draw) -> list[dict]:
    ts, out = 0, []
    for _ in range(draw(st.integers(0, 10))):
        ts += draw(st.sampled_from([0, 1, 1, 2]))
        event = {"type": draw(st.sampled_from(["A", "B", "C"])), "ts": ts, "x": draw(st.integers(0, 3)), "k": draw(st.integers(0, 1))}
        y = draw(st.sampled_from([None, 0, 1, "s"]))
        if y is not None:
            event["y"] = y
        out.append(event)
    return out


def matches(query: str | Pattern, events: list[dict]) -> list[tuple[int | None, tuple]]:
    """(index of the call that returned it, None for flush; bindings) of every match."""
    engine = Engine()
    engine.register(query, name="q")
    out = []
    for i, event in enumerate(events):
        out += [(i, tuple((k, tuple(v)) for k, v in m["bindings"].items())) for m in engine.process(dict(event))]
    out += [(None, tuple((k, tuple(v)) for k, v in m["bindings"].items())) for m in engine.flush()]
    return sorted(out, key=repr)


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(queries(), streams())
def test_xpath_query_matches_its_equivalent(query: Query, events: list[dict]) -> None:
    axis = query.uniform_axis()
    equivalent: str | Pattern = query.sase(axis) if axis is not None else query.pattern()
    note(f"xpath: {query.xpath()}\nequivalent: {equivalent}")
    assert matches(query.xpath(), events) == matches(equivalent, events)
