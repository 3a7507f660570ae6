"""What modules derive from an object that does not change after
construction, kept with it: a :class:`~placer.cost.Problem`'s
``problem.cache`` (the analytical model's prefix sums, the simulator's
all-reduce times, a search's context) and the policy's encoded problems.

Keys name the module that builds the entry and what it is,
``"<module>.<what>"`` (``"analytical.precomputed"``), so two modules never
share one by accident. An entry is built once, on first use, and never
invalidated: its owner does not change. An entry that memoises results per
argument is a dict (``cache.get_or_build(key, dict)``) whose module bounds
its size. A copy or a pickle of the owner carries the entries.

>>> cache = Cache()
>>> cache.get_or_build("doc.squares", lambda: [i * i for i in range(4)])
[0, 1, 4, 9]
>>> cache.get_or_build("doc.squares", list)   # built once
[0, 1, 4, 9]
>>> "doc.squares" in cache, len(cache)
(True, 1)
"""

from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


class Cache:
    """Entries derived from one owner, by ``"<module>.<what>"`` key."""

    def __init__(self):
        self._entries: dict[str, object] = {}

    def get_or_build(self, key: str, build: Callable[[], T]) -> T:
        """The entry ``key``, made by ``build()`` the first time."""
        hit = self._entries.get(key)
        if hit is None:
            hit = self._entries[key] = build()
        return hit

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Cache({sorted(self._entries)})"
