"""``yfpp serve``: many subscriptions on live feeds in one long-running process (see docs/service.md).

Modules: ``config`` (settings), ``server`` (the process: engine thread, feeds,
routing), ``app`` (HTTP API), ``subscriptions``, ``sinks`` (destinations and
their queues), ``feeds``, ``mqtt`` (MQTT feed and sink), ``dashboard`` (the page at ``/``, offline ``/docs``),
``registry`` (SQLite), ``checkpoint``, ``metrics``, ``logs``, ``errors`` (what requests are refused with),
``client`` (Python client), ``cli`` (``serve``/``subscribe``/``unsubscribe``).
The server side needs ``pip install -e '.[serve]'`` in yfpp's clone; the client only the stdlib.
"""
