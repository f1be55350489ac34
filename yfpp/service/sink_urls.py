"""Sink URLs: which forms a subscription may name (:func:`check_sink`) and the sink of each (:func:`sink_for`):
TCP, webhook and file sinks from :mod:`yfpp.service.sinks`, MQTT sinks from :mod:`yfpp.service.mqtt`."""

from __future__ import annotations

import unicodedata
from urllib.parse import urlsplit

from yfpp.service.mqtt import MqttSink, check_sink_url
from yfpp.service.sink_policy import SinkPolicy
from yfpp.service.sinks import ENCODERS, FileSink, PushSink, TcpSink, WebhookSink, check_host


def check_sink(url: str) -> str:
    """The sink URL if it is one of the supported forms and usable, else ValueError saying what is wrong.

    Usable: no control character anywhere; for tcp and http(s) a hostname (IDNA)
    or IP address and a port in 1–65535 (tcp must name one).
    """
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in url):
        raise ValueError(f"sink must not hold control characters or unpaired surrogates, got {url!r}")
    parts = urlsplit(url)
    if parts.scheme in ("mqtt", "mqtts"):
        return check_sink_url(url)
    if parts.scheme in ("tcp", "http", "https") and parts.hostname:
        check_host(parts.hostname)
        if parts.scheme != "tcp":
            _check_webhook_url(url, parts.hostname)
        try:
            port = parts.port
        except ValueError:  # not a number, or above 65535
            port = 0
        if port == 0:
            raise ValueError(f"sink port must be 1-65535, got {url!r}")
        if port is not None or parts.scheme != "tcp":
            return url
    elif parts.scheme == "file" and url[len("file:"):].lstrip("/"):
        return url
    raise ValueError(f"sink must be tcp://HOST:PORT, http(s)://… (webhook), mqtt(s)://HOST:PORT/TOPIC or file:PATH, "
                     f"got {url!r}")


def _check_webhook_url(url: str, host: str) -> None:
    """ValueError unless httpx, which sends the webhooks, takes ``url``: it encodes hosts by IDNA 2008,
    stricter than Python's IDNA 2003 that :func:`check_host` (and a TCP sink's connection) uses."""
    import httpx

    try:
        httpx.URL(url).host  # (an invalid A-label fails only when the host is decoded, as sending does)
    except Exception:  # InvalidURL, or idna's own error unwrapped
        raise ValueError(f"sink host {host!r} is not a hostname a webhook can reach (IDNA 2008)") from None


def sink_for(url: str, fmt: str, policy: SinkPolicy | None = None) -> PushSink:
    """The sink of a checked URL, its results encoded as ``fmt``, reaching only what ``policy`` allows."""
    scheme = urlsplit(url).scheme
    if scheme in ("mqtt", "mqtts"):
        return MqttSink(url, ENCODERS[fmt], policy)
    cls = {"tcp": TcpSink, "http": WebhookSink, "https": WebhookSink, "file": FileSink}[scheme]
    return cls(url, ENCODERS[fmt], policy)
