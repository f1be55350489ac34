"""``POST /subscriptions`` bodies: one subscription (a JSON object) or many (a JSON array, or NDJSON: one object
a line), each read on its own so that a bad item refuses only itself."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from yfpp.service.errors import RequestError
from yfpp.service.subscriptions import SubscriptionSpec

Item = SubscriptionSpec | RequestError  #: a request read, or why it is refused


def read_body(body: bytes, content_type: str) -> tuple[bool, list[Item]]:
    """``(many, items)`` of a body: ``many`` is False for a single JSON object (answered as one subscription),
    True for an array or NDJSON (answered item by item); RequestError for a body that is neither."""
    ndjson = "ndjson" in content_type or "jsonl" in content_type or "json-seq" in content_type
    if not ndjson:
        try:
            data = json.loads(body)
        except ValueError as e:
            lines = [x for x in body.splitlines() if x.strip()]
            if len(lines) < 2:
                raise RequestError(400, f"body: not JSON ({e})") from None
            ndjson = True
        else:
            if isinstance(data, dict):
                return False, [spec_of(data)]
            if isinstance(data, list):
                return True, [spec_of(x) for x in data]
            raise RequestError(400, f"body: a JSON {type(data).__name__}: give an object, an array of them, or NDJSON")
    items: list[Item] = []
    for n, line in enumerate(body.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(spec_of(json.loads(line)))
        except ValueError as e:
            items.append(RequestError(400, f"line {n}: not JSON ({e})"))
    return True, items


def spec_of(data: Any) -> Item:
    """One subscription request, validated; a 422 RequestError (FastAPI's ``detail`` form) when it is not one."""
    if not isinstance(data, dict):
        return RequestError(422, "not a subscription", detail=[{"loc": ["body"], "msg": "an object is needed",
                                                                 "type": "model_type"}])
    try:
        return SubscriptionSpec.model_validate(data)
    except ValidationError as e:
        detail = [{"loc": ["body", *(str(p) for p in err.get("loc", ()))], "msg": str(err.get("msg", "")),
                   "type": str(err.get("type", ""))} for err in e.errors()]
        why = "; ".join(f"{'.'.join(d['loc'][1:]) or 'body'}: {d['msg']}" for d in detail)
        return RequestError(422, f"not a valid subscription: {why}", detail=detail)


def answer(item: Any) -> dict[str, Any]:
    """One item's entry in a batch answer: ``{"status": 201, "subscription": …}`` or ``{"status": …, "error": …}``."""
    if isinstance(item, RequestError):
        return {"status": item.status, **item.body}
    return {"status": 201, "subscription": item.info()}
