"""State layer: checkpoints of an engine (format: docs/operations.md). Reaches the engine through the
class it is given and the engine's methods, never by importing ``yfpp.engine``. May import every layer
below it: ``yfpp.errors``, ``yfpp.input``, ``yfpp.language``, ``yfpp.nfa``, ``yfpp.runtime``,
``yfpp.sets``, ``xpath_ext``.

- ``checkpoint``: the engine's state as versioned JSON (queries as IR, runs, buffer, negation stores,
  deadlines, reorder buffer, counters), atomic writes, restore.
- ``kept_shapes``: a checkpoint's queries kept by shape, registered again with each shape's work done once.
- ``query_base``: checkpoints that write the queries once (a base file) and then what changed since.
- ``schema``: the checkpoint's JSON shape as a declarative spec, and the relations between counters.
- ``plans``: references from the checkpoint to the recompiled queries (nodes, states, slots, entries).
- ``set_checkpoint``: the set matchers' state (buffers, match windows, pending and held matches).
- ``memory_cap``: the engine's memory cap, the resident set past which registrations are refused.
"""
