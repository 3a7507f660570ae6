"""Numbering of data-parallel device sets, the one place it is done.

A plan over ``D`` devices names each op's devices by a *group id*: ids
``< D`` are the devices themselves, ids ``D, D+1, ...`` data-parallel sets
(sorted tuples of device indices). :class:`GroupTable` hands out those ids
in the order the sets are first seen, so a seeded search, or a batch of
plans compiled together (:meth:`placer.cost.Problem.compile_many`), numbers
them the same every run; :func:`compact_rows` renumbers a batch of
assignments to only the sets it uses (a cost model's work grows with the
table it is given). The cost models' ``Compiled``, the searches'
:class:`~placer.space.arrays.PlanArrays` and the genomes all number their
sets here. numpy only, so every layer may import it.

>>> t = GroupTable(4)
>>> t.id([3]), t.id([2, 1]), t.id((1, 2)), t.ids([(0, 3), (1, 2)]), t.sets()[4:]
(3, 4, 4, [5, 4], [(1, 2), (0, 3)])
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from .errors import StrategyError

__all__ = ["GroupTable", "compact_rows"]


def compact_rows(A: np.ndarray, groups: Sequence[tuple], D: int) -> tuple[np.ndarray, list]:
    """Assignments ``A`` (one row or a batch) over the data-parallel sets
    ``groups`` (ids ``D, D+1, ...``), renumbered to only the sets they use,
    in id order: ``(rows, used sets)``; ``A`` itself when it uses none."""
    A = np.asarray(A)
    used = np.unique(A[A >= D])
    if not len(used):
        return A, []
    lookup = np.arange(int(A.max()) + 1, dtype=np.int64)
    lookup[used] = D + np.arange(len(used))
    return lookup[A], [tuple(groups[g - D]) for g in used.tolist()]


class GroupTable:
    """Group id <-> sorted tuple of device indices; ids ``< D`` are the
    devices themselves, data-parallel sets get ids ``D, D+1, ...`` in the
    order they are first seen (so a seeded search numbers them the same)."""

    def __init__(self, n_devices: int):
        self.n_devices = int(n_devices)
        self._ids: dict[tuple, int] = {}
        self._sets: list[tuple] = [(d,) for d in range(self.n_devices)]

    def __len__(self) -> int:
        return len(self._sets)

    def id(self, devices: Sequence[int]) -> int:
        """The group id of a device set (registered on first use)."""
        key = tuple(sorted(int(d) for d in devices))
        if not key or len(set(key)) != len(key):
            raise StrategyError(f"bad device set {devices!r}")
        if len(key) == 1:
            return key[0]
        return self.ids((key,))[0]

    def ids(self, keys: Iterable[tuple]) -> list[int]:
        """The group ids of data-parallel sets given as sorted tuples of two
        or more distinct device indices (registered on first use, in order),
        unchecked: the batch path of callers that built the tuples so (a
        plan compiler meets thousands a batch)."""
        get, sets, out = self._ids.get, self._sets, []
        for key in keys:
            gid = get(key)
            if gid is None:
                gid = self._ids[key] = len(sets)
                sets.append(key)
            out.append(gid)
        return out

    def devices(self, gid: int) -> tuple:
        """Device indices of group ``gid``."""
        return self._sets[int(gid)]

    def size(self, gid: int) -> int:
        """How many devices group ``gid`` has."""
        return len(self._sets[int(gid)])

    def sets(self) -> list[tuple]:
        """Every group's device set in id order, the devices' own first (a
        new list: ``groups`` of :class:`placer.cost.Compiled`)."""
        return list(self._sets)

    def extra(self) -> list[tuple]:
        """The data-parallel sets, in id order (``groups=`` of ``step_times``)."""
        return self._sets[self.n_devices:]

    def compact(self, A: np.ndarray) -> tuple[np.ndarray, list]:
        """:func:`compact_rows` of ``A`` over this table."""
        return compact_rows(A, self._sets[self.n_devices:], self.n_devices)
