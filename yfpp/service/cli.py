"""``yfpp serve``, ``yfpp subscribe``, ``yfpp unsubscribe`` and ``yfpp keys`` (server libraries imported only by
``serve``). Keys are read from a file or the environment, never from the command line (``ps`` shows it)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
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
  yfpp serve --jsonl-port 9001 --workers auto   # the subscriptions spread over one engine per core
"""

SUBSCRIBE_EXAMPLES = """\
examples:
  yfpp subscribe --server http://127.0.0.1:8765 -q queries/shoplifting.sase --sink tcp://127.0.0.1:9000
  yfpp subscribe -q "[tag_id]&&//shelf//exit&&(1 hour)" --name exits --sink file:/tmp/exits.jsonl
  yfpp unsubscribe --server http://127.0.0.1:8765 s1
  yfpp subscriptions --server http://127.0.0.1:8765
  YFPP_KEY=$(cat my.key) yfpp subscribe -q "//shelf//exit"
"""

KEYS_EXAMPLES = """\
examples:
  YFPP_KEY=$(cat admin.key) yfpp keys create --name alice --role subscriber > alice.key
  yfpp keys --key-file admin.key list
  yfpp keys --key-file admin.key revoke 3f2a9c0d1b2e4f56
"""

ARGV_KEY = ("a key on the command line shows in 'ps': put it in a file ({file}) or in ${env}")

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
    s.add_argument("--health-port", type=int, help="GET /health also on this port, answered by a thread of its own "
                                                   "(so it answers while the API is stalled)")
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
    s.add_argument("--token", "--admin-key", dest="admin_key", help=argparse.SUPPRESS)  # refused: see ARGV_KEY
    s.add_argument("--admin-key-file", metavar="FILE", help="file whose first line is the admin key (default: "
                   "$YFPP_ADMIN_KEY); with one, every request and feed needs a key; needed beyond loopback")
    s.add_argument("--tls-cert", metavar="PEM", help="certificate (chain): the API answers HTTPS and the feed ports speak TLS "
                                                          "(with --tls-key)")
    s.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    s.add_argument("--file-sink-dir", metavar="DIR", help="file sinks only under this directory (default: none allowed)")
    s.add_argument("--sink-network", dest="sink_networks", action="append", metavar="NET",
                   help="network (10.0.0.0/8) or address network sinks may reach; repeatable (default: loopback)")
    s.add_argument("--max-request-bytes", type=int, help="largest body of any other request (default 1048576)")
    s.add_argument("--max-feed-connections-per-key", type=int, help="TCP feed connections at once per feed key (default 8)")
    s.add_argument("--feed-idle-timeout", type=float, metavar="SECONDS", help="a feed connection quiet this long is "
                                                                               "closed (default 300)")
    s.add_argument("--max-queue", type=int, help="largest queue a subscription may ask (default 100000)")
    s.add_argument("--key-max-subscriptions", type=int, help="subscriptions per subscriber key (default 1000)")
    s.add_argument("--key-max-queue", type=int, help="results queued per subscriber key (default 1000000)")
    s.add_argument("--queue-bytes", type=int, help="default per-subscription queue in bytes (default 64 MiB)")
    s.add_argument("--max-queue-bytes", type=int, help="largest queue_bytes a subscription may ask (default 256 MiB)")
    s.add_argument("--key-max-queue-bytes", type=int, help="bytes queued per subscriber key (default 1 GiB)")
    s.add_argument("--max-query-degree", type=int, metavar="N", help="refuse a subscriber's query whose runs may "
                                                                      "grow faster than events**N (default: admit all)")
    s.add_argument("--max-cpu-share", type=float, metavar="FRACTION",
                   help="suspend a subscription attributed more of the engine thread's CPU than this, beside "
                        "others, or move it to an isolation engine (--max-isolated) (default: never)")
    s.add_argument("--key-max-runs", type=int, metavar="N",
                   help="a subscriber key whose subscriptions hold more live runs gives up its costliest one "
                        "(default: no limit)")
    s.add_argument("--key-max-buffered", type=int, metavar="N",
                   help="a subscriber key whose subscriptions hold more buffered events (for their runs) gives up "
                        "its costliest one (default: no limit)")
    s.add_argument("--key-max-cpu-share", type=float, metavar="FRACTION",
                   help="a subscriber key whose subscriptions take more of the engine's time gives up its "
                        "costliest one (default: no limit)")
    s.add_argument("--max-isolated", type=int, metavar="N",
                   help="move up to N heavy queries (over --max-cpu-share, or --isolate-degree) each to an engine "
                        "of its own, in a child process, rather than suspend them (default 0)")
    s.add_argument("--isolate-degree", type=int, metavar="N",
                   help="a query whose runs may grow faster than events**N starts in an isolation engine "
                        "(with --max-isolated; default: none)")
    s.add_argument("--isolation-priority", type=_priority, metavar="NICE|idle",
                   help="the isolation engines' CPU priority: idle (SCHED_IDLE: only CPU no other process wants; "
                        "the others' latency first) or a nice value 0-19 above the service's (default idle)")
    s.add_argument("--workers", metavar="N|auto",
                   help="spread the subscriptions' queries over N engines (the service's and N-1 processes), each "
                        "fed every event: for many subscriptions; auto: one per core available (default 1; "
                        "docs/service.md: Worker engines)")
    s.add_argument("--dead-letters-per-second", type=float, help="dead letters written per second at most (default 100)")
    s.add_argument("--dead-letters-max-bytes", type=int, help="rotate the dead-letter file at this size (default 64 MiB)")
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
                           ("unsubscribe", "remove a subscription from a running 'yfpp serve'"),
                           ("subscriptions", "list the subscriptions of a running 'yfpp serve' (a key: its own)")):
        p = sub.add_parser(name, help=helptext, description=helptext[0].upper() + helptext[1:] + ".",
                           epilog=SUBSCRIBE_EXAMPLES, formatter_class=fmt)
        p.add_argument("--server", default=os.environ.get("YFPP_SERVER", DEFAULT_SERVER),
                       help=f"service URL (default $YFPP_SERVER, else {DEFAULT_SERVER})")
        _key_options(p)
        if name == "subscriptions":
            p.add_argument("--json", action="store_true", help="print each subscription as a JSON line")
            p.set_defaults(func=cmd_subscriptions)
            continue
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

    k = sub.add_parser("keys", help="create, list or revoke the API keys of a running 'yfpp serve' (admin key)",
                       description="Create, list or revoke the API keys of a running 'yfpp serve'; needs its admin "
                                   "key ($YFPP_KEY or --key-file).", epilog=KEYS_EXAMPLES, formatter_class=fmt)
    k.add_argument("--server", default=os.environ.get("YFPP_SERVER", DEFAULT_SERVER),
                   help=f"service URL (default $YFPP_SERVER, else {DEFAULT_SERVER})")
    _key_options(k)
    actions = k.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="a new key: prints its text (shown this once)")
    create.add_argument("--name", required=True, help="who holds it")
    create.add_argument("--role", required=True, choices=["subscriber", "feed"])
    actions.add_parser("list", help="the keys (id, name, role; never a secret), one JSON line each")
    revoke = actions.add_parser("revoke", help="revoke keys: they fail from the next request on")
    revoke.add_argument("ids", nargs="+", metavar="ID")
    k.set_defaults(func=cmd_keys)


