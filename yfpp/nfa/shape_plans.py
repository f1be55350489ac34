"""One compiled plan per query shape: queries that differ only by constants share what they compile to.

A shape (``yfpp.language.query_text.Shape``: a query text with stand-ins for its constants) is compiled once,
into a :class:`ShapePlan`.  A query of the shape is made from it (:meth:`ShapePlan.plan`) without compiling the
query: its components' conjuncts that hold no constant are the shape's own (canonical expression and check, shared
by every query of the shape); a conjunct that compares the event's attribute with a constant gets the query's
constant put into its expression key (what the node signature reads), its index keys and its check
(:func:`yfpp.nfa.predicates.rebound`); any other conjunct that holds constants (an ``or``, an XPath test of several
comparisons, of a child or of a function, a condition on a Kleene iteration's first event…) is made from the shape's
canonical conjunct, its constants put in (:class:`_Remade`): its check the shape's check rebound to them
(``yfpp.nfa.rebind``) where that was found to give what compiling gives, else compiled (an XPath test from its parsed
template, not parsed again).  A shape whose constants stand anywhere else (a negated component's conjunct, RETURN, …) has no
plan: its queries compile one by one, as any query does; so do those of an engine that merges runs (the run merger
reads the canonical expressions of a registering query, which a query made from its shape's plan does not carry).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, MutableMapping
from typing import Any, Callable, Hashable

from yfpp.errors import YfppError
from yfpp.language.pattern import Expr, Pattern, XPathTest, variables
from yfpp.language.query_text import Shape, hot_objects, split_constants, substitute
from yfpp.nfa.compiler import ComponentSpec, NegationPlan, QueryPlan, compile_pattern, expr_key, key_set
from yfpp.input.events import MISSING
from yfpp.nfa.predicates import Check, Place, Scope, compile_check, constant_of, equality_key_of, rebound
from yfpp.nfa.rebind import Rebinding, same
from yfpp.nfa.rebound_keys import KeysTemplate, takes
from yfpp.nfa.shared_nfa import NOT_EQUALITY, atom_key, best_key, conjunct_keys


class ShapePlan:
    """A shape's compiled plan (its pattern's, stand-ins for constants) and how a query's constants go into it."""

    __slots__ = ("shape", "base", "template", "made", "remakes", "pairs")

    def __init__(self, shape: Shape, base: Pattern, template: QueryPlan, made: list[_SpecMaker]) -> None:
        self.shape = shape
        self.base = base  # the shape's pattern with the registration's options (policy, feedback)
        self.template = template  # compiled from it, its specs kept
        self.made = made  # per component spec, how a query's is made
        self.pairs = tuple(zip(template.compiled_specs or (), made))  # (each template spec with its maker)
        # whether a conjunct is compiled for each query (_Remade)
        self.remakes = any(type(item[0]) is _Remade for m in made for _, _, items in m.edges for item in items or ())

    @classmethod
    def make(cls, shape: Shape, base: Pattern) -> "ShapePlan | None":
        """The plan of ``shape`` whose pattern, with the options a registration gave, is ``base``; None when
        its queries must compile one by one (see the module docstring)."""
        if base.has_sets:
            return None
        try:
            template = compile_pattern(base, "")
        except YfppError:  # (the stand-ins are no constants there: each query compiles, for its own error)
            return None
        values = {_unquoted(s): s for s in shape.sentinels}
        negated = {c.var for c in base.components if not c.positive}
        outside = [e for e in base.where if variables(e) & negated]
        if base.emit is not None:
            outside += [e for _, e in base.emit.attrs]
        if hot_objects(tuple(outside), set(values), shape.sentinels, set()):
            return None
        specs = template.compiled_specs or []
        hot = hot_objects(tuple(e for s in specs for e, _ in (*s.begin, *s.take, *s.final)), set(values),
                          shape.sentinels, set())
        covered: set[str] = set()
        stand_ins = {key for key, _ in shape.keys}
        scope = Scope({f"#{s.index}": s.index for s in specs}, {f"#{s.index}" for s in specs if s.kleene},
                      {f"#{s.index}": s.agg_slots for s in specs if s.kleene})
        remaking = (shape, scope, hot, values)
        made = [_SpecMaker.make(s, hot, values, stand_ins, covered, remaking) for s in specs]
        if covered != set(values):  # (a constant the compiler kept elsewhere than in a conjunct)
            return None
        for spec in specs:  # (what each query's component is, found once: ComponentSpec.what)
            spec.what = spec.kind(template.partition_by)
        return cls(shape, base, template, made)  # type: ignore[arg-type]

    def plan(self, constants: list[str], name: str | int, text: str) -> QueryPlan:
        """The plan of the query ``text`` of this shape, whose constants (as written) are ``constants``: what
        ``compile_pattern(pattern, name)`` gives of its pattern, made without compiling (its specs carry their
        keys, ``ComponentSpec.keys``, in place of canonical expressions), the pattern itself made when asked
        (``QueryPlan.pattern``: :meth:`pattern`)."""
        t = self.template
        literals = self.shape.literals(constants)
        texts = list(zip(self.shape.sentinels, constants)) if self.remakes else ()  # (what _Remade.made reads)
        specs = [m.spec(s, literals, texts) for s, m in self.pairs]
        # (the runtime keys its negation stores by these objects)
        negations = [_copied(n) for n in t.negations] if t.negations else ()
        trailing = negations[t.negations.index(t.trailing)] if t.trailing is not None else None
        # (positional arguments, in QueryPlan's field order: name, source, compiled_specs, negations, trailing,
        # partition_by, window, policy, emit, var_names, since_tick, negation_key, last, feedback, shape)
        return QueryPlan(name, text, specs, negations, trailing, t.partition_by, t.window, t.policy, t.emit,
                         t.var_names, 0, t.negation_key, None, t.feedback, self)

    def pattern(self, text: str) -> Pattern:
        """The pattern of the query ``text`` of this shape, with the registration's options."""
        base, shape = self.base, self.shape
        pattern = shape.instance(text, split_constants(text)[1])
        if (base.policy, base.feedback) != (pattern.policy, pattern.feedback):
            pattern = dataclasses.replace(pattern, policy=base.policy, feedback=base.feedback)
        return pattern


