"""A value that a Python function ships to every task, unpickled once per Python worker process.

Spark unpickles a Python function's closure for every task. A streaming job runs its state function's
tasks at every micro-batch, and its closure holds the query groups: 1,000 subscriptions' patterns take
14 ms to unpickle, task after task. :class:`Shipped` travels as
its pickled bytes and their digest; a worker unpickles the bytes the first time it meets the digest and
keeps the value for the tasks after (no pyspark import here).
"""

from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict
from typing import Generic, TypeVar

T = TypeVar("T")

#: Values unpickled in this process, by digest; the least recently used dropped beyond :data:`KEPT`.
_VALUES: OrderedDict[str, object] = OrderedDict()
KEPT = 8


class Shipped(Generic[T]):
    """``value`` pickled once, here; :meth:`get` gives it back — in another process, unpickled once there."""

    def __init__(self, value: T):
        self.blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        self.digest = hashlib.blake2b(self.blob, digest_size=16).hexdigest()

    def __getstate__(self) -> tuple[str, bytes]:
        return self.digest, self.blob

    def __setstate__(self, state: tuple[str, bytes]) -> None:
        self.digest, self.blob = state

    def get(self) -> T:
        """The value: this process's copy of it (the same object at every call)."""
        try:
            _VALUES.move_to_end(self.digest)
            return _VALUES[self.digest]  # type: ignore[return-value]
        except KeyError:
            value = _VALUES[self.digest] = pickle.loads(self.blob)
            while len(_VALUES) > KEPT:
                _VALUES.popitem(last=False)
            return value
