"""Output layer: what a run shows of the engine. Sits above ``yfpp.engine`` and may import it and every
layer below.

- ``writer``: ``MatchWriter``: matches as JSON lines as they are made, flushed per match on live input.
- ``stats``: the ``--stats`` figures and the progress line.
- ``ordered``: ``yfpp run --ordered``: every match held to the end, then written in one total order.
- ``vocabulary``: types and attribute names seen; names the queries use that never occurred.
- ``explain``: the shared NFA as a graph: text, JSON, DOT, PNG (``yfpp explain``).
- ``explain_summary``: ``yfpp explain`` of a big engine: figures and the most shared nodes.
"""
