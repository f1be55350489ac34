"""``yfpp explain``: the shared NFA as a networkx graph, as text, JSON, DOT and a picture.

A graph node is a node of the shared NFA (plus ``start``); its data says what a
run there tests (type, Kleene, equivalence list, the predicates placed on it and
the one the transition table indexes) and, for accepting nodes, what each
query ending there checks on its own (window, negations, policy, RETURN).
Predicates are printed with the variable names of the first query through the
node (queries share a node when their predicates agree up to renaming).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any, Iterator

import networkx as nx

from yfpp.engine import Engine
from yfpp.nfa.compiler import QueryPlan
from yfpp.language.pattern import (
    Aggregate, And, Arith, Compare, Contiguity, Expr, Index, Length, Literal, Neg, Not, Or, Ref, XPathTest, variables,
)
from yfpp.nfa.predicates import reads_event_only
from yfpp.nfa.shared_atoms import is_shared
from yfpp.nfa.shared_nfa import Node, SharedNFA, accepting

AXIS = {
    Contiguity.STRICT: "/",
    Contiguity.PARTITION: "/ (partition)",
    Contiguity.SKIP_TILL_NEXT: "next",
    Contiguity.SKIP_TILL_ANY: "//",
}


# --- the graph ------------------------------------------------------------------------------


def nfa_graph(engine: Engine) -> nx.DiGraph:
    """The shared NFA: node ``start`` and one node per NFA node, edges parent → child (and Kleene loops)."""
    g = nx.DiGraph()
    through: dict[int, list[tuple[QueryPlan, int]]] = {}
    for plan in engine.queries.values():
        for i, node in enumerate(plan.nodes):
            through.setdefault(node.id, []).append((plan, i))
    g.add_node("start", label="start", type=None, kleene=False, partition_by=[], window=None, predicates=[],
               index=None, queries=[], accepts=[])
    specs_of: dict[QueryPlan, list] = {}  # (a registered plan's specs are compiled again when asked: once here)
    for node in engine.runtime.nfa.nodes():
        users = through.get(node.id, [])
        names = users[0][0].var_names if users else ()
        g.add_node(
            node.id,
            label=_label(node),
            type=node.event_type,
            kleene=node.kleene,
            partition_by=list(node.partition_by),
            window=node.window,
            predicates=_predicates(specs_of, users[0][0], users[0][1], names, node) if users else [],
            index=_index_text(node.index_key),
            queries=[str(p.name) for p, _ in users],
            accepts=[_acceptance(p) for p in accepting(node)],
        )
        parent = "start" if node.parent is None else node.parent.id
        g.add_edge(parent, node.id, label="" if node.parent is None else AXIS[node.contiguity])
        if node.kleene:
            g.add_edge(node.id, node.id, label=f"take ({AXIS[node.inner]})")
    return g


def _label(node: Node) -> str:
    text = f"{node.event_type or '*'}{'+' if node.kleene else ''}"
    if node.partition_by:
        text += f" [{','.join(node.partition_by)}]"
    return text


def _predicates(specs_of: dict[QueryPlan, list], plan: QueryPlan, i: int, names: tuple[str, ...], node: Node) -> list[str]:
    """The predicates of ``node`` (its component ``i`` of ``plan``), those it shares with other nodes marked."""
    specs = specs_of.get(plan)
    if specs is None:
        specs = specs_of[plan] = plan.specs
    spec = specs[i]
    edges = [("", spec.begin, node.begin), ("take: ", spec.take, node.take), ("final: ", spec.final, ())] \
        if spec.kleene else [("", spec.begin, node.begin)]
    out = []
    for prefix, checks, held in edges:
        shared = [is_shared(c) for c in held] if len(held) == len(checks) else [False] * len(checks)
        out += [prefix + expr_text(e, names) + ("  (shared: once per event)" if s else "")
                for (e, _), s in zip(checks, shared)]
    return out


def atom_figures(nfa: SharedNFA) -> dict[str, int]:
    """How the checks of the nodes' events are evaluated: ``shared_atoms`` predicates evaluated once per event for
    the ``shared_checks`` node checks that hold them (``yfpp.nfa.shared_atoms``); ``event_checks`` that read the
    event alone, evaluated per node an event reaches; ``run_checks`` that read what a run has bound (or a general
    XPath test), evaluated per run."""
    shared = event = run = 0
    for n in nfa.nodes():
        for checks in (n.begin, n.take):
            for c in checks:
                if is_shared(c):
                    shared += 1
                elif reads_event_only(c):
                    event += 1
                else:
                    run += 1
    return {"shared_atoms": len(nfa.atoms.atoms), "shared_checks": shared, "event_checks": event, "run_checks": run}


def atom_text(f: dict[str, int]) -> str:
    """The line of :func:`atom_figures`."""
    return (f"predicates: {f['shared_atoms']:,} shared, each evaluated once per event for its "
            f"{f['shared_checks']:,} node checks; {f['event_checks']:,} of the event alone evaluated per node an "
            f"event reaches; {f['run_checks']:,} per run (they read what the run has bound, or are XPath tests other "
            f"than @a op literal)")


def _index_text(key: tuple | None) -> str | None:
    if key is None:
        return None
    if key[0] == "range":
        return f"{key[1]} {key[2]} {key[3]!r} (range index)"
    if key[0] == "xrange":
        _, source, name, op, bound = key
        return f"{'@' if source == 'xnum' else ''}{name} {op} {bound!r} (range index{'' if source == 'xnum' else ' of child elements'})"
    if key[0] == "interval":
        _, source, name, lo, lo_in, hi, hi_in = key
        name = f"{'@' if source == 'xnum' else ''}{name}"
        return (f"{lo!r} {'<=' if lo_in else '<'} {name} {'<=' if hi_in else '<'} {hi!r} "
                f"(interval index{' of child elements' if source == 'cnum' else ''})")
    if key[0] == "prefix":
        _, kind, name, prefix = key
        return (f"starts-with({'@' if kind == 'xeq' else ''}{name}, {prefix!r}) "
                f"(prefix index{' of child elements' if kind == 'ceq' else ''})")
    if key[0] == "anyof":
        first = key[1][0]
        name = first[1] if first[0] == "eq" else f"{'@' if first[0] in ('xeq', 'xnum') else ''}{first[1]}"
        return (f"{name} in ({', '.join(repr(k[2]) for k in key[1])}) "
                f"(hash index, {len(key[1])} keys{' of child elements' if first[0] in ('ceq', 'cnum') else ''})")
    if key[0] in ("ceq", "cnum"):
        return f"{key[1]} = {key[2]!r} (hash index of child elements)"
    return f"{'@' if key[0] in ('xeq', 'xnum') else ''}{key[1]} = {key[2]!r} (hash index)"


def _acceptance(plan: QueryPlan) -> dict[str, Any]:
    """What query ``plan`` checks on its own when a run reaches its last node."""
    p = plan.pattern
    positives = [c.var for c in p.positives]
    negations = []
    for neg in plan.negations:  # (the trailing one among them)
        preds = [expr_text(e) for e in p.where if neg.var in variables(e)]
        where = f"between {positives[neg.lower]} and {positives[neg.upper]}" if neg.upper is not None else f"after {positives[neg.lower]}"
        negations.append(f"no {neg.event_type or 'event'} {where}" + (f" with {' and '.join(preds)}" if preds else ""))
    return {
        "query": str(plan.name),
        "window": plan.window,
        "negations": negations,
        "policy": plan.policy,
        "emit": plan.emit[0] if plan.emit else None,
    }


def number_text(v: float) -> str:
    """A number as written back: integers in full (``100000000000000000000``, a window of ``31536000``), other
    floats exactly (``0.1``, ``1e+300``), never rounded to six digits."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        return str(int(v))
    return repr(v)


