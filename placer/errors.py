"""Exceptions raised by placer.

Every problem with user input raises a subclass of :class:`PlacerError` whose
message names the file, the field and what to do about it, so the CLI can
print one line and exit with status 2.

>>> from placer.errors import ClusterError
>>> str(ClusterError("must be > 0", file="c.yaml", field="devices[0].memory",
...                  fix="give the device memory in bytes, e.g. 4.0e10"))
'c.yaml: devices[0].memory: must be > 0 (fix: give the device memory in bytes, e.g. 4.0e10)'
"""

from __future__ import annotations


_CONTROL = {c: f"\\x{c:02x}" for c in range(32)} | {10: "\\n", 13: "\\r", 9: "\\t"}


class PlacerError(Exception):
    """Base of every error placer raises on purpose.

    ``file``, ``field`` and ``fix`` are optional; when present they are part of
    the one-line message so a user knows where and how to repair the input.

    >>> import placer
    >>> try:
    ...     placer.Cluster.from_dict({"format": "placer.cluster/v1", "name": "lab",
    ...                               "devices": [{"name": "g0", "flops": -1.0,
    ...                                            "memory": 8e9}]}, file="lab.yaml")
    ... except placer.errors.PlacerError as exc:
    ...     print(exc.file, "|", exc.field)
    lab.yaml | devices[0].flops
    """

    def __init__(self, message: str, *, file: str | None = None,
                 field: str | None = None, fix: str | None = None):
        self.message = message
        self.file = None if file is None else str(file)
        self.field = field
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [p for p in (self.file, self.field) if p]
        text = ": ".join(parts + [self.message])
        if self.fix:
            text += f" (fix: {self.fix})"
        # one line, always: names from user files may hold newlines or controls
        return text.translate(_CONTROL)

    def located(self, file: str | None) -> "PlacerError":
        """Return this error with ``file`` filled in when it was unknown."""
        if self.file is None and file is not None:
            self.file = str(file)
            self.args = (str(self),)
        return self


class FormatError(PlacerError):
    """A file is not valid JSON/YAML or not of the expected format."""


class GraphError(PlacerError):
    """A computation graph is malformed (cycle, unknown op, bad cost...)."""


class ClusterError(PlacerError):
    """A cluster description is malformed (bad bandwidth, duplicate device...)."""


class PlanError(PlacerError):
    """A plan does not fit its graph or cluster (missing op, unknown device...)."""


class TraceError(PlacerError):
    """A model could not be traced into a graph."""


class InfeasibleError(PlacerError):
    """No plan fits the cluster's memory; the message says what would."""


class StrategyError(PlacerError):
    """An unknown strategy or cost model name, or bad strategy options."""


class UnknownKeyWarning(UserWarning):
    """A file holds a key placer does not know (often a typo); the message
    names the file, the key and the nearest known key. ``--strict`` (or
    ``strict=True`` in the loaders) makes it an error."""