class _SpecMaker:
    """How a query's component spec is made from the template's: per edge (begin, take, final) the template's
    conjuncts and key, or where a conjunct holds a constant what to remake; the begin conjuncts' index keys."""

    __slots__ = ("edges", "found", "best", "atom", "keys", "one", "shared")

    def __init__(self, edges: tuple, found: list[tuple[tuple, tuple]], best: int | None, atom: bool,
                 keys: tuple | None) -> None:
        # per edge: (the template's conjuncts, their key_set, None) where none holds a constant, else (None, None,
        # items): per conjunct (None, check, key), or for one holding a constant ((type, value) of its stand-in, the
        # check, (the key before it, (XPath text, the stand-in as written) or None, the key after it)), or for one
        # whose check no rebound check takes (its _Remade, None, None)
        self.edges = edges
        # the index keys of the begin conjuncts, each with where it holds stand-ins: ((position, (type, value)), …);
        # for a conjunct remade (its _Remade, None): its keys are those of its expression made for the query
        self.found = found
        self.best = best  # which of them best_key picks whatever the constants (None: it must look at them)
        self.atom = atom  # the begin condition is one string equality: its index key is its key (atom_key)
        self.keys = keys  # ComponentSpec.keys when no conjunct holds a constant, else None
        self.shared: ComponentSpec | None = None  # then the spec of every query, made at the first
        # the commonest case, made without the loops of spec: the begin condition is one string equality holding a
        # constant, its index key picked whatever the constants, no constant on take or final; then the stand-in's
        # (type, value), the template's check, where the query's index key is its check too that key's class and
        # its first two items (EqualityKey, AttributeEquality: equality_key_of) as one triple, else None, and the
        # take and final edges' keys
        begin, take, final = (items for _, _, items in edges)
        self.one = None
        if atom and best is not None and begin is not None and type(begin[0][0]) is tuple and take is None \
                and final is None:
            literal, check = begin[0][:2]
            key, at = found[best]
            keyed = equality_key_of(check)
            self.one = (literal, check, (keyed[0], *keyed[1]) if keyed is not None and key[:2] == keyed[1]
                        and at == ((2, literal),) else None, edges[1][1], edges[2][1])

    @classmethod
    def make(cls, spec: ComponentSpec, hot: set[int], sentinels: dict[str, str], stand_ins: set[tuple],
             covered: set[str], remaking: tuple) -> "_SpecMaker":
        """How to make a query's spec from the template's ``spec``.  ``sentinels``: each stand-in's value (as text)
        and how it is written; ``stand_ins``: each one's literal value as ``(type, value)``; the values of those
        found go into ``covered``; ``remaking``: what :meth:`_Remade.make` takes after a conjunct and its place."""
        me = f"#{spec.index}"
        edges: list[tuple] = []
        remade: dict[int, _Remade] = {}  # by the template's check (a Kleene's first and later iterations share one)
        for edge, conjuncts in enumerate((spec.begin, spec.take, spec.final)):
            if not any(id(e) in hot for e, _ in conjuncts):
                edges.append((conjuncts, key_set([expr_key(e) for e, _ in conjuncts]), None))
                continue
            out: list[tuple] = []
            for e, check in conjuncts:
                key = expr_key(e)
                if id(e) not in hot:
                    out.append((None, check, key))
                    continue
                value = constant_of(check, e)
                parts = key.split(repr(e.source) if isinstance(e, XPathTest) else repr(value))
                if value is MISSING or str(value) not in sentinels or len(parts) != 2:
                    mode = "bound" if edge == 2 else "iter" if spec.kleene else "event"
                    if id(check) not in remade:
                        remade[id(check)] = _Remade.make(e, check, Place(me, mode), *remaking)
                    covered.update(remade[id(check)].values)
                    out.append((remade[id(check)], None, None))
                    continue
                covered.add(str(value))
                source = (e.source, sentinels[str(value)]) if isinstance(e, XPathTest) else None
                out.append(((type(value), value), check, (parts[0], source, parts[1])))
            edges.append((None, None, tuple(out)))
        found: list[tuple] = []
        for e, check in spec.begin:
            if id(check) in remade:
                found.append((remade[id(check)], None))
                continue
            found += [(k, tuple((i, (type(x), x)) for i, x in enumerate(k) if (type(x), x) in stand_ins)
                       if id(e) in hot else ()) for k in conjunct_keys(e, me)]
        atom = len(spec.begin) == 1 and atom_key(spec.begin[0][0], me) is not None
        keys = None
        if all(items is None for _, _, items in edges):
            best = best_key([k for k, _ in found])
            keys = (best if atom else edges[0][1], edges[1][1], edges[2][1], best)
        fixed = None if any(at is None for _, at in found) else _fixed_best([k for k, _ in found])
        return cls(tuple(edges), found, fixed, atom, keys)

    def spec(self, s: ComponentSpec, literals: dict, texts: list[tuple[str, str]]) -> ComponentSpec:
        """The component spec of the query whose constants are ``literals`` (and as written, after the stand-in
        as written, ``texts``), the template's being ``s``."""
        if self.keys is not None:  # (no constant: one spec, one node signature for every query of the shape)
            shared = self.shared
            if shared is None:
                shared = self.shared = ComponentSpec(s.index, s.var, s.event_type, s.kleene, s.contiguity, s.inner,
                                                     s.begin, s.take, s.final, s.agg_slots, s.keep_events, self.keys,
                                                     s.what)
                shared.shared_signature = shared.signature(s.what[6], None)  # type: ignore[index]
            return shared
        if self.one is not None:
            literal, check, keyed, take_key, final_key = self.one
            if keyed is not None:
                key_type, kind, attr = keyed
                best = key_type((kind, attr, literals[literal]))
                begin = ((None, best),)
            else:
                best = _put(*self.found[self.best], literals)  # type: ignore[index]
                begin = ((None, rebound(check, literals[literal])),)
            return ComponentSpec(s.index, s.var, s.event_type, s.kleene, s.contiguity, s.inner, begin, s.take,
                                 s.final, s.agg_slots, s.keep_events, (best, take_key, final_key, best), s.what)
        lists, keys = [], []
        remade: dict[_Remade, _Made] = {}  # (a Kleene's first and later iterations share a check)
        for edge, (conjuncts, fixed_key, items) in enumerate(self.edges):
            atom = self.atom and not edge  # (the begin edge's key is its index key, below)
            if items is None:
                lists.append(conjuncts)
                keys.append(fixed_key)
                continue
            made, made_keys = [], []
            for literal, check, key in items:
                if literal is None:
                    made.append((None, check))
                    made_keys.append(key)
                    continue
                if type(literal) is _Remade:
                    if literal not in remade:
                        remade[literal] = literal.made(literals, texts)
                    conjunct = remade[literal]
                    made.append((None, conjunct.check))
                    if not atom:
                        made_keys.append(conjunct.key())
                    continue
                value = literals[literal]
                made.append((None, rebound(check, value)))
                if atom:
                    continue
                before, source, after = key
                if source is None:
                    made_keys.append(before + repr(value) + after)
                else:  # (an XPath test: its text, the stand-in as written replaced by the constant)
                    text, written = source
                    made_keys.append(before + repr(text.replace(written, written[0] + value + written[0])) + after)
            lists.append(tuple(made))
            keys.append(None if atom else key_set(made_keys))
        if self.best is not None:
            best = _put(*self.found[self.best], literals)
        else:
            found: list[tuple] = []
            for k, at in self.found:
                if at is None:  # (a conjunct remade: the keys of its expression)
                    found += remade[k].found(f"#{s.index}")
                else:
                    found.append(_put(k, at, literals))
            best = best_key(found)
        if self.atom:
            first = self.found[0][0]
            keys[0] = remade[first].atom(f"#{s.index}") if type(first) is _Remade else best
        return ComponentSpec(s.index, s.var, s.event_type, s.kleene, s.contiguity, s.inner, lists[0], lists[1],
                             lists[2], s.agg_slots, s.keep_events, (keys[0], keys[1], keys[2], best), s.what)