def _accept_checks(a: dict[str, Any], node_window: float | None = None) -> list[str]:
    """What an accepting query checks alone, as text: ``within W`` (unless it is ``node_window``), its
    negations, its policy (unless ``all``), ``emits T``."""
    parts = []
    if a["window"] is not None and a["window"] != node_window:
        parts.append(f"within {number_text(a['window'])}")
    parts += a["negations"]
    if a["policy"] != "all":
        parts.append(a["policy"])
    if a["emit"]:
        parts.append(f"emits {a['emit']}")
    return parts


def _accept_text(a: dict[str, Any]) -> str:
    return "; ".join([a["query"], *_accept_checks(a)])


def set_queries(engine: Engine) -> list[dict[str, str]]:
    """The event-set queries (not part of the shared NFA: each has a matcher of its own), name and text."""
    return [{"query": str(m.plan.name), "pattern": m.plan.pattern.source or ""} for m in engine.set_queries.values()]


def _set_text(q: dict[str, str]) -> str:
    return f"{q['query']}: event-set query, evaluated by its own matcher (docs/event_sets.md)"


# --- expressions as text ----------------------------------------------------------------------


def expr_text(e: Expr, names: tuple[str, ...] = ()) -> str:
    """A predicate in SASE+ notation; canonical variables ``#i`` are shown as ``names[i]``."""

    def var(v: str) -> str:
        if v.startswith("#") and v[1:].isdigit() and int(v[1:]) < len(names):
            return names[int(v[1:])]
        return v

    def ref(r: Ref) -> str:
        index = {Index.EACH: "", Index.FIRST: "[1]", Index.PREV: "[i-1]", Index.LAST: f"[{var(r.var)}.len]"}[r.index]
        return f"{var(r.var)}{index}.{r.attr}"

    def show(e: Expr, outer: bool = True) -> str:
        if isinstance(e, Literal):
            return repr(e.value) if isinstance(e.value, str) else str(e.value).lower() if isinstance(e.value, bool) else number_text(e.value)
        if isinstance(e, Ref):
            return ref(e)
        if isinstance(e, Length):
            return f"{var(e.var)}.len"
        if isinstance(e, Aggregate):
            return f"{e.func}({var(e.var)}[..{'i-1' if e.upto_prev else ''}].{e.attr})"
        if isinstance(e, XPathTest):
            from xpath_ext.xpath_predicates import by_elementpath  # (elementpath loaded only for XPath queries)

            slow = " (by elementpath: tens of µs per event)" if by_elementpath(e.source, e.namespaces) else ""
            return f"{var(e.var)}[{e.source}]{slow}"
        if isinstance(e, Neg):
            return f"-{show(e.operand, False)}"
        if isinstance(e, Not):
            return f"NOT {show(e.operand, False)}"
        if isinstance(e, (Arith, Compare)):
            text = f"{show(e.left, False)} {e.op} {show(e.right, False)}"
        elif isinstance(e, (And, Or)):
            text = f" {'AND' if isinstance(e, And) else 'OR'} ".join(show(o, False) for o in e.operands)
        else:
            return repr(e)
        return text if outer else f"({text})"

    return show(e)


