"""``yfpp serve``, ``yfpp subscribe`` and ``yfpp unsubscribe`` (server libraries imported only by ``serve``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any

from yfpp.errors import YfppError
from yfpp.language.query_text import load_queries
from yfpp.service.config import LOG_LEVELS, ServiceConfig

SERVE_EXAMPLES = """\
examples:
  yfpp serve --jsonl-port 9001 --xml-port 9002
  yfpp serve --config service.toml
  yfpp serve --port 8765 --jsonl-port 9001 --max-delay 5 --advance-idle 2 --state /var/lib/yfpp
  yfpp serve --mqtt mqtt://127.0.0.1:1883 --mqtt-topic 'sensors/{site}/{sensor}'
"""

SUBSCRIBE_EXAMPLES = """\
examples:
  yfpp subscribe --server http://127.0.0.1:8765 -q queries/shoplifting.sase --sink tcp://127.0.0.1:9000
  yfpp subscribe -q "[tag_id]&&//shelf//exit&&(1 hour)" --name exits --sink file:/tmp/exits.jsonl
  yfpp unsubscribe --server http://127.0.0.1:8765 s1
"""

DEFAULT_SERVER = "http://127.0.0.1:8765"


def add_parsers(sub: Any) -> None:
    """Add ``serve``, ``subscribe`` and ``unsubscribe`` to the ``yfpp`` parser's subparsers."""
    fmt = argparse.RawDescriptionHelpFormatter
    s = sub.add_parser("serve", help="run the subscription service (HTTP API, TCP feeds, per-subscription sinks)",
                       description="One long-running engine: subscriptions over HTTP, events from TCP feeds, files or "
                                   "POST /events, each subscription's results to its own sink. See docs/service.md. "
                                   "Needs pip install -e '.[serve]' in yfpp's clone.",
                       epilog=SERVE_EXAMPLES, formatter_class=fmt)
    s.add_argument("--config", metavar="FILE", help="TOML file of settings (keys as the options, with _); flags win")
    s.add_argument("--host", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, help="HTTP port (default 8765; 0: any free port)")
    s.add_argument("--xml-port", type=int, help="TCP port for XML feeds")
    s.add_argument("--jsonl-port", type=int, help="TCP port for JSON-lines feeds")
    s.add_argument("-i", "--input", dest="inputs", action="append", metavar="FILE",
                   help="also read this file (or - for stdin) once at start; repeatable")
    s.add_argument("--format", dest="input_format", choices=["xml", "jsonl"], help="format of --input")
    s.add_argument("--ts-field", help="timestamp field name (default ts)")
    s.add_argument("--ts-unit", help="timestamp unit: s, ms, us, ns, min, h (default s); a query window written "
                                     "without a unit is in it too")
    s.add_argument("--ts-format", choices=["number", "iso"], help="timestamps are numbers in --ts-unit (default), "
                                                                  "or ISO-8601 text")
    s.add_argument("--type-field", metavar="NAME", help="the event type is this JSON field / XML attribute or leaf "
                                                        "child (default: JSON 'type', XML element name)")
    s.add_argument("--mqtt", metavar="URL", help="MQTT broker to read from (and the sinks' credentials): "
                                                 "mqtt(s)://[USER@]HOST[:PORT][/TOPIC][?qos=1&client_id=…&clean=0&"
                                                 "format=…]; password in $YFPP_MQTT_PASSWORD or password_file=PATH")
    s.add_argument("--mqtt-topic", dest="mqtt_topics", action="append", metavar="FILTER",
                   help="topic filter to subscribe to, repeatable; {name} levels become attributes: "
                        "'sensors/{site}/{sensor}'")
    s.add_argument("--max-delay", type=float, help="reorder buffer merging the feeds, in seconds (default 0)")
    s.add_argument("--advance-idle", type=float, metavar="SECONDS",
                   help="when no event came for this long, advance stream time with the wall clock")
    s.add_argument("--state", metavar="DIR", help="directory of the subscription registry and checkpoint "
                                                  "(default ./yfpp-state)")
    s.add_argument("--no-state", action="store_true", help="keep nothing on disk")
    s.add_argument("--registry-lost", action="store_true", default=None,
                   help="start although the subscription registry is empty or missing beside a checkpoint that holds "
                        "queries (else refused): the checkpoint's queries and partial matches are dropped")
    s.add_argument("--checkpoint-every", type=float, metavar="SECONDS", help="engine checkpoint period (default 60)")
    s.add_argument("--dead-letters", metavar="FILE", help="write dead letters here (default stderr)")
    s.add_argument("--token", help="bearer token required by the API (default: $YFPP_TOKEN, else none)")
    s.add_argument("--max-subscriptions", type=int, help="default 10000")
    s.add_argument("--max-query-chars", type=int, help="default 65536")
    s.add_argument("--max-body-bytes", type=int, help="largest POST /events body (default 16777216)")
    s.add_argument("--max-feed-connections", type=int, help="TCP feed connections at once, per port (default 64)")
    s.add_argument("--queue-size", type=int, help="default per-subscription result queue (default 10000)")
    s.add_argument("--subscription-metrics", action=argparse.BooleanOptionalAction,
                   help="series per subscription in GET /metrics (default); --no-subscription-metrics: totals only, "
                        "for many subscriptions")
    s.add_argument("--log-level", choices=LOG_LEVELS, help="default info")
    s.set_defaults(func=cmd_serve)

    for name, helptext in (("subscribe", "add a subscription to a running 'yfpp serve'"),
                           ("unsubscribe", "remove a subscription from a running 'yfpp serve'")):
        p = sub.add_parser(name, help=helptext, description=helptext[0].upper() + helptext[1:] + ".",
                           epilog=SUBSCRIBE_EXAMPLES, formatter_class=fmt)
        p.add_argument("--server", default=os.environ.get("YFPP_SERVER", DEFAULT_SERVER),
                       help=f"service URL (default $YFPP_SERVER, else {DEFAULT_SERVER})")
        p.add_argument("--token", default=os.environ.get("YFPP_TOKEN"), help="bearer token (default $YFPP_TOKEN)")
        if name == "unsubscribe":
            p.add_argument("ids", nargs="+", metavar="ID", help="subscription id(s), as printed by 'yfpp subscribe'")
            p.set_defaults(func=cmd_unsubscribe)
            continue
        p.add_argument("-q", "--query", required=True, metavar="QUERY_OR_FILE",
                       help="query text or a query file (a file of several @query blocks subscribes each)")
        p.add_argument("--sink", help="tcp://HOST:PORT, http(s)://URL (webhook), mqtt(s)://HOST:PORT/TOPIC or file:PATH "
                                      "(default: none, read GET /subscriptions/ID/matches)")
        p.add_argument("--name", help="query name in the results (default: from the file, else the id)")
        p.add_argument("--format", choices=["json", "xml"], help="one JSON line (default) or one XML element per result")
        p.add_argument("--policy", choices=["all", "non_overlapping"])
        p.add_argument("--queue", type=int, help="results queued for the sink before overflow")
        p.add_argument("--overflow", choices=["drop_oldest", "drop_newest"], help="what a full queue drops")
        p.add_argument("--json", action="store_true", help="print the whole subscription as JSON, not just the id")
        p.set_defaults(func=cmd_subscribe)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from yfpp.service import logs, server
    except ImportError as e:
        raise YfppError(f"'yfpp serve' needs the server libraries: pip install -e '.[serve]' in yfpp's clone ({e})") from e
    cfg = serve_config(args)
    logs.setup(cfg.log_level)
    return server.run(cfg)


