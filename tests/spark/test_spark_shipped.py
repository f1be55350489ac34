"""``Shipped``: a value unpickled once per process, by the digest of its bytes."""

from __future__ import annotations

import pickle

from yfpp.spark import shipped
from yfpp.spark.plan import effective_queries, group_queries
from yfpp.spark.shipped import Shipped


def test_a_shipped_value_comes_back_equal_and_is_unpickled_once_per_process():
    groups = group_queries(effective_queries({"a": "[tag_id]&&//shelf//exit&&(1 hour)", "b": "//register//exit&&(60)"}))
    shipped._VALUES.clear()
    first, second = (pickle.loads(pickle.dumps(Shipped(groups))) for _ in range(2))
    assert first.get() == groups and first.get() is not groups  # (here: a copy, as in a worker)
    assert second.get() is first.get()  # the same bytes: unpickled once
    assert Shipped(groups[:1]).digest != first.digest


def test_a_process_keeps_the_last_values_it_met():
    shipped._VALUES.clear()
    values = [Shipped(list(range(k))) for k in range(shipped.KEPT + 2)]
    kept = [v.get() for v in values]
    assert list(shipped._VALUES) == [v.digest for v in values[2:]]
    assert values[0].get() == kept[0] and values[0].get() is not kept[0]  # dropped, unpickled again