class _Remade:
    """How a conjunct holding constants is made for a query when its check is no comparison that
    :func:`yfpp.nfa.predicates.rebound` remakes (an ``or``, an XPath test of several comparisons or of a function,
    a condition on a Kleene iteration's first event…): its canonical expression with the query's constants put in,
    its check the template's rebound to them (:class:`yfpp.nfa.rebind.Rebinding`, where probes found that to give
    what compiling gives) or else compiled alone — what compiling the whole query gives of it — its key and index
    keys read from that expression; an XPath test is compiled from its parsed template (``TestTemplate``), not
    parsed again."""

    __slots__ = ("expr", "hot", "place", "scope", "template", "values", "positions", "recent", "check", "numbers",
                 "keys")

    def __init__(self, expr: Expr, hot: set[int], place: Place, scope: Scope, template: Any, values: set[str],
                 positions: tuple[int, ...]) -> None:
        self.expr = expr  # the template's canonical conjunct
        self.hot = hot  # the ids of its objects that hold stand-ins (what substitute rebuilds)
        self.place = place  # where its check runs, its variables by position (#i)
        self.scope = scope  # the shape's, its variables by position
        self.template = template  # its XPath test's TestTemplate, or None
        self.values = values  # the stand-ins' values (as text) it holds
        self.positions = positions  # where those stand in the shape's constants
        # the conjuncts made for the last constants met (as written, at ``positions``): a threshold or a level that
        # many subscriptions of a shape share is compiled once (at most RECENT kept, the oldest dropped first)
        self.recent: dict[tuple[str, ...], _Made] = {}
        # how a query's check is the template's rebound to its constants (yfpp.nfa.rebind), else None (compiled)
        self.check: Rebinding | None = None
        # where an XPath number stands among the shape's constants (its stand-in is a text), and its stand-in as
        # the integer the compiled check holds
        self.numbers: tuple[tuple[int, int], ...] = ()
        # how its keys are made for a query's constants without making its expression, where that was found to give
        # what reading the expression gives (with its check rebound), else None
        self.keys: KeysTemplate | None = None

    @classmethod
    def make(cls, expr: Expr, check: Check, place: Place, shape: Shape, scope: Scope, hot: set[int],
             sentinels: dict[str, str]) -> _Remade:
        """How to remake ``expr`` (checked at ``place``, compiled to ``check``) for a query of ``shape``;
        ``sentinels``: each stand-in's value (as text) and how it is written."""
        values = set()
        for value, written in sentinels.items():
            if hot_objects(expr, {value}, [written], set()):
                values.add(value)
        positions = tuple(i for i, written in enumerate(shape.sentinels) if _unquoted(written) in values)
        template = None
        if isinstance(expr, XPathTest) and expr.var == place.current and place.mode == "event":
            from xpath_ext.xpath_predicates import TestTemplate

            stand_ins: dict[Any, Any] = {}
            for (kind, value), quoted in shape.keys:
                if quoted:
                    stand_ins[value] = (kind, value)
                elif kind is str and value.isdigit():  # (an XPath number: its text)
                    stand_ins[int(value)] = (kind, value)
            template = TestTemplate(expr.source, expr.namespaces, stand_ins)
            if len(template.slots) != sum(expr.source.count(w) for w in shape.sentinels):
                template = None  # (a stand-in it cannot put a constant into: a decimal; parsed per query)
        remake = cls(expr, hot, place, scope, template, values, positions)
        remake.check = remake._rebinding(check, shape)
        if remake.check is not None:
            remake.keys = remake._keys_template(shape)
        return remake

    def _rebinding(self, check: Check, shape: Shape) -> Rebinding | None:
        """How to rebind ``check`` to a query's constants, when that gives what compiling its conjunct gives (found
        on probe constants: each a text or an integer, a decimal is not rebound, of other lengths than the
        stand-ins'); else None."""
        if any(kind not in (str, int) or not (quoted or str(value).isdigit())
               for (kind, value), quoted in (shape.keys[i] for i in self.positions)):
            return None
        self.numbers = tuple((i, int(shape.keys[i][0][1])) for i in self.positions
                             if shape.keys[i][0][0] is str and not shape.keys[i][1])
        try:
            rebinding = Rebinding(check, {*(k for k, _ in shape.keys), *((int, n) for _, n in self.numbers)},
                                  list(shape.sentinels))
        except RecursionError:  # (objects that hold each other: not rebound)
            return None
        for text, number in _PROBES:
            constants = [s[0] + text + s[0] if quoted else str(number) for s, (_, quoted) in
                         zip(shape.sentinels, shape.keys)]
            literals, texts = shape.literals(constants), list(zip(shape.sentinels, constants))
            try:
                compiled = self._compiled(literals, texts)[1]
            except YfppError:
                return None
            if not same(self._rebound(rebinding, literals, texts), compiled):
                return None
        return rebinding

    def _keys_template(self, shape: Shape) -> KeysTemplate | None:
        """How its keys are made for a query's constants, found on probe constants (distinct, in both orders: an
        ``or``'s index key keeps its values in order, one each)."""
        numbers = dict(self.numbers)
        stand_ins = [(shape.keys[i][0], numbers.get(i)) for i in self.positions]
        n, probes = len(shape.keys), []
        for probe in range(2):
            constants = [s[0] + (f"p{i}" if probe == 0 else f"zq-{n - i}") + s[0] if quoted
                         else str(7 + i if probe == 0 else 12345 - i)
                         for i, (s, (_, quoted)) in enumerate(zip(shape.sentinels, shape.keys))]
            literals = shape.literals(constants)
            probes.append((literals, substitute(self.expr, literals, list(zip(shape.sentinels, constants)), self.hot)))
        return KeysTemplate.make(self.expr, self.place.current, stand_ins, probes)  # type: ignore[arg-type]

    def _rebound(self, rebinding: Rebinding, literals: dict, texts: list[tuple[str, str]]) -> Check:
        """The check ``rebinding`` makes for the constants ``literals`` (as written: ``texts``), an XPath number's as
        an integer."""
        if self.numbers:
            literals = dict(literals)
            for i, stand_in in self.numbers:
                literals[(int, stand_in)] = int(texts[i][1])
        return rebinding.made(literals, texts)

    def made(self, literals: dict, texts: list[tuple[str, str]]) -> _Made:
        """The query's conjunct, its check and what is read of it, its constants being ``literals`` (as written:
        ``texts``); the same object for the same constants as written (they make the same conjunct)."""
        constants = tuple([texts[i][1] for i in self.positions])
        recent = self.recent
        made = recent.get(constants)
        if made is not None:
            return made
        if self.check is not None and all(map(_plain, constants)):
            check = self._rebound(self.check, literals, texts)
            if self.keys is not None and takes(constants):
                made = _Made(None, check, self.keys, literals)
            else:
                made = _Made(substitute(self.expr, literals, texts, self.hot), check)
        else:
            made = _Made(*self._compiled(literals, texts))
        if len(recent) >= RECENT:
            del recent[next(iter(recent))]
        recent[constants] = made
        return made

    def _compiled(self, literals: dict, texts: list[tuple[str, str]]) -> tuple[Expr, Check]:
        """The query's conjunct and its check compiled, its constants being ``literals`` (as written: ``texts``)."""
        expr = substitute(self.expr, literals, texts, self.hot)
        template = self.template
        if template is None:
            return expr, compile_check(expr, self.place, self.scope)
        return expr, compile_check(expr, self.place, self.scope, lambda source, _: template.test(literals, source))


