"""Event-set layer: set patterns (docs/event_sets.md; Cadonna, Gamper, Böhlen, "Efficient event pattern
matching with match windows", Definitions 1–6), matched beside the shared NFA. May import ``yfpp.errors``,
``yfpp.input``, ``yfpp.language``, ``yfpp.nfa``, ``yfpp.runtime`` and ``xpath_ext``.

A set pattern ``⟨B1, …, Bk⟩`` with duration τ matches per Definition 2: each variable binds one event (a
Kleene variable one or more, in stream order), no event twice, every event of ``Bi`` before every event of
``Bi+1``, the WHERE conjuncts hold for every combination of bound events, and all events lie within τ. The
Engine hands every event to one matcher per set query after the runtime gave it its stream position.

- ``plan``: ``compile_sets`` → ``SetPlan``: sets, conditions, partition attributes (Definition 6).
- ``search``: the matcher A, every substitution binding a given first or last event; accept test; match dicts.
- ``matcher``: what both matchers share: caps (``Limits``), held and pending matches, chunked emission.
- ``direct``: ``DirectMatcher``: an event that can end a match searches its partition at once.
- ``match_window``: ``MatchWindowMatcher``: the paper's filter, partition, match windows and summary
  statistics (Definition 5, Theorems 2–3), searching only candidate windows.
- ``strategies``: ``set_matcher``, the matcher of a set query for its evaluation strategy.

Both strategies return exactly the same matches (tests/sets/test_event_sets.py).
"""