def serve_config(args: argparse.Namespace) -> ServiceConfig:
    """The settings of ``yfpp serve ARGS``: defaults, then ``--config``'s file, then the flags (one per setting)."""
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServiceConfig)}
    overrides["token"] = overrides["token"] or os.environ.get("YFPP_TOKEN")
    cfg = ServiceConfig.load(args.config, overrides)
    if args.no_state:
        cfg.state = None
    return cfg


def cmd_subscribe(args: argparse.Namespace) -> int:
    from yfpp.service.client import Client

    client = Client(args.server, args.token)
    queries = load_queries([args.query])
    for q in queries:
        name, text, language = q.name, q.text, q.language
        given = args.name if args.name else (name if name != "q" else None)
        if args.name and len(queries) > 1:
            given = f"{args.name}.{name}"
        options = {"language": language, "format": args.format, "policy": args.policy, "queue": args.queue,
                   "overflow": args.overflow}
        sub = client.subscribe(text, sink=args.sink, name=given, **options)
        print(json.dumps(sub) if args.json else sub["id"])
    return 0


def cmd_unsubscribe(args: argparse.Namespace) -> int:
    from yfpp.service.client import Client

    client = Client(args.server, args.token)
    for sid in args.ids:
        client.unsubscribe(sid)
    return 0
