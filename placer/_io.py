"""Reading and writing placer's files: atomic writes, safe YAML, typed fields.

The ``field_*`` helpers turn a raw JSON/YAML value into a checked Python value
or raise the caller's error class naming the file and the field.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml

from .errors import FormatError, PlacerError

PathLike = str | os.PathLike


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and rename, so a crash
    never leaves a half-written file behind."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; files should look normal
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: PathLike, text: str) -> None:
    """Atomically write ``text`` (UTF-8); gzip it when ``path`` ends in ``.gz``."""
    data = text.encode("utf-8")
    if str(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    atomic_write_bytes(path, data)


def read_text(path: PathLike, error: type[PlacerError] = FormatError) -> str:
    """Read a UTF-8 text file (transparently gunzipping ``.gz``)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error("file not found", file=str(path), fix="check the path") from None
    except IsADirectoryError:
        raise error("is a directory, not a file", file=str(path)) from None
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", file=str(path)) from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise error(f"corrupt gzip data ({exc})", file=str(path),
                        fix="re-create or re-download the file") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"not UTF-8 text (byte {exc.start})", file=str(path)) from None


class _SafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but reading ``1e9`` and ``2.0e10`` as floats
    (YAML 1.1 would read them as strings) and rejecting duplicate keys."""


_FLOAT_RE = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)
_SafeLoader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:float"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SafeLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE,
                                  list("-+0123456789."))


def _construct_mapping_no_duplicates(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_SafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                            _construct_mapping_no_duplicates)


def parse_yaml(text: str, file: str | None, error: type[PlacerError] = FormatError) -> Any:
    """Parse YAML safely (no Python objects); errors name the line."""
    try:
        return yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - safe loader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"invalid YAML: {problem}", file=file, field=where,
                    fix="fix the YAML syntax") from None


class _DuplicateKey(ValueError):
    """A JSON object names a key twice."""


def _object_without_duplicates(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def parse_json(text: str, file: str | None, error: type[PlacerError] = FormatError) -> Any:
    """Parse JSON, refusing keys named twice in one object (json would keep
    the last silently: a plan placing an op twice must not pass). NaN/Infinity
    literals parse, so that the field check that rejects them can name the field."""
    try:
        return json.loads(text, object_pairs_hook=_object_without_duplicates)
    except json.JSONDecodeError as exc:
        raise error(f"invalid JSON: {exc.msg}", file=file,
                    field=f"line {exc.lineno} column {exc.colno}",
                    fix="fix the JSON syntax or re-create the file") from None
    except _DuplicateKey as exc:
        raise error(f"invalid JSON: key {exc.args[0]!r} appears twice in one object",
                    file=file, fix="give each key once") from None
    except (ValueError, RecursionError) as exc:
        raise error(f"invalid JSON: {exc}", file=file) from None


def load_document(path: PathLike, error: type[PlacerError] = FormatError) -> Any:
    """Load a JSON or YAML file, choosing by extension (JSON is YAML too)."""
    text = read_text(path, error)
    name = str(path).removesuffix(".gz")
    if name.endswith((".yaml", ".yml")):
        return parse_yaml(text, str(path), error)
    return parse_json(text, str(path), error)


def dump_json(data: Any) -> str:
    """Stable, readable JSON for files placer writes."""
    return json.dumps(data, indent=1, sort_keys=False, allow_nan=False) + "\n"


def canonical_json(data: Any) -> str:
    """Compact JSON with sorted keys: the basis of fingerprints."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


