"""Runtime layer: runs over the shared NFA, event by event. May import ``yfpp.errors``, ``yfpp.input``,
``yfpp.language``, ``yfpp.nfa`` and ``xpath_ext`` (docs/internals.md tells how it works).

- ``runtime``: ``Runtime``: runs by key and state, registration, a route per event type, housekeeping,
  deadlines; its mixins ``dispatch`` (the per-event handlers a route names, undo of a raising event),
  ``moves`` (begin, take, ignore, proceed) and ``acceptance`` (per-query checks where queries accept,
  building a match).
- ``runs``: ``Run`` and ``FullRun``, counters, partition keys.
- ``match_buffer``: the shared versioned buffer (Dewey-labelled predecessor pointers).
- ``negation_store``: negation candidates by class and key, the "between" check at acceptance.
- ``deadlines``: matches of queries ending in a negation, held until their deadline.
- ``policies``: what each selection policy emits among one event's matches.
- ``pruning``: the sweep of runs past their window and of buffers below the oldest live run.
- ``caps``: caps on live runs and buffered events (shed the oldest).
- ``run_merging``: equivalent runs stored and stepped as one (``Engine(merge_runs=True)``).
- ``match_id``: ``match_id(query, bindings, start, end)``, the same in every run and on Spark.
- ``feedback``: result events of feedback queries back into the stream, in order, within loop guards.
"""
