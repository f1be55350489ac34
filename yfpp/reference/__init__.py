"""Reference layer: deliberately simple evaluators, for tests and benchmarks only. Shares nothing with the
engine but the pattern IR: may import ``yfpp.errors``, ``yfpp.input``, ``yfpp.language``,
``yfpp.runtime.match_id`` and ``xpath_ext``.

- ``evaluator``: the explicit-runs oracle of docs/semantics.md §2–5.
- ``sets``: Definition 2 read literally for set patterns.
- ``oracle``: ``reference_matches`` (either kind of pattern) and ``reference_feedback`` (every prefix re-evaluated).
- ``backtrack``: the SIGMOD §5.3 backtrack baseline, for the benchmark comparison.
"""
