"""``yfpp serve``: many subscriptions on live feeds in one long-running process (see docs/service.md).

Modules: ``config`` (settings), ``server`` (the process: engine thread, feeds,
routing), ``app`` (HTTP API), ``batch`` (a batch of subscriptions in one request), ``subscriptions``, ``sinks`` (destinations and
their queues), ``sink_urls`` (the sink URLs a subscription may name), ``feeds``, ``mqtt`` (MQTT feed and sink), ``mqtt_api`` (MQTT feeds added over the API), ``dashboard`` (the page at ``/``, offline ``/docs``),
``registry`` (SQLite), ``checkpoint``, ``counts_kept`` (the subscriptions whose counts a checkpoint stores again), ``metrics``, ``logs``, ``errors`` (what requests are refused with),
``auth`` (API keys: admin, subscriber, feed; hashed), ``sink_policy`` (file sinks under one directory, network
sinks to allowed networks), ``limits`` (body caps), ``quotas`` (per-key caps, cost estimates at subscribe time),
``accounting`` (each subscription's runs and CPU), ``latency`` (each subscription's result latency), ``health`` (``/health`` on a listener of its own), ``isolation`` (heavy queries in engines of their own, in child processes), ``child_delivery`` (an isolation engine delivering its query's results to the sink itself), ``worker_engines`` (``--workers``: the queries spread over engines in child processes, each fed every event), ``client`` (Python client), ``cli``
(``serve``/``subscribe``/``unsubscribe``/``keys``).
The server side needs ``pip install -e '.[serve]'`` in yfpp's clone; the client only the stdlib.
"""