# --- text and JSON ----------------------------------------------------------------------------


def sharing_figures(engine: Engine, g: nx.DiGraph) -> dict[str, float]:
    """Figures of the shared NFA (``queries``: those in it; ``set_queries``: the event-set queries beside it)."""
    components = sum(len(p.nodes) for p in engine.queries.values())  # (a node per component)
    nodes = g.number_of_nodes() - 1
    nfa = list(engine.runtime.nfa.nodes())
    return {
        "queries": len(engine.queries),
        "set_queries": len(engine.set_queries),
        "components": components,
        "nodes": nodes,
        "shared_nodes": sum(1 for n, d in g.nodes(data=True) if n != "start" and len(d["queries"]) > 1),
        "sharing_ratio": components / nodes if nodes else 1.0,
        "states": engine.runtime.live_states,
        # nodes whose begin predicates an event can fail: found through an index, or tested by every event of the type
        "indexed_nodes": sum(1 for n in nfa if n.begin and n.index_key is not None),
        "tested_nodes": sum(1 for n in nfa if n.begin and n.index_key is None),
        **atom_figures(engine.runtime.nfa),
    }


def _children(g: nx.DiGraph, n: Any) -> list[Any]:
    return sorted((c for c in g.successors(n) if c != n), key=str)


def _preorder(g: nx.DiGraph) -> Iterator[tuple[Any, Any, int]]:
    """(parent, node, depth) of every node below ``start``, depth first in the order of :func:`_children`
    (a loop, not recursion: a query may have thousands of components)."""
    stack = [("start", c, 0) for c in reversed(_children(g, "start"))]
    while stack:
        parent, n, depth = stack.pop()
        yield parent, n, depth
        stack.extend((n, c, depth + 1) for c in reversed(_children(g, n)))