#: how many conjuncts made for distinct constants a :class:`_Remade` keeps, to give again
RECENT = 64
#: the constants a :class:`_Remade` is made for to find whether rebinding its check gives what compiling gives:
#: (a text's, an integer's); other lengths and characters than the stand-ins' and each other's
_PROBES = (("p", 7), ("qr7-x", 12345))


#: a constant (as written) whose check is rebound: an integer (ASCII digits), or a text holding no quote (an XPath
#: text doubles one) and no stand-in's mark
_PLAIN = re.compile("[0-9]+|'[^'\"\ue000\ue001]*'|\"[^'\"\ue000\ue001]*\"")


def _plain(constant: str) -> bool:
    """Is ``constant`` (as written) one whose check is rebound (:data:`_PLAIN`)?"""
    return _PLAIN.fullmatch(constant) is not None


class _Made:
    """A conjunct made for a query's constants (:meth:`_Remade.made`): its expression, its check, and what the
    plan reads of the expression (its key, its index keys, its atom key), each read once — or, with no expression,
    made from its shape's keys (``keys``, the constants ``literals`` put in)."""

    __slots__ = ("expr", "check", "keys", "literals", "_key", "_found", "_atom")

    def __init__(self, expr: Expr | None, check: Check, keys: KeysTemplate | None = None,
                 literals: dict | None = None) -> None:
        self.expr = expr
        self.check = check
        self.keys = keys
        self.literals = literals
        self._key: str | None = None
        self._found: list[tuple] | None = None
        self._atom: Any = _MISSING

    def key(self) -> str:
        """:func:`yfpp.nfa.compiler.expr_key` of the expression."""
        if self._key is None:
            keys = self.keys
            self._key = expr_key(self.expr) if keys is None else keys.key_of(self.literals)  # type: ignore[arg-type]
        return self._key

    def found(self, me: str) -> list[tuple]:
        """Its index keys as a begin conjunct of component ``me`` (:func:`yfpp.nfa.shared_nfa.conjunct_keys`)."""
        if self._found is None:
            keys = self.keys
            self._found = conjunct_keys(self.expr, me) if keys is None else keys.found_of(self.literals)  # type: ignore[arg-type]
        return self._found

    def atom(self, me: str) -> tuple | None:
        """:func:`yfpp.nfa.shared_nfa.atom_key` of the expression as a begin conjunct of component ``me``."""
        if self._atom is _MISSING:
            keys = self.keys
            self._atom = atom_key(self.expr, me) if keys is None else keys.atom_of(self.literals)  # type: ignore[arg-type]
        return self._atom


