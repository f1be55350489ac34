"""A deliberately simple reference evaluator of docs/semantics.md §2–5 — the test oracle.

It shares nothing with the engine but the pattern IR: every run is an
explicit object holding its bound events and the events it ignored, every
run sees every event, predicates are interpreted from the tree against the
bindings, negation is a filter on finished matches and ``non_overlapping``
a pass over all of them.  Slow on purpose; read it next to docs/semantics.md §2–5.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from yfpp.input.events import Event
from yfpp.language.pattern import (
    Aggregate,
    And,
    Arith,
    Compare,
    Contiguity,
    Expr,
    Index,
    Kind,
    Length,
    Literal,
    Neg,
    Not,
    Or,
    Pattern,
    Ref,
    XPathTest,
    variables,
    walk,
)

_NOVALUE = object()


# --- expression interpreter -------------------------------------------------------------


@dataclass
class Env:
    binds: dict[str, list[Event]]  # positive var -> its bound events so far
    kleene: set[str]
    current: str | None = None  # var whose event is `event`
    event: Event | None = None
    iterating: bool = False  # `event` is a new iteration of Kleene `current`
    fixed: dict[str, Event] = field(default_factory=dict)  # quantified vars


def _num(v: Any) -> bool:
    return type(v) in (int, float)


def _get(e: Event | None, attr: str) -> Any:
    if e is None:
        return _NOVALUE
    if attr in e.attrs:
        return e.attrs[attr]
    if attr in ("ts", "type", "seq"):
        return getattr(e, attr)
    return _NOVALUE


def partition_of(e: Event, attrs: tuple[str, ...]) -> tuple | None:
    """``e``'s values of the equivalence attributes, None when one is missing, null or unhashable (a list…)."""
    vals = tuple(_get(e, a) for a in attrs)
    return None if any(v is _NOVALUE or v is None or not _hashable(v) for v in vals) else vals


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _cmp(op: str, a: Any, b: Any) -> bool:
    if a is _NOVALUE or b is _NOVALUE:
        return False
    if _num(a) and _num(b):
        pass
    elif type(a) is not type(b) or a is None or isinstance(a, (list, dict)):
        return False
    elif type(a) is bool and op not in ("=", "!="):
        return False
    ops = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
    return ops[op](a, b)


def _event(env: Env, var: str, index: Index) -> Event | None:
    if index is Index.EACH and var in env.fixed:  # (v[1], v[v.len] of a quantified v: its first, last event)
        return env.fixed[var]
    if var == env.current:
        if not env.iterating or index is Index.EACH:
            return env.event
        bound = env.binds.get(var, [])
        if index is Index.PREV:
            return bound[-1] if bound else None
        if index is Index.FIRST:
            return bound[0] if bound else env.event
        raise ValueError("last of a Kleene variable while it iterates")
    bound = env.binds[var]
    if var not in env.kleene:
        return bound[0]
    return bound[0] if index is Index.FIRST else bound[-1]


