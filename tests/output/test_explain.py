"""``yfpp explain``: text, JSON and DOT of the shared NFA; pictures with and without Graphviz."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from yfpp.output import explain
from yfpp.cli import build_engine, main

ROOT = Path(__file__).resolve().parents[2]
QUERIES = [
    "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] AND c.door = 'D1' AND b.lane > 2 WITHIN 12 hours",
    "PATTERN SEQ(stock+ a[], stock b) WHERE [symbol] AND a[i].price > avg(a[..i-1].price) AND b.volume < 80% * a[a.len].volume WITHIN 1 hour",
    "[tag_id]//shelf[@zone='Z1']//exit",
]


def test_text_shows_predicates_indexes_windows_negations(capsys):
    assert main(["explain", *sum((["-q", q] for q in QUERIES), [])]) == 0
    out = capsys.readouterr().out
    assert "next exit [tag_id]  window 43200  accepts q" in out
    assert "where c.door = 'D1'" in out and "index door = 'D1' (hash index)" in out
    assert "q: no register between a and c with b.lane > 2" in out
    assert "stock+ [symbol] ⟲ take (next)  window 3600" in out
    assert "where take: a.price > avg(a[..i-1].price)" in out
    assert "where b.volume < (0.8 * a[a.len].volume)" in out
    assert "where e1[@zone='Z1']" in out and "index @zone = 'Z1' (hash index)" in out


def test_xpath_predicates_outside_the_fast_path_are_marked(capsys):
    assert main(["explain", "-q", "//shelf[tag_id = 7 and starts-with(@zone, 'Z')]//exit[contains(name(), 'x')]"]) == 0
    out = capsys.readouterr().out
    assert "where e1[tag_id = 7 and starts-with(@zone, 'Z')]\n" in out
    assert "where e2[contains(name(), 'x')] (by elementpath: tens of µs per event)\n" in out


def test_numbers_are_shown_as_written_not_rounded(capsys):
    query = "PATTERN SEQ(a x, b y) WHERE x.v = 100000000000000000000 AND y.w > 1.2345678 AND y.z < 1e300 WITHIN 365 days"
    assert main(["explain", "-q", query]) == 0
    out = capsys.readouterr().out
    assert "where x.v = 100000000000000000000" in out and "where y.w > 1.2345678" in out
    assert "where y.z < 1e+300" in out and "window 31536000" in out


def test_json_is_the_graph_for_tools(capsys):
    assert main(["explain", "-q", str(ROOT / "queries/sharing.xpe"), "--format", "json"]) == 0
    g = json.loads(capsys.readouterr().out)
    assert g["figures"]["nodes"] == 9 and g["figures"]["queries"] == 8
    assert len(g["nodes"]) == 10 and len(g["edges"]) == 9
    accepting = {a["query"]: a for n in g["nodes"] for a in n["accepts"]}
    assert sorted(accepting) == [f"q{i}" for i in range(1, 9)]
    assert accepting["q3"]["negations"] == ["no b between e1 and e2"]
    first = next(n for n in g["nodes"] if n["id"] == next(e["to"] for e in g["edges"] if e["from"] == "start"))
    assert first["type"] == "a" and first["partition_by"] == ["id"] and len(first["queries"]) == 8


def test_dot_labels_have_real_line_breaks(tmp_path):
    g = explain.nfa_graph(build_engine(QUERIES))
    dot = explain.as_dot(g)
    assert "\\\\n" not in dot  # the old bug: the line break escaped twice
    assert '\\n→ q; within 43200; no register' in dot
    assert dot.count("->") == g.number_of_edges()


def test_picture_without_graphviz_uses_a_layered_matplotlib_drawing(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="the fallback drawing needs matplotlib")
    monkeypatch.setattr(explain.shutil, "which", lambda name: None)
    g = explain.nfa_graph(build_engine([str(ROOT / "queries/negations.xpe"), str(ROOT / "queries/stock_templates.sase")]))
    assert 20 <= g.number_of_nodes() <= 50
    path = tmp_path / "nfa.png"
    assert explain.write_picture(g, explain.as_dot(g), path) == "matplotlib"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pos, layers, rows = explain.layered_layout(g)
    assert layers == max(len(p.nodes) for p in build_engine([str(ROOT / "queries/negations.xpe")]).queries.values())
    for a, b in g.edges:  # children to the right of their parent
        assert a == b or pos[b][0] == pos[a][0] + 1


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_picture_with_graphviz(tmp_path, capsys):
    path = tmp_path / "nfa.png"
    assert main(["explain", "-q", str(ROOT / "queries/sharing.xpe"), "--png", str(path)]) == 0
    assert "with graphviz" in capsys.readouterr().err and path.read_bytes()[:4] == b"\x89PNG"


def test_a_trailing_negation_is_listed_once(capsys):
    assert main(["explain", "-q", "PATTERN SEQ(shelf a, ~exit b) WITHIN 5"]) == 0
    assert "q: no exit after a\n" in capsys.readouterr().out


def test_a_long_query_is_explained_without_recursion(capsys, monkeypatch):
    """A query of thousands of steps (the limit is 10,000 components) walks the trie in a loop."""
    query = "//a" * 3000
    assert main(["explain", "-q", query]) == 0
    out = capsys.readouterr().out
    assert out.count("// a") == 2999 and "3000 components → 3000 NFA nodes" in out
    g = explain.nfa_graph(build_engine([query]))
    pos, layers, rows = explain.layered_layout(g)
    assert layers == 3000 and rows == 1 and len(pos) == 3001


def test_text_lists_what_each_accepting_query_checks_alone(capsys):
    queries = ["[id]&&//a//b&&(10)", "[id]&&//a//b&&(20)",
               "PATTERN SEQ(a x, b y) WHERE [id] WITHIN 20 OUTPUT non_overlapping RETURN z(v = x.v)"]
    assert main(["explain", *sum((["-q", q] for q in queries), [])]) == 0
    out = capsys.readouterr().out
    assert "accepts q, q2\n      q: within 10\n" in out  # q2's window is the node's: nothing of its own
    assert "q3: non_overlapping; emits z" in out


def test_event_set_queries_are_shown_beside_the_nfa_in_every_format(tmp_path, capsys, monkeypatch):
    queries = ["-q", "[PID]//{C, P+}//B(15 days)", "-q", "//a//b"]
    assert main(["explain", *queries, "--format", "json"]) == 0
    g = json.loads(capsys.readouterr().out)
    assert g["set_queries"] == [{"query": "q", "pattern": "[PID]//{C, P+}//B(15 days)"}]
    assert g["figures"]["set_queries"] == 1 and g["figures"]["queries"] == 1
    assert main(["explain", *queries, "--format", "dot"]) == 0
    assert '"set 0" [label="q: event-set query\\n(its own matcher)\\n[PID]//{C, P+}//B(15 days)", shape=note' in capsys.readouterr().out
    pytest.importorskip("matplotlib", reason="the fallback drawing needs matplotlib")
    monkeypatch.setattr(explain.shutil, "which", lambda name: None)
    assert main(["explain", *queries, "--png", str(tmp_path / "nfa.png")]) == 0
    assert (tmp_path / "nfa.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("name", ["nfa.svg", "nfa", "dir/"])
def test_png_must_name_a_png_file(tmp_path, capsys, name):
    assert main(["explain", "-q", "//a//b", "--png", str(tmp_path / name)]) == 2
    assert capsys.readouterr().err == (f"yfpp: error: --png writes a PNG file: give a file name ending in .png, not "
                                       f"{str(tmp_path / name)!r}\n")
    assert list(tmp_path.iterdir()) == []


def test_too_large_a_picture_for_matplotlib_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(explain.shutil, "which", lambda name: None)
    g = explain.nfa_graph(build_engine(["//a" * 601]))
    with pytest.raises(RuntimeError, match="601 NFA nodes are too many to draw with matplotlib"):
        explain.write_picture(g, explain.as_dot(g), tmp_path / "nfa.png")


def test_explain_counts_the_nodes_found_through_an_index_and_those_every_event_tests():
    from yfpp.engine import Engine
    from yfpp.output.explain import as_text, nfa_graph, sharing_figures

    eng = Engine()
    eng.register("[k]&&//a[@x='1' and @y > 2]//b[@y > 3 or @z = 1]")
    eng.register("PATTERN SEQ(a e, b f) WHERE e.x >= 1 AND e.x < 5")
    g = nfa_graph(eng)
    figures = sharing_figures(eng, g)
    assert (figures["indexed_nodes"], figures["tested_nodes"]) == (2, 1)
    assert as_text(eng, g).splitlines()[-2] == \
        "nodes with predicates: 2 found through an index, 1 evaluated for every event of their type"


def test_explain_says_which_predicates_are_shared_once_per_event_and_which_are_evaluated_per_node_or_run():
    from yfpp.engine import Engine
    from yfpp.output.explain import as_text, nfa_graph, sharing_figures

    eng = Engine()
    for j in range(3):  # one device's alerts: found together through the hash index on device
        eng.register(f"PATTERN SEQ(reading r, alarm x) WHERE r.device = 'U1' AND r.celsius > 30 AND r.sensor = 'S{j}' "
                     f"AND x.level > r.celsius")
    eng.register("PATTERN SEQ(reading r) WHERE r.device = 'U2' AND r.celsius > 30")  # alone under its key
    g = nfa_graph(eng)
    f = sharing_figures(eng, g)
    assert (f["shared_atoms"], f["shared_checks"], f["event_checks"], f["run_checks"]) == (2, 6, 5, 3)
    text = as_text(eng, g)
    assert text.count("where r.celsius > 30  (shared: once per event)") == 3
    assert text.count("where r.sensor = 'S1'\n") == 1 and "x.level > r.celsius  (shared" not in text
    assert text.splitlines()[-1] == ("predicates: 2 shared, each evaluated once per event for its 6 node checks; 5 of "
                                     "the event alone evaluated per node an event reaches; 3 per run (they read what "
                                     "the run has bound, or are XPath tests other than @a op literal)")


def subscriptions_file(tmp_path: Path, n: int) -> Path:
    """``n`` subscriptions of two templates (constants varying) and one plain query, in a .sase file."""
    lines = []
    for j in range(n):
        lines += [f"@query s{j}",
                  f"PATTERN SEQ(shelf a, exit c) WHERE [tag_id] AND a.zone = 'Z{j % 50}' AND c.door = 'D{j}' WITHIN 1 hour"
                  if j % 2 else f"PATTERN SEQ(reading r) WHERE r.device = 'U{j}' AND r.celsius > {j % 30}"]
    lines += ["@query all_shelves", "PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 1 hour"]
    path = tmp_path / "subs.sase"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_big_engine_is_explained_by_figures_and_its_most_shared_nodes(tmp_path, capsys):
    path = subscriptions_file(tmp_path, 400)
    assert main(["explain", "-q", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 + 10 + 1  # not a line per node
    assert out[0].startswith("401 queries of 3 shapes; 602 components → ")
    assert "found through an index (hash 425)" in out[1]  # (200 devices, 25 zones, 200 doors) and ", 0 evaluated per subscription" in out[1]
    assert out[2].startswith("predicates: 0 shared, each evaluated once per event for its 0 node checks; ")
    assert out[3] == "the 10 most shared nodes:"
    shelf = [line for line in out[4:14] if line.endswith("shelf [tag_id]  index: zone = 'Z1' (hash index)")]
    assert len(shelf) == 1 and shelf[0].split()[0] == "8"  # s1, s51, s101 … s351: Z1's 8 of the shelf queries
    assert main(["explain", "-q", str(path), "--format", "json"]) == 0
    s = json.loads(capsys.readouterr().out)["summary"]
    assert (s["queries"], s["shapes"], s["tested_nodes"], len(s["most_shared"])) == (401, 3, 0, 10)
    assert s["indexed_by_kind"] == {"hash": 425}
    assert s["most_shared"][0]["queries"] >= s["most_shared"][-1]["queries"]
    assert main(["explain", "-q", str(path), "--full"]) == 0  # every node when asked
    full = capsys.readouterr().out
    assert full.count("\n") > 1000 and "401 queries, 602 components" in full


def test_the_summary_counts_what_is_evaluated_per_subscription():
    from yfpp.engine import Engine
    from yfpp.output.explain_summary import summary, summary_text

    eng = Engine()
    for j in range(5):
        eng.register(f"//reading[contains(@sensor, 'S{j}')]//alarm[@level = {j}]")
    s = summary(eng, top=2)
    assert (s["queries"], s["shapes"], s["tested_nodes"], s["indexed_by_kind"]) == (5, 1, 5, {"hash": 5})
    assert [m["queries"] for m in s["most_shared"]] == [1, 1]
    assert "5 evaluated per subscription for every event of their type" in summary_text(s)