def _unquoted(written: str) -> str:
    """A stand-in's value as text, from how it is written (a quoted string's quotes dropped)."""
    return written[1:-1] if written[0] in "'\"" else written


def _copied(n: NegationPlan) -> NegationPlan:
    """A shallow copy of ``n`` (``copy.copy``'s, without its reduce protocol; by position, in NegationPlan's field
    order: no call per field)."""
    return NegationPlan(n.var, n.event_type, n.self_preds, n.cross_preds, n.lower, n.upper, n.signature,
                        n.check_signature)


def _fixed_best(found: list[tuple]) -> int | None:
    """Which of the index keys ``found`` :func:`yfpp.nfa.shared_nfa.best_key` picks whatever their constants
    (the only one, or the first equality), else None (it weighs constants: lists, prefixes, bounds)."""
    if len(found) < 2:
        return 0 if found else None
    return next((i for i, k in enumerate(found) if k[0] not in NOT_EQUALITY), None)


def _put(key: tuple | None, at: tuple, literals: dict) -> tuple | None:
    """Index key ``key`` of the template with a query's constants (``literals``) at the positions ``at``."""
    if not at:
        return key
    out = list(key)  # type: ignore[arg-type]
    for i, stand_in in at:
        out[i] = literals[stand_in]
    return tuple(out)