def as_text(engine: Engine, g: nx.DiGraph) -> str:
    """The trie, one node a line, indented by depth; the details of a node on the lines under it: its
    predicates, its index, and what each query ending there checks alone. Event-set queries follow."""
    lines = []
    for n, child, depth in _preorder(g):
        d = g.nodes[child]
        edge = g.edges[n, child]["label"]
        loop = g.edges[child, child]["label"] if g.has_edge(child, child) else ""
        share = f"  shared by {len(d['queries'])}" if len(d["queries"]) > 1 else ""
        acc = f"  accepts {', '.join(a['query'] for a in d['accepts'])}" if d["accepts"] else ""
        win = f"  window {number_text(d['window'])}" if d["window"] is not None else ""
        lines.append(f"{'  ' * depth}{edge + ' ' if edge else ''}{d['label']}{' ⟲ ' + loop if loop else ''}{win}{share}{acc}")
        pad = "  " * depth + "    "
        lines.extend(f"{pad}where {p}" for p in d["predicates"])
        if d["index"]:
            lines.append(f"{pad}index {d['index']}")
        for a in d["accepts"]:
            checks = _accept_checks(a, d["window"])
            if checks:
                lines.append(f"{pad}{a['query']}: {'; '.join(checks)}")
    f = sharing_figures(engine, g)
    lines.append("")
    lines.append(
        f"{f['queries']} quer{'y' if f['queries'] == 1 else 'ies'}, {f['components']} components → {f['nodes']} NFA nodes "
        f"({f['shared_nodes']} shared), sharing ratio {f['sharing_ratio']:.2f}, {f['states']} run states"
    )
    if f["indexed_nodes"] or f["tested_nodes"]:
        lines.append(f"nodes with predicates: {f['indexed_nodes']} found through an index, {f['tested_nodes']} "
                     f"evaluated for every event of their type")
        lines.append(atom_text(f))
    lines.extend(_set_text(q) for q in set_queries(engine))
    return "\n".join(lines)


def as_json(engine: Engine, g: nx.DiGraph) -> str:
    """The graph for tools: ``{"nodes": […], "edges": […], "set_queries": […], "figures": {…}}``."""
    nodes = [{"id": str(n), **d} for n, d in g.nodes(data=True)]
    edges = [{"from": str(a), "to": str(b), "label": d["label"]} for a, b, d in g.edges(data=True)]
    return json.dumps({"nodes": nodes, "edges": edges, "set_queries": set_queries(engine),
                       "figures": sharing_figures(engine, g)}, indent=2, ensure_ascii=False)


# --- DOT and pictures -------------------------------------------------------------------------


def _dot_string(s: object) -> str:
    """A DOT string literal; a newline in ``s`` becomes DOT's line break."""
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def node_caption(d: dict[str, Any]) -> str:
    """The multi-line caption of a node in pictures: label, window, predicates, index, acceptances."""
    lines = [d["label"]]
    if d["window"] is not None:
        lines.append(f"window {number_text(d['window'])}")
    lines += d["predicates"]
    if d["index"]:
        lines.append(f"index {d['index']}")
    for a in d["accepts"]:
        lines += textwrap.wrap(f"→ {_accept_text(a)}", 48, subsequent_indent="   ")
    return "\n".join(lines)


def set_caption(q: dict[str, str]) -> str:
    """The caption of an event-set query's box in pictures (beside the shared NFA)."""
    return "\n".join([f"{q['query']}: event-set query", "(its own matcher)", *textwrap.wrap(q["pattern"], 48)])


