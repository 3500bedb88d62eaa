"""An in-process cache of the most recently used entries: the one home of the caches of built victims
(:mod:`gi.world.build`) and of the attack's per-gradient solves (:mod:`gi.attack.recon.problem`)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class LRU:
    """An in-process cache of the ``size`` most recently used entries; ``pin`` keeps an entry that cannot be made
    again identically (e.g. a model trained with a trial's generator) for the whole process."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[Any, Any] = OrderedDict()
        self.pinned: dict[Any, Any] = {}

    def get(self, key: Any, make: Callable[[], Any], pin: bool = False) -> Any:
        if key in self.pinned:
            return self.pinned[key]
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        value = make()
        if pin:
            self.pinned[key] = value
        else:
            self.put(key, value)
        return value

    def put(self, key: Any, value: Any) -> None:
        """Keep ``value`` under ``key``, replacing what was there."""
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)

    def peek(self, key: Any) -> Any:
        """The value kept under ``key`` (None if none), without making it."""
        return self.pinned.get(key, self.items.get(key))


def digest(*tensors: Any) -> str:
    """A cache key for the contents of CPU tensors (sha1 of their bytes in order; None adds nothing)."""
    h = hashlib.sha1()
    for t in tensors:
        if t is not None:
            h.update(t.numpy().tobytes())
    return h.hexdigest()
