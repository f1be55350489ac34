"""NFA layer: one query's plan and the shared NFA of all queries. May import ``yfpp.errors``,
``yfpp.input``, ``yfpp.language`` and ``xpath_ext``.

- ``check_objects``: the checks and getters of compiled conjuncts as slotted objects (``AND``/``OR``/``NOT``, a
  picked value against a constant): one object the cyclic collector tracks where a closure is several.
- ``compiler``: a query's NFA^b plan, the paper's steps as passes (structure, predicate placement,
  negations); each component spec carries its sharing signature.
- ``predicates``: expression trees → checks ``f(ev, vec)`` (closures and slotted objects) (docs/semantics.md §4), Kleene state with
  incremental aggregates.
- ``rebind``: a shape's compiled check made again for a query's constants: the objects holding a stand-in copied
  with the constant, the rest shared, without compiling.
- ``rebound_keys``: a remade conjunct's expression key, index keys and atom key made from its shape's, the query's
  constants put where the stand-ins stand, without making its expression.
- ``shape_plans``: one compiled plan per query shape; a query that differs from it only by constants is made
  from it, its constants put into the canonical expressions and attribute comparisons, without compiling.
- ``shared_atoms``: predicates of the event alone that several nodes hold, evaluated once per event for them all.
- ``shared_nfa``: all plans merged into a trie of nodes (YFilter); wait/in states; transition tables by type
  with equality (hash) and range (sorted) indexes; live add and remove.
"""