def as_dot(g: nx.DiGraph, sets: list[dict[str, str]] = ()) -> str:
    q = _dot_string
    out = [
        "digraph yfpp {",
        "  rankdir=LR; nodesep=0.25; ranksep=0.5;",
        '  node [shape=box, style="rounded,filled", fillcolor="#dbe9f6", fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    for n, d in g.nodes(data=True):
        if n == "start":
            out.append(f"  {q(n)} [label={q('')}, shape=point, width=0.15];")
            continue
        fill = ', fillcolor="#f7d774", peripheries=2' if d["accepts"] else ""
        out.append(f"  {q(n)} [label={q(node_caption(d))}{fill}];")
    for a, b, d in g.edges(data=True):
        out.append(f"  {q(a)} -> {q(b)} [label={q(d['label'])}];")
    for i, s in enumerate(sets):
        out.append(f"  {q(f'set {i}')} [label={q(set_caption(s))}, shape=note, fillcolor=\"#e4f2d9\"];")
    out.append("}")
    return "\n".join(out) + "\n"


MAX_DRAWN_NODES = 501  # the matplotlib drawing's (start included): a wider picture is no longer readable


def write_picture(g: nx.DiGraph, dot_text: str, path: Path, sets: list[dict[str, str]] = ()) -> str:
    """PNG at ``path`` via Graphviz ``dot`` if installed, else a layered matplotlib drawing (the event-set
    queries ``sets`` as boxes under it); return which (or raise RuntimeError)."""
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tpng", "-Gdpi=110", "-o", str(path)], input=dot_text.encode(), capture_output=True)
        if done.returncode:
            raise RuntimeError(f"Graphviz could not write {path}: {done.stderr.decode(errors='replace').strip()}")
        return "graphviz"
    if g.number_of_nodes() > MAX_DRAWN_NODES:
        raise RuntimeError(f"{g.number_of_nodes() - 1} NFA nodes are too many to draw with matplotlib (at most "
                           f"{MAX_DRAWN_NODES - 1}): install Graphviz (apt install graphviz) or write --dot")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("a PNG needs Graphviz (apt install graphviz) or matplotlib (pip install matplotlib)") from e
    pos, layers, rows = layered_layout(g)
    captions = [set_caption(s) for s in sets]
    lines = max(text.count("\n") + 2 for text in [*(node_caption(d) for _, d in g.nodes(data=True)), *captions])
    rows += len(captions)
    fig, ax = plt.subplots(figsize=(3.4 * (layers + 1), max(3.0, 0.16 * lines * rows)))
    plain = nx.DiGraph((a, b, d) for a, b, d in g.edges(data=True) if a != b)
    nx.draw_networkx_edges(plain, pos, ax=ax, arrows=True, arrowsize=12, node_size=2500, edge_color="#777")
    nx.draw_networkx_edge_labels(plain, pos, ax=ax, edge_labels={(a, b): d["label"] for a, b, d in plain.edges(data=True)}, font_size=7)
    for n, d in g.nodes(data=True):
        x, y = pos[n]
        if n == "start":
            ax.plot([x], [y], "ko", markersize=5)
            continue
        text = node_caption(d) + ("\n⟲ " + g.edges[n, n]["label"] if g.has_edge(n, n) else "")
        ax.text(x, y, text, ha="center", va="center", fontsize=7,
                bbox={"boxstyle": "round", "fc": "#f7d774" if d["accepts"] else "#dbe9f6", "ec": "#555"})
    for i, text in enumerate(captions):  # the rows under the trie's
        ax.text(0.0, float(len(captions) - rows - i), text, ha="left", va="center", fontsize=7,
                bbox={"boxstyle": "square", "fc": "#e4f2d9", "ec": "#555"})
    ax.set_xlim(-0.5, layers + 0.5)
    ax.set_ylim(0.5 - rows, 0.5)
    ax.set_axis_off()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, format="png")
    except (OSError, ValueError) as e:
        raise RuntimeError(f"could not write {path}: {e}") from e
    finally:
        plt.close(fig)
    return "matplotlib"


def layered_layout(g: nx.DiGraph) -> tuple[dict[Any, tuple[float, float]], int, int]:
    """A tidy-tree layout of the trie, left to right: x is the depth, each leaf gets a row of its own
    and a node sits at the middle of its children. Also the number of layers and of rows."""
    order = [("start", 0), *((n, depth + 1) for _, n, depth in _preorder(g))]
    pos: dict[Any, tuple[float, float]] = {}
    rows = 0
    for n, depth in order:  # leaves take rows in depth-first order
        if not _children(g, n):
            pos[n] = (float(depth), float(-rows))
            rows += 1
    for n, depth in reversed(order):  # then each parent, after its children, between its first and last
        if n not in pos:
            children = _children(g, n)
            pos[n] = (float(depth), (pos[children[0]][1] + pos[children[-1]][1]) / 2)
    return pos, int(max(x for x, _ in pos.values())), rows
