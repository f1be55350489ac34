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
from typing import Any

import networkx as nx

from yfpp.engine import Engine
from yfpp.nfa_compiler import QueryPlan
from yfpp.pattern import (
    Aggregate, And, Arith, Compare, Contiguity, Expr, Index, Length, Literal, Neg, Not, Or, Ref, XPathTest, variables,
)
from yfpp.shared_nfa import Node

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
            predicates=_predicates(users[0][0], users[0][1], names) if users else [],
            index=_index_text(node.index_key),
            queries=[str(p.name) for p, _ in users],
            accepts=[_acceptance(p) for p in node.accepts],
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


def _predicates(plan: QueryPlan, i: int, names: tuple[str, ...]) -> list[str]:
    spec = plan.specs[i]
    edges = [("", spec.begin), ("take: ", spec.take), ("final: ", spec.final)] if spec.kleene else [("", spec.begin)]
    return [prefix + expr_text(e, names) for prefix, checks in edges for e, _ in checks]


def _index_text(key: tuple | None) -> str | None:
    if key is None:
        return None
    if key[0] == "range":
        return f"{key[1]} {key[2]} {key[3]!r} (range index)"
    return f"{'@' if key[0] == 'xeq' else ''}{key[1]} = {key[2]!r} (hash index)"


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


def _accept_text(a: dict[str, Any]) -> str:
    parts = [a["query"]]
    if a["window"] is not None:
        parts.append(f"within {number_text(a['window'])}")
    parts += a["negations"]
    if a["policy"] != "all":
        parts.append(a["policy"])
    if a["emit"]:
        parts.append(f"emits {a['emit']}")
    return "; ".join(parts)


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
            return f"{var(e.var)}[{e.source}]"
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
    components = sum(len(p.specs) for p in engine.queries.values())
    nodes = g.number_of_nodes() - 1
    return {
        "queries": len(engine.queries),
        "components": components,
        "nodes": nodes,
        "shared_nodes": sum(1 for n, d in g.nodes(data=True) if n != "start" and len(d["queries"]) > 1),
        "sharing_ratio": components / nodes if nodes else 1.0,
        "states": engine.runtime.live_states,
    }


def as_text(engine: Engine, g: nx.DiGraph) -> str:
    """The trie, one node a line, indented by depth; the details of a node on the lines under it."""
    lines = []

    def walk(n: Any, depth: int) -> None:
        for child in sorted((c for c in g.successors(n) if c != n), key=str):
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
            lines.extend(f"{pad}{a['query']}: {'; '.join(a['negations'])}" for a in d["accepts"] if a["negations"])
            walk(child, depth + 1)

    walk("start", 0)
    f = sharing_figures(engine, g)
    lines.append("")
    lines.append(
        f"{f['queries']} quer{'y' if f['queries'] == 1 else 'ies'}, {f['components']} components → {f['nodes']} NFA nodes "
        f"({f['shared_nodes']} shared), sharing ratio {f['sharing_ratio']:.2f}, {f['states']} run states"
    )
    return "\n".join(lines)


def as_json(engine: Engine, g: nx.DiGraph) -> str:
    """The graph for tools: ``{"nodes": […], "edges": […], "figures": {…}}``."""
    nodes = [{"id": str(n), **d} for n, d in g.nodes(data=True)]
    edges = [{"from": str(a), "to": str(b), "label": d["label"]} for a, b, d in g.edges(data=True)]
    return json.dumps({"nodes": nodes, "edges": edges, "figures": sharing_figures(engine, g)}, indent=2, ensure_ascii=False)


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


def as_dot(g: nx.DiGraph) -> str:
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
    out.append("}")
    return "\n".join(out) + "\n"


def write_picture(g: nx.DiGraph, dot_text: str, path: Path) -> str:
    """PNG via Graphviz ``dot`` if installed, else a layered matplotlib drawing; return which (or raise)."""
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tpng", "-Gdpi=110", "-o", str(path)], input=dot_text.encode(), capture_output=True)
        if done.returncode:
            raise RuntimeError(f"Graphviz could not write {path}: {done.stderr.decode(errors='replace').strip()}")
        return "graphviz"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("a PNG needs Graphviz (apt install graphviz) or matplotlib (pip install matplotlib)") from e
    pos, layers, rows = layered_layout(g)
    lines = max(node_caption(d).count("\n") + 2 for _, d in g.nodes(data=True))
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
    ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "matplotlib"


def layered_layout(g: nx.DiGraph) -> tuple[dict[Any, tuple[float, float]], int, int]:
    """A tidy-tree layout of the trie, left to right: x is the depth, each leaf gets a row of its own
    and a node sits at the middle of its children. Also the number of layers and of rows."""
    pos: dict[Any, tuple[float, float]] = {}
    rows = 0

    def place(n: Any, depth: int) -> float:
        nonlocal rows
        children = sorted((c for c in g.successors(n) if c != n), key=str)
        if children:
            ys = [place(c, depth + 1) for c in children]
            y = (ys[0] + ys[-1]) / 2
        else:
            y = float(-rows)
            rows += 1
        pos[n] = (float(depth), y)
        return y

    place("start", 0)
    return pos, int(max(x for x, _ in pos.values())), rows