class Fields:
    """Typed access to one mapping of a document, raising ``error`` with the
    file and the dotted field path when a value is missing or wrong."""

    def __init__(self, data: Any, where: str, file: str | None,
                 error: type[PlacerError]):
        self.file = file
        self.where = where
        self.error = error
        if not isinstance(data, dict):
            raise error(f"expected a mapping, got {type(data).__name__}",
                        file=file, field=where or "top level")
        self.data = data

    def _field(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def fail(self, key: str | None, message: str, fix: str | None = None):
        """Raise this document's error class at ``key``."""
        field = self._field(key) if key else (self.where or None)
        raise self.error(message, file=self.file, field=field, fix=fix)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key, default)
        return default if value is None else value

    def string(self, key: str, default: Any = ..., allow_empty: bool = False) -> str:
        """A required (or defaulted) string field."""
        if not self.has(key):
            if default is ...:
                self.fail(key, "missing", fix=f"add a '{key}' string")
            return default
        value = self.data[key]
        if not isinstance(value, str):
            self.fail(key, f"expected a string, got {type(value).__name__}")
        if not allow_empty and not value.strip():
            self.fail(key, "must not be empty")
        return value

    def number(self, key: str, default: Any = ..., *, minimum: float | None = 0.0,
               positive: bool = False, allow_inf: bool = False, integer: bool = False,
               unit: str = "") -> float:
        """A required (or defaulted) finite number; strings like '1e9' accepted."""
        if not self.has(key):
            if default is ...:
                self.fail(key, "missing", fix=f"add '{key}'{(' in ' + unit) if unit else ''}")
            return default
        return self.check_number(self.data[key], key, minimum=minimum, positive=positive,
                                 allow_inf=allow_inf, integer=integer, unit=unit)

    def check_number(self, value: Any, key: str, *, minimum: float | None = 0.0,
                     positive: bool = False, allow_inf: bool = False,
                     integer: bool = False, unit: str = "") -> float:
        """Check one numeric value found at ``key``."""
        number = to_number(value)
        hint = f"give a number{(' in ' + unit) if unit else ''}, e.g. 1.0e9"
        if number is None:
            self.fail(key, f"expected a number, got {value!r}", fix=hint)
        if math.isnan(number):
            self.fail(key, "is NaN", fix=hint)
        if math.isinf(number) and not allow_inf:
            self.fail(key, "is infinite", fix=hint)
        if positive and not number > 0:
            self.fail(key, f"must be > 0, got {value!r}", fix=hint)
        if minimum is not None and number < minimum:
            self.fail(key, f"must be >= {minimum:g}, got {value!r}", fix=hint)
        if integer:
            if number != int(number):
                self.fail(key, f"must be a whole number, got {value!r}")
            return int(number)
        return number

    def mapping(self, key: str, default: Any = ...) -> "Fields":
        if not self.has(key):
            if default is ...:
                self.fail(key, "missing", fix=f"add a '{key}' mapping")
            return default
        return Fields(self.data[key], self._field(key), self.file, self.error)

    def sequence(self, key: str, default: Any = ...) -> list:
        if not self.has(key):
            if default is ...:
                self.fail(key, "missing", fix=f"add a '{key}' list")
            return default
        value = self.data[key]
        if not isinstance(value, list):
            self.fail(key, f"expected a list, got {type(value).__name__}")
        return value

    def child(self, value: Any, key: str) -> "Fields":
        """A nested mapping at ``key`` (e.g. ``nodes[3]``)."""
        return Fields(value, self._field(key), self.file, self.error)

    def extras(self, known: set[str]) -> dict:
        """The keys this version of placer does not know: kept, ignored (but
        they must not hold NaN or infinities, which could not be saved)."""
        out = {k: v for k, v in self.data.items() if k not in known}
        for key, value in out.items():
            bad = _non_finite_path(value)
            if bad is not None:
                self.fail(f"{key}{bad}", "holds NaN or an infinity",
                          fix="use finite numbers or null")
        return out


def _non_finite_path(value: Any) -> str | None:
    """Where inside ``value`` a non-finite float sits ('' for itself), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        inner = _non_finite_path(item)
        if inner is not None:
            return (f"[{key}]" if isinstance(key, int) else f".{key}") + inner
    return None


def to_number(value: Any) -> float | None:
    """``value`` as a float if it is a number or a numeric string, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().replace("_", ""))
        except ValueError:
            return None
    return None


def check_format(fields: Fields, expected: str) -> None:
    """Check the document's ``format`` tag."""
    tag = fields.data.get("format")
    if tag is None:
        fields.fail("format", "missing", fix=f"add 'format: {expected}'")
    if tag != expected:
        fields.fail("format", f"expected {expected!r}, got {tag!r}",
                    fix=f"this file is not a {expected} file; check the path")


def wrap_errors(load: Callable[[], Any], file: str | None) -> Any:
    """Run ``load`` and attach ``file`` to any PlacerError it raises."""
    try:
        return load()
    except PlacerError as exc:
        raise exc.located(file) from None