def _priority(text: str) -> int | str:
    """``--isolation-priority``: ``idle`` or a nice value (checked with the configuration)."""
    try:
        return text if text == "idle" else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a nice value 0-19 or idle, not {text!r}") from None


def _key_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key-file", metavar="FILE", help="file whose first line is the API key (default $YFPP_KEY)")
    p.add_argument("--token", help=argparse.SUPPRESS)  # refused: see ARGV_KEY


def client_key(args: argparse.Namespace) -> str | None:
    """The API key of a client command: from ``--key-file``, else ``$YFPP_KEY`` (never from argv)."""
    from yfpp.service.auth import CLIENT_KEY_ENV

    if args.token is not None:
        raise YfppError(ARGV_KEY.format(file="--key-file", env=CLIENT_KEY_ENV))
    if args.key_file:
        try:
            with open(args.key_file, encoding="utf-8") as f:
                return f.readline().strip() or None
        except OSError as e:
            raise YfppError(f"key file {args.key_file}: {e.strerror or e}") from e
    return os.environ.get(CLIENT_KEY_ENV) or None


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from yfpp.service import logs, server
    except ImportError as e:
        raise YfppError(f"'yfpp serve' needs the server libraries: pip install -e '.[serve]' in yfpp's clone ({e})") from e
    cfg = serve_config(args)
    logs.setup(cfg.log_level)
    code = server.run(cfg)
    # everything is kept by now: end without the interpreter's teardown of the engine and the subscriptions
    # (seconds with thousands of them)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve_config(args: argparse.Namespace) -> ServiceConfig:
    """The settings of ``yfpp serve ARGS``: defaults, then ``--config``'s file, then the flags (one per setting)."""
    from yfpp.service import auth

    if args.admin_key is not None:
        raise YfppError(ARGV_KEY.format(file="--admin-key-file", env=auth.ADMIN_KEY_ENV))
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServiceConfig)}
    cfg = ServiceConfig.load(args.config, overrides)
    if args.no_state:
        cfg.state = None
    if cfg.admin_key is None:
        cfg.admin_key = auth.admin_key(cfg.admin_key_file, dict(os.environ))
    return cfg


def cmd_subscribe(args: argparse.Namespace) -> int:
    from yfpp.service.client import Client

    client = Client(args.server, client_key(args))
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

    client = Client(args.server, client_key(args))
    for sid in args.ids:
        client.unsubscribe(sid)
    return 0


def cmd_subscriptions(args: argparse.Namespace) -> int:
    """One line per subscription: id, name, counters, sink (or each as a JSON line)."""
    from yfpp.service.client import Client

    for s in Client(args.server, client_key(args)).subscriptions():
        if args.json:
            print(json.dumps(s))
            continue
        c = s["counters"]
        print(f"{s['id']}\t{s['name']}\tmatches={c['matches']} delivered={c['delivered']} dropped={c['dropped']} "
              f"queued={c['queued']}\t{s['sink'] or 'pull'}{'  ' + s['suspended'] if s.get('suspended') else ''}")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from yfpp.service.client import Client

    client = Client(args.server, client_key(args))
    if args.action == "create":
        print(client.create_key(args.name, args.role)["key"])
    elif args.action == "list":
        for key in client.keys():
            print(json.dumps(key))
    else:
        for kid in args.ids:
            client.revoke_key(kid)
    return 0