def _overflow_free(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or no value when it overflows (OverflowError, a float that is not finite, or an int
    of more than 4,300 digits)."""
    try:
        v = fn(*args)
    except OverflowError:
        return _NOVALUE
    if isinstance(v, float) and not math.isfinite(v):
        return _NOVALUE
    return _NOVALUE if isinstance(v, int) and abs(v) >= 10**4300 else v


def value(expr: Expr, env: Env) -> Any:
    if isinstance(expr, Literal):
        return expr.value
    if isinstance(expr, Ref):
        return _get(_event(env, expr.var, expr.index), expr.attr)
    if isinstance(expr, Length):
        return len(env.binds[expr.var])
    if isinstance(expr, Aggregate):
        vals = [_get(e, expr.attr) for e in env.binds.get(expr.var, [])]
        if expr.func == "count":
            return sum(1 for v in vals if v is not _NOVALUE)
        if not vals or not all(_num(v) for v in vals):
            return _NOVALUE
        return _overflow_free({"sum": sum, "min": min, "max": max, "avg": lambda xs: sum(xs) / len(xs)}[expr.func], vals)
    if isinstance(expr, Arith):
        a, b = value(expr.left, env), value(expr.right, env)
        if not (_num(a) and _num(b)):
            return _NOVALUE
        if expr.op in "/%" and b == 0:
            return _NOVALUE
        return _overflow_free({"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "%": operator.mod}[expr.op], a, b)
    if isinstance(expr, Neg):
        v = value(expr.operand, env)
        return -v if _num(v) else _NOVALUE
    return holds(expr, env)


def holds(expr: Expr, env: Env) -> bool:
    if isinstance(expr, And):
        return all(holds(x, env) for x in expr.operands)
    if isinstance(expr, Or):
        return any(holds(x, env) for x in expr.operands)
    if isinstance(expr, Not):
        return not holds(expr.operand, env)
    quantified = sorted(
        {
            n.var
            for n in walk(expr)
            if isinstance(n, (Ref, XPathTest))
            and n.var in env.kleene
            and getattr(n, "index", Index.EACH) is Index.EACH
            and n.var not in env.fixed
            and not (env.iterating and n.var == env.current)
        }
    )
    if quantified:
        for combo in product(*(env.binds[v] for v in quantified)):
            sub = Env(env.binds, env.kleene, env.current, env.event, env.iterating, {**env.fixed, **dict(zip(quantified, combo))})
            if not holds(expr, sub):
                return False
        return True
    if isinstance(expr, Compare):
        return _cmp(expr.op, value(expr.left, env), value(expr.right, env))
    if isinstance(expr, XPathTest):
        from xpath_ext.xpath_predicates import compile_xpath_test

        return compile_xpath_test(expr.source, expr.namespaces)(_event(env, expr.var, Index.EACH))
    return value(expr, env) is True


# --- which conjuncts apply where (docs/semantics.md §4) ---------------------------------------------


def _kleene_use(conj: Expr, var: str) -> str:
    """'final', 'rest' (i >= 2), 'first' or 'every' for a conjunct whose last variable is Kleene ``var``."""
    uses = set()
    for n in walk(conj):
        if getattr(n, "var", None) != var:
            continue
        if isinstance(n, Length) or (isinstance(n, Ref) and n.index is Index.LAST):
            uses.add("final")
        elif isinstance(n, Aggregate):
            uses.add("prev" if n.upto_prev else "final")
        elif isinstance(n, Ref):
            uses.add(n.index.value)
        else:
            uses.add("each")
    if "final" in uses:
        return "final"
    if "prev" in uses or {"each", "first"} <= uses:
        return "rest"
    return "first" if "first" in uses else "every"


# --- runs ---------------------------------------------------------------------------------


@dataclass
class RefRun:
    pos: int  # index into the positive components
    inside: bool  # inside Kleene positives[pos] with >= 1 event bound
    binds: dict[str, list[Event]]
    ignored: list[Event]  # ignored since the last begin/take into the current Kleene


class Reference:
    def __init__(self, pattern: Pattern):
        self.p = pattern
        self.pos = list(pattern.positives)
        self.kleene = {c.var for c in self.pos if c.kind is Kind.KLEENE}
        order = {c.var: i for i, c in enumerate(pattern.components)}
        self.negated = {c.var for c in pattern.components if c.kind is Kind.NEGATED}
        self.last_var = {}
        for conj in pattern.where:
            vs = variables(conj)
            self.last_var[conj] = max(vs, key=order.get) if vs else pattern.components[0].var

    def key(self, e: Event) -> Any:
        return partition_of(e, self.p.partition_by)

    def env(self, run: RefRun, current=None, event=None, iterating=False) -> Env:
        return Env(run.binds, self.kleene, current, event, iterating)

    def _conjuncts_of(self, var: str) -> list[Expr]:
        return [c for c in self.p.where if self.last_var[c] == var and not (variables(c) & self.negated)]

    def begins(self, k: int, run: RefRun, e: Event) -> bool:
        c = self.pos[k]
        if c.event_type is not None and c.event_type != e.type:
            return False
        if self.p.partition_by:
            if self.key(e) is None:
                return False
            if run.binds and self.key(self._first(run)) != self.key(e):
                return False
        if run.binds and self.p.window is not None and e.ts - self._first(run).ts > self.p.window:
            return False
        conjs = self._conjuncts_of(c.var)
        if c.kind is Kind.KLEENE:
            conjs = [x for x in conjs if _kleene_use(x, c.var) in ("first", "every")]
        env = self.env(run, c.var, e, iterating=c.kind is Kind.KLEENE)
        return all(holds(x, env) for x in conjs)

    def takes(self, k: int, run: RefRun, e: Event) -> bool:
        c = self.pos[k]
        if c.event_type is not None and c.event_type != e.type:
            return False
        if self.p.partition_by and self.key(e) != self.key(self._first(run)):
            return False
        if self.p.window is not None and e.ts - self._first(run).ts > self.p.window:
            return False
        conjs = [x for x in self._conjuncts_of(c.var) if _kleene_use(x, c.var) in ("rest", "every")]
        env = self.env(run, c.var, e, iterating=True)
        return all(holds(x, env) for x in conjs)

    def final_ok(self, k: int, run: RefRun) -> bool:
        c = self.pos[k]
        conjs = [x for x in self._conjuncts_of(c.var) if _kleene_use(x, c.var) == "final"]
        return all(holds(x, self.env(run)) for x in conjs)

    def ignorable(self, contiguity: Contiguity, run: RefRun, e: Event, moved: bool) -> bool:
        if contiguity is Contiguity.STRICT:
            return False
        if contiguity is Contiguity.PARTITION:
            return self.key(e) != self.key(self._first(run))
        if contiguity is Contiguity.SKIP_TILL_NEXT:
            return not moved
        return True

    @staticmethod
    def _first(run: RefRun) -> Event:
        return min((e for es in run.binds.values() for e in es), key=lambda e: e.seq)

    def _bind(self, run: RefRun, var: str, e: Event) -> RefRun:
        binds = {k: list(v) for k, v in run.binds.items()}
        binds.setdefault(var, []).append(e)
        return RefRun(run.pos, run.inside, binds, [])

    def _after_bind(self, k: int, run: RefRun, done: list) -> list[RefRun]:
        """``run`` just bound an event to positives[k] (begin or take)."""
        c = self.pos[k]
        last = k == len(self.pos) - 1
        if c.kind is Kind.KLEENE:
            if last and self.final_ok(k, run):
                done.append(run.binds)
            return [RefRun(k, True, run.binds, [])]
        if last:
            done.append(run.binds)
            return []
        return [RefRun(k + 1, False, run.binds, [])]

    def step(self, run: RefRun, e: Event, done: list) -> list[RefRun]:
        if self.p.window is not None and e.ts - self._first(run).ts > self.p.window:
            return []
        k = run.pos
        c = self.pos[k]
        out: list[RefRun] = []
        if not run.inside:
            b = self.begins(k, run, e)
            if b:
                out += self._after_bind(k, self._bind(run, c.var, e), done)
            if self.ignorable(c.contiguity, run, e, b):
                out.append(RefRun(k, False, run.binds, []))
            return out
        take = self.takes(k, run, e)
        ignore = self.ignorable(c.inner, run, e, take)
        if take:
            out += self._after_bind(k, self._bind(run, c.var, e), done)
        if ignore:
            out.append(RefRun(k, True, run.binds, run.ignored + [e]))
        if k + 1 < len(self.pos) and self.final_ok(k, run):
            q = self.pos[k + 1]
            moved = RefRun(k + 1, False, run.binds, [])
            if all(self.ignorable(q.contiguity, moved, x, self.begins(k + 1, moved, x)) for x in run.ignored):
                began = self.begins(k + 1, moved, e)
                if began:
                    out += self._after_bind(k + 1, self._bind(moved, q.var, e), done)
                if not take and not ignore and self.ignorable(q.contiguity, moved, e, began):
                    out.append(moved)  # the opportunistic move: q's own edges decide e
        return out

    def completions(self, events: list[Event]) -> list[dict[str, list[Event]]]:
        runs: list[RefRun] = []
        done: list[dict[str, list[Event]]] = []
        for e in events:
            nxt: list[RefRun] = []
            for r in runs:
                nxt += self.step(r, e, done)
            start = RefRun(0, False, {}, [])
            if self.begins(0, start, e):
                nxt += self._after_bind(0, self._bind(start, self.pos[0].var, e), done)
            runs = nxt
        return done

    # --- negation (docs/semantics.md §5) and output policy (docs/semantics.md §6) ---------------------------

    def violates(self, binds: dict[str, list[Event]], events: list[Event]) -> bool:
        comps = self.p.components
        for i, n in enumerate(comps):
            if n.kind is not Kind.NEGATED:
                continue
            # its neighbours are the nearest positive components (negations may stand in a row)
            before = next(binds[c.var] for c in reversed(comps[:i]) if c.kind is not Kind.NEGATED)
            after = next((binds[c.var] for c in comps[i + 1 :] if c.kind is not Kind.NEGATED), None)
            lo = max(e.seq for e in before)
            all_seqs = [e.seq for es in binds.values() for e in es]
            if after is not None:
                hi = min(e.seq for e in after)
                cand = [x for x in events if lo < x.seq < hi]
            else:
                first_ts = min(e.ts for es in binds.values() for e in es)
                cand = [x for x in events if x.seq > max(all_seqs) and x.ts <= first_ts + self.p.window]
            conjs = [c for c in self.p.where if n.var in variables(c)]
            key = self.key(min((e for es in binds.values() for e in es), key=lambda e: e.seq))
            for x in cand:
                if n.event_type is not None and x.type != n.event_type:
                    continue
                if self.p.partition_by and self.key(x) != key:
                    continue
                env = Env(binds, self.kleene, n.var, x)
                if all(holds(c, env) for c in conjs):
                    return True
        return False

    def matches(self, events: list[Event]) -> list[tuple[dict[str, list[int]], int]]:
        """(bindings as seq lists, seq of the completing event) of every match, by policy."""
        found = []
        for binds in self.completions(events):
            if self.violates(binds, events):
                continue
            seqs = {c.var: [e.seq for e in binds[c.var]] for c in self.pos}
            done_at = max(s for v in seqs.values() for s in v)
            key = self.key(min((e for es in binds.values() for e in es), key=lambda e: e.seq))
            found.append((seqs, done_at, key))
        if self.p.policy == "all":
            return [(s, d) for s, d, _ in found]
        return non_overlapping(found, [c.var for c in self.pos])


def non_overlapping(found: list[tuple[dict[str, list[int]], int, Any]], order: list[str]) -> list[tuple[dict[str, list[int]], int]]:
    """The ``non_overlapping`` policy over ``(bindings, seq of the completing event, partition)``:
    walking the completions in stream order, per partition the first match (by its sorted seqs,
    then its variables' seqs in ``order``) that starts after the last one chosen ended."""
    out = []
    cut: dict[Any, int] = {}
    for at in sorted({d for _, d, _ in found}):
        by_key: dict[Any, list] = {}
        for s, d, k in found:
            if d == at and min(min(v) for v in s.values()) > cut.get(k, -1):
                by_key.setdefault(k, []).append(s)
        for k, cands in by_key.items():
            best = min(cands, key=lambda s: (sorted(x for v in s.values() for x in v), [s[v] for v in order]))
            out.append((best, at))
            cut[k] = at
    return out
