"""The one array form of a plan, as the searches import it: the type lives
with the plan space (:mod:`placer.space.arrays`, below every search, so the
genome can hold one); this module names it where the searches look.
"""

from placer.space.arrays import GroupTable, PlanArrays, compact_rows

__all__ = ["GroupTable", "PlanArrays", "compact_rows"]