class ShapePlans:
    """The plans of the shapes met, by shape and the registration's options (at most ``max_plans``, the oldest
    dropped first)."""

    def __init__(self, usable: Callable[[Pattern], bool], max_plans: int = 4096) -> None:
        self.usable = usable  # whether a pattern is one for the shared NFA (else its shape has no plan)
        self.max_plans = max_plans
        self._plans: dict[Hashable, ShapePlan | None] = {}

    def get(self, shape: Shape, policy: str | None, feedback: bool) -> ShapePlan | None:
        """The plan of ``shape`` registered with ``policy`` (None: the query's own) and ``feedback`` (True: its
        result events go back into the stream), as ``Engine.register`` takes them; None when it has none."""
        key = (shape, policy, feedback)
        plans = self._plans
        splan = plans.get(key, _MISSING)
        if splan is _MISSING:
            splan = None
            base = shape.pattern
            try:
                if policy is not None and policy != base.policy:
                    base = dataclasses.replace(base, policy=policy).validate()
                if feedback and not base.feedback:
                    base = dataclasses.replace(base, feedback=True).validate()
            except YfppError:  # (each query is refused with its own error)
                base = None
            if base is not None and self.usable(base):
                splan = ShapePlan.make(shape, base)
            if len(plans) >= self.max_plans:
                plans.pop(next(iter(plans)))
            plans[key] = splan
        return splan


