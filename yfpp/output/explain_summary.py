"""``yfpp explain`` of a big engine: figures and the most shared nodes, not a line per node.

Computed from the shared NFA directly (no graph is built): how many queries,
query shapes, components, nodes (shared, found through an index by kind, or
whose predicates every event of their type evaluates per subscription), how
their predicates are evaluated (shared once per event, per node, per run) and
the ``top`` nodes the most queries go through, each with its path from the
root.  Time: one pass over the nodes and the queries' texts.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter
from typing import Any

from yfpp.engine import Engine
from yfpp.language.query_text import split_constants
from yfpp.nfa.shared_nfa import Node
from yfpp.output.explain import _index_text, _label, atom_figures, atom_text

LIMIT = 200  # queries beyond which ``yfpp explain`` prints this summary unless --full is given

_INDEX_KINDS = {"eq": "hash", "xeq": "hash", "xnum": "hash", "ceq": "hash", "cnum": "hash", "anyof": "hash (any of)",
                "range": "range", "xrange": "range", "interval": "interval", "prefix": "prefix"}


def summary(engine: Engine, top: int = 10) -> dict[str, Any]:
    """The figures of ``engine``'s shared NFA and its ``top`` most shared nodes."""
    nodes = list(engine.runtime.nfa.nodes())
    components = sum(len(p.nodes) for p in engine.queries.values())  # (a node per component)
    shapes = set()  # (a query without text, a Pattern built in code, is a shape of its own)
    for _, (pat, text, _) in engine.sources.kept():  # (pat: the pattern, or the plan of a query with text)
        text = text or pat.source
        shapes.add(tuple(split_constants(text)[0]) if text else id(pat))
    by_index: Counter = Counter()
    tested = 0
    for n in nodes:
        if not n.begin:
            continue
        if n.index_key is None:
            tested += 1
        else:
            by_index[_INDEX_KINDS.get(n.index_key[0], n.index_key[0])] += 1
    most = heapq.nlargest(top, nodes, key=lambda n: (n.users, -n.id))
    return {
        "queries": len(engine.queries),
        "set_queries": len(engine.set_queries),
        "shapes": len(shapes),
        "components": components,
        "nodes": len(nodes),
        "shared_nodes": sum(1 for n in nodes if n.users > 1),
        "sharing_ratio": components / len(nodes) if nodes else 1.0,
        "states": engine.runtime.live_states,
        "indexed_nodes": sum(by_index.values()),
        "indexed_by_kind": dict(sorted(by_index.items())),
        "tested_nodes": tested,
        **atom_figures(engine.runtime.nfa),
        "most_shared": [{"path": _path(n), "queries": n.users, "index": _index_text(n.index_key)} for n in most],
    }


def _path(node: Node) -> str:
    labels = []
    n: Node | None = node
    while n is not None:
        labels.append(_label(n))
        n = n.parent
    return " → ".join(reversed(labels))


def summary_text(s: dict[str, Any]) -> str:
    lines = [
        f"{s['queries']:,} quer{'y' if s['queries'] == 1 else 'ies'} of {s['shapes']:,} "
        f"shape{'' if s['shapes'] == 1 else 's'}"
        + (f", {s['set_queries']:,} event-set quer{'y' if s['set_queries'] == 1 else 'ies'}" if s["set_queries"] else "")
        + f"; {s['components']:,} components → {s['nodes']:,} NFA nodes ({s['shared_nodes']:,} shared), "
        f"sharing ratio {s['sharing_ratio']:.2f}, {s['states']:,} run states",
        f"nodes with predicates: {s['indexed_nodes']:,} found through an index"
        + (f" ({', '.join(f'{kind} {n:,}' for kind, n in s['indexed_by_kind'].items())})" if s["indexed_by_kind"] else "")
        + f", {s['tested_nodes']:,} evaluated per subscription for every event of their type",
        atom_text(s),
        f"the {len(s['most_shared'])} most shared nodes:",
    ]
    lines += [f"  {m['queries']:>9,}  {m['path']}" + (f"  index: {m['index']}" if m["index"] else "")
              for m in s["most_shared"]]
    lines.append(f"(a summary of over {LIMIT:,} queries: --full prints every node)")
    return "\n".join(lines)


def summary_json(s: dict[str, Any]) -> str:
    return json.dumps({"summary": s}, indent=2, ensure_ascii=False)
