"""``yfpp explain``: the shared NFA as a networkx graph, as text, DOT and a picture."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import networkx as nx

from yfpp.engine import Engine
from yfpp.pattern import Contiguity
from yfpp.shared_nfa import Node

AXIS = {
    Contiguity.STRICT: "/",
    Contiguity.PARTITION: "/ (partition)",
    Contiguity.SKIP_TILL_NEXT: "next",
    Contiguity.SKIP_TILL_ANY: "//",
}


def nfa_graph(engine: Engine) -> nx.DiGraph:
    """Nodes of the shared NFA (attributes: label, queries through it, accepting queries) and edges."""
    g = nx.DiGraph()
    queries_through: dict[int, list[str]] = {}
    for plan in engine.queries.values():
        for node in plan.nodes:
            queries_through.setdefault(node.id, []).append(plan.name)
    g.add_node("start", label="start", queries=[], accepts=[])
    for node in engine.runtime.nfa.nodes():
        g.add_node(
            node.id,
            label=_label(node),
            queries=queries_through.get(node.id, []),
            accepts=[p.name for p in node.accepts],
            window=node.window,
        )
        parent = "start" if node.parent is None else node.parent.id
        g.add_edge(parent, node.id, label="" if node.parent is None else AXIS[node.contiguity])
        if node.kleene:
            g.add_edge(node.id, node.id, label=f"take ({AXIS[node.inner]})")
    return g


def _label(node: Node) -> str:
    preds = len(node.begin) + len(node.take) + len(node.final)
    text = f"{node.event_type or '*'}{'+' if node.kleene else ''}"
    if node.partition_by:
        text += f" [{','.join(node.partition_by)}]"
    if preds:
        text += f" ({preds} pred{'s' if preds > 1 else ''})"
    return text


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
    lines = []

    def walk(n, depth: int) -> None:
        for child in sorted((c for c in g.successors(n) if c != n), key=str):
            d = g.nodes[child]
            edge = g.edges[n, child]["label"]
            loop = g.edges[child, child]["label"] if g.has_edge(child, child) else ""
            share = f"  shared by {len(d['queries'])}" if len(d["queries"]) > 1 else ""
            acc = f"  accepts {', '.join(d['accepts'])}" if d["accepts"] else ""
            win = f"  window {d['window']:g}" if d["window"] is not None else ""
            lines.append(f"{'  ' * depth}{edge + ' ' if edge else ''}{d['label']}{' ⟲ ' + loop if loop else ''}{win}{share}{acc}")
            walk(child, depth + 1)

    walk("start", 0)
    f = sharing_figures(engine, g)
    lines.append("")
    lines.append(
        f"{f['queries']} queries, {f['components']} components → {f['nodes']} NFA nodes "
        f"({f['shared_nodes']} shared), sharing ratio {f['sharing_ratio']:.2f}, {f['states']} run states"
    )
    return "\n".join(lines)


def as_dot(g: nx.DiGraph) -> str:
    def q(s: object) -> str:
        return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'

    out = ["digraph yfpp {", "  rankdir=LR;", '  node [shape=circle, fontname="Helvetica"];']
    for n, d in g.nodes(data=True):
        label = d["label"] + (("\\n→ " + ", ".join(d["accepts"])) if d["accepts"] else "")
        shape = "doublecircle" if d["accepts"] else ("point" if n == "start" else "circle")
        out.append(f"  {q(n)} [label={q(label) if n != 'start' else q('')}, shape={shape}];")
    for a, b, d in g.edges(data=True):
        out.append(f"  {q(a)} -> {q(b)} [label={q(d['label'])}];")
    out.append("}")
    return "\n".join(out) + "\n"


def write_picture(g: nx.DiGraph, dot_text: str, path: Path) -> str:
    """PNG via Graphviz ``dot`` if installed, else matplotlib; return which (or raise)."""
    if shutil.which("dot"):
        subprocess.run(["dot", "-Tpng", "-o", str(path)], input=dot_text.encode(), check=True)
        return "graphviz"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("a PNG needs Graphviz (apt install graphviz) or matplotlib (pip install matplotlib)") from e
    layers = {n: 0 for n in g}
    for n in nx.topological_sort(nx.DiGraph((a, b) for a, b in g.edges if a != b)):
        for c in g.successors(n):
            if c != n:
                layers[c] = max(layers[c], layers[n] + 1)
    nx.set_node_attributes(g, layers, "layer")
    pos = nx.multipartite_layout(g, subset_key="layer")
    fig, ax = plt.subplots(figsize=(max(6, 2 * max(layers.values(), default=1)), 1 + 0.6 * len(g)))
    colors = ["#f4c542" if d["accepts"] else "#9cc3e6" for _, d in g.nodes(data=True)]
    labels = {n: d["label"] + ("\n→ " + ", ".join(d["accepts"]) if d["accepts"] else "") for n, d in g.nodes(data=True)}
    nx.draw_networkx(g, pos, ax=ax, labels=labels, node_color=colors, node_size=900, font_size=8)
    nx.draw_networkx_edge_labels(g, pos, ax=ax, edge_labels={(a, b): d["label"] for a, b, d in g.edges(data=True)}, font_size=7)
    ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return "matplotlib"