class QuerySources(MutableMapping):
    """``Engine.sources``: each query's ``(pattern, text, name)`` by id.  A query made from its shape's plan keeps
    just that plan (its text and name are the plan's), and its pattern is made when asked (``QueryPlan.pattern``);
    :meth:`kept` gives what is kept, for what reads only text, name, policy and feedback."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Pattern | QueryPlan, str | None, str | int | None] | QueryPlan] = {}
        self.version = 0  #: raised by every change: what reads the queries again only once they changed

    def __getitem__(self, qid: int) -> tuple[Pattern, str | None, str | int | None]:
        first, text, name = _source(self._kept[qid])
        return (first.pattern if type(first) is QueryPlan else first), text, name  # type: ignore[return-value]

    def __setitem__(self, qid: int, source: tuple[Pattern | QueryPlan, str | None, str | int | None]) -> None:
        first, text, name = source
        made = (type(first) is QueryPlan and first.shape is not None and first.source is text
                and first.name == (qid if name is None else name))
        self._kept[qid] = first if made else source  # type: ignore[assignment]
        self.version += 1

    def keep_planned(self, qid: int, plan: QueryPlan) -> None:
        """Keep query ``qid`` made from its shape's plan: ``plan``, whose text and name (or ``qid``) are its own (what
        ``self[qid] = (plan, plan.source, name)`` keeps, without asking)."""
        self._kept[qid] = plan
        self.version += 1

    def __delitem__(self, qid: int) -> None:
        del self._kept[qid]
        self.version += 1

    def __contains__(self, qid: object) -> bool:
        return qid in self._kept

    def __iter__(self) -> Iterator[int]:
        return iter(self._kept)

    def __len__(self) -> int:
        return len(self._kept)

    def text(self, qid: int) -> str | None:
        """Query ``qid``'s text (None: it was registered as a Pattern), without making its pattern."""
        return _source(self._kept[qid])[1]

    def entries(self) -> dict[int, object]:
        """Each query's entry by id, to compare by identity (an entry is replaced, never changed; read only)."""
        return self._kept

    def kept_of(self, qid: int) -> tuple[Pattern | QueryPlan, str | None, str | int | None]:
        """Query ``qid``'s ``(pattern or plan, text, name)``, as :meth:`kept` gives it."""
        return _source(self._kept[qid])

    def kept(self) -> Iterator[tuple[int, tuple[Pattern | QueryPlan, str | None, str | int | None]]]:
        """``(id, (pattern or the query's plan, text, name))`` of each query: both have ``policy`` and
        ``feedback``; a plan stands only for a query with text."""
        for qid, kept in self._kept.items():
            yield qid, _source(kept)


def _source(kept: tuple | QueryPlan) -> tuple[Pattern | QueryPlan, str | None, str | int | None]:
    """What :class:`QuerySources` keeps of a query as ``(pattern or plan, text, name)``."""
    if type(kept) is not QueryPlan:
        return kept  # type: ignore[return-value]
    name = kept.name
    return kept, kept.source, (name if type(name) is str else None)  # type: ignore[return-value]


_MISSING: Any = object()
