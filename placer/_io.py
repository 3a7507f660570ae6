"""Reading and writing placer's files: atomic writes, safe YAML, typed fields.

The ``field_*`` helpers turn a raw JSON/YAML value into a checked Python value
or raise the caller's error class naming the file and the field.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import gzip
import json
import math
import os
import re
import tempfile
import warnings
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from .errors import FormatError, PlacerError, UnknownKeyWarning

PathLike = str | os.PathLike

# --- limits on what placer reads ------------------------------------------------
# A file over one of them is refused with a line naming the file, the field and
# the limit; they are far above any real graph, cluster or plan (the largest
# shipped graph has 2,600 ops; a 20,000-op graph file is about 9 MB).

#: bytes of one file after decompression
MAX_FILE_BYTES = 256 * 2**20
#: values (numbers, strings, lists, mappings) in one document, YAML aliases expanded
MAX_VALUES = 4_000_000
#: nesting depth of one document
MAX_DEPTH = 64
#: ops of a graph (and entries of a plan's placement)
MAX_OPS = 200_000
#: edges of a graph
MAX_EDGES = 2_000_000
#: devices of a cluster (``count`` included) and of one op's placement
MAX_DEVICES = 8192
#: microbatches of a plan
MAX_MICROBATCHES = 65_536
#: magnitude of any finite number in a file (FLOP, bytes, seconds, ...)
MAX_NUMBER = 1e30


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and rename, so a crash
    never leaves a half-written file behind."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise PlacerError(f"cannot write: {exc.strerror or exc}", file=str(path),
                          fix="give a path in a directory you can write to") from None
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
    too_big = error(f"larger than {MAX_FILE_BYTES // 2**20} MiB (the limit on files placer "
                    "reads, after decompression)", file=str(path),
                    fix="check that this is the right file")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise error("file not found", file=str(path), fix="check the path") from None
    except IsADirectoryError:
        raise error("is a directory, not a file", file=str(path)) from None
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", file=str(path)) from None
    if len(data) > MAX_FILE_BYTES:
        raise too_big
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(data, str(path), error, too_big)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"not UTF-8 text (byte {exc.start})", file=str(path)) from None


def _gunzip(data: bytes, file: str, error: type[PlacerError], too_big: PlacerError) -> bytes:
    """Decompress gzip ``data`` (all members) without ever holding more than
    :data:`MAX_FILE_BYTES` of output: a small file may expand to gigabytes."""
    out = bytearray()
    try:
        while data:
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            chunk = inflate.decompress(data, MAX_FILE_BYTES + 1 - len(out))
            out += chunk
            while inflate.unconsumed_tail and len(out) <= MAX_FILE_BYTES:
                out += inflate.decompress(inflate.unconsumed_tail,
                                          MAX_FILE_BYTES + 1 - len(out))
            if len(out) > MAX_FILE_BYTES:
                raise too_big
            if not inflate.eof:
                raise zlib.error("compressed data ends early")
            data = inflate.unused_data.lstrip(b"\0")
    except zlib.error as exc:
        raise error(f"corrupt gzip data ({exc})", file=file,
                    fix="re-create or re-download the file") from None
    return bytes(out)


class _TooDeep(yaml.YAMLError):
    """A YAML document nests deeper than :data:`MAX_DEPTH`."""

    def __init__(self, mark):
        super().__init__(f"nested deeper than {MAX_DEPTH} levels")
        self.problem_mark = mark
        self.problem = f"nested deeper than {MAX_DEPTH} levels"


class _SafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but reading ``1e9`` and ``2.0e10`` as floats
    (YAML 1.1 would read them as strings), rejecting duplicate keys, and
    refusing to nest deeper than :data:`MAX_DEPTH` (the composer recurses)."""

    _depth = 0

    def fetch_flow_collection_start(self, TokenClass):
        # the scanner keeps a possible key per open bracket and rescans them
        # all per token: quadratic, so stop before thousands of brackets
        if self.flow_level >= MAX_DEPTH:
            raise _TooDeep(self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


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
    """Parse YAML safely (no Python objects); errors name the line. The node
    graph is measured before anything is built, so an alias bomb or a
    self-referencing alias is refused instead of expanded."""
    loader = None
    try:
        loader = _SafeLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_shape(node, file, error)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"invalid YAML: {problem}", file=file, field=where,
                    fix="fix the YAML syntax") from None
    except RecursionError:
        raise error(f"nested deeper than {MAX_DEPTH} levels", file=file,
                    fix="check that this is the right file") from None
    except (ValueError, OverflowError) as exc:     # e.g. an int of 10,000 digits
        raise error(f"invalid YAML: {_cut(str(exc), 80)}", file=file,
                    fix="fix the value") from None
    finally:
        if loader is not None:
            loader.dispose()


def _yaml_children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    return []


def _check_yaml_shape(root, file: str | None, error: type[PlacerError]) -> None:
    """Refuse a YAML node graph whose expansion (every alias written out) is
    too large or too deep, or that refers to itself; linear in its nodes."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            kids = _yaml_children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[key] > MAX_VALUES:
                raise error(f"more than {MAX_VALUES:,} values once its aliases are expanded",
                            file=file, field=f"line {node.start_mark.line + 1}",
                            fix="write the values out, or use fewer nested aliases")
            if depth[key] > MAX_DEPTH:
                raise error(f"nested deeper than {MAX_DEPTH} levels", file=file,
                            field=f"line {node.start_mark.line + 1}")
            continue
        if key in size:
            continue
        if key in on_path:
            raise error("an alias refers to the mapping or list that holds it", file=file,
                        field=f"line {node.start_mark.line + 1}",
                        fix="a placer file is a tree; write the values out")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((kid, False) for kid in _yaml_children(node) if id(kid) not in size)


def check_shape(data: Any, file: str | None, error: type[PlacerError] = FormatError) -> None:
    """Refuse a parsed document with more than :data:`MAX_VALUES` values or
    nested deeper than :data:`MAX_DEPTH` (walks it without recursion)."""
    count = 0
    stack = [(data, 1)]
    while stack:
        value, level = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise error(f"more than {MAX_VALUES:,} values", file=file,
                        fix="check that this is the right file")
        if isinstance(value, dict):
            items = value.values()
        elif isinstance(value, list):
            items = value
        else:
            continue
        if level >= MAX_DEPTH and items:
            raise error(f"nested deeper than {MAX_DEPTH} levels", file=file,
                        fix="check that this is the right file")
        stack.extend((item, level + 1) for item in items)


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
    except RecursionError:
        raise error(f"nested deeper than {MAX_DEPTH} levels", file=file,
                    fix="check that this is the right file") from None
    except ValueError as exc:   # e.g. an int of more than 4,300 digits
        raise error(f"invalid JSON: {_cut(str(exc), 80)}", file=file) from None


def load_document(path: PathLike, error: type[PlacerError] = FormatError) -> Any:
    """Load a JSON or YAML file, choosing by extension (JSON is YAML too)."""
    text = read_text(path, error)
    name = str(path).removesuffix(".gz")
    if name.endswith((".yaml", ".yml")):
        return parse_yaml(text, str(path), error)
    data = parse_json(text, str(path), error)
    check_shape(data, str(path), error)
    return data


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
        hint = f"give a number{(' in ' + unit) if unit else ''}, e.g. 1.0e9"
        try:
            number = to_number(value)
        except OverflowError:
            self.fail(key, f"is too large ({short_repr(value)}); the limit is {MAX_NUMBER:g}",
                      fix=hint)
        if number is None:
            self.fail(key, f"expected a number, got {short_repr(value)}", fix=hint)
        if math.isnan(number):
            self.fail(key, "is NaN", fix=hint)
        if math.isinf(number) and not allow_inf:
            self.fail(key, "is infinite", fix=hint)
        if math.isfinite(number) and abs(number) > MAX_NUMBER:
            self.fail(key, f"is too large ({short_repr(value)}); the limit is {MAX_NUMBER:g}",
                      fix=hint)
        if positive and not number > 0:
            self.fail(key, f"must be > 0, got {short_repr(value)}", fix=hint)
        if minimum is not None and number < minimum:
            self.fail(key, f"must be >= {minimum:g}, got {short_repr(value)}", fix=hint)
        if integer:
            if not math.isfinite(number) or number != int(number):
                self.fail(key, f"must be a whole number, got {short_repr(value)}")
            return int(number)
        return number

    def count(self, key: str, limit: int, default: Any = ..., what: str = "") -> int:
        """A positive whole number no larger than ``limit`` (counts that size
        allocations: devices, microbatches)."""
        value = self.number(key, default, integer=True, positive=True)
        if value is not None and value > limit:
            self.fail(key, f"{value:,} is over the limit of {limit:,}{what}",
                      fix=f"give at most {limit:,}")
        return value

    def limit(self, key: str, items: list, limit: int, what: str) -> list:
        """``items`` (found at ``key``), refused when there are more than ``limit``."""
        if len(items) > limit:
            self.fail(key, f"{len(items):,} {what}, over the limit of {limit:,}",
                      fix="check that this is the right file")
        return items

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

    def extras(self, known: Iterable[str], documented: Iterable[str] = ()) -> dict:
        """The keys the loader does not read (``known`` are those it reads):
        kept and ignored, but they must not hold NaN or infinities, which
        could not be saved. A key that is neither read nor ``documented``
        (placer's own pass-through keys) nor marked as the user's own
        (``x-``/``x_`` prefix) is reported by :func:`unknown_key`."""
        known = set(known)
        out = {k: v for k, v in self.data.items() if k not in known}
        documented = set(documented)
        for key, value in out.items():
            if key not in documented and not str(key).startswith(("x-", "x_")):
                unknown_key(self, key, known | documented)
            bad = _non_finite_path(value)
            if bad is not None:
                self.fail(f"{key}{bad}", "holds NaN or an infinity",
                          fix="use finite numbers or null")
        return out


def _non_finite_path(value: Any) -> str | None:
    """Where inside ``value`` a non-finite float sits ('' for itself), or None.
    Walks without recursion and visits a shared list or mapping (a YAML
    alias) once, so it never expands aliases."""
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return where
        if isinstance(item, (dict, list)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((inner, where + (f"[{k}]" if isinstance(item, list) else f".{k}"))
                         for k, inner in reversed(list(pairs)))
    return None


def short_repr(value: Any, size: int = 40) -> str:
    """``repr(value)`` cut to ``size`` characters (values may be huge)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return _cut(repr(value), size)


def _cut(text: str, size: int) -> str:
    return text if len(text) <= size else text[:size - 3] + "..."


@functools.lru_cache(maxsize=None)
def schema(name: str) -> dict:
    """The shipped JSON Schema ``name`` (``graph``, ``cluster`` or ``plan``) of
    the ``placer.NAME/v1`` format, as a dict (editors can use the files in
    ``placer/schemas/``)."""
    return json.loads((Path(__file__).parent / "schemas" / f"{name}.v1.json").read_text())


def documented_keys(name: str, part: str | None = None) -> frozenset[str]:
    """Keys the ``name`` schema lists for ``part`` (a ``$defs`` entry; None:
    the top level): those a loader reads and placer's own pass-through keys."""
    node = schema(name) if part is None else schema(name)["$defs"][part]
    return frozenset(node.get("properties", {}))


# --- unknown keys: a warning naming the nearest known key, an error when strict ----

_STRICT: contextvars.ContextVar[bool] = contextvars.ContextVar("placer_strict", default=False)
_UNKNOWN: contextvars.ContextVar[dict | None] = contextvars.ContextVar("placer_unknown",
                                                                      default=None)


def set_strict(strict: bool) -> None:
    """Make unknown keys in graph, cluster and plan files an error (``True``)
    or a warning (``False``, the default) for the loaders called without
    ``strict=`` (the CLI's ``--strict``)."""
    _STRICT.set(bool(strict))


def unknown_key(fields: Fields, key: Any, known: set[str]) -> None:
    """Report key ``key`` of ``fields``, which nothing reads: an error in
    strict mode, else one warning per key and file once the load ends."""
    near = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
    hint = f"did you mean '{near[0]}'?" if near else "kept and ignored"
    if _STRICT.get():
        fields.fail(str(key), f"unknown key ({hint})",
                    fix=f"rename it to '{near[0]}'" if near else
                    "remove it, or prefix it with 'x-' to keep it as your own")
    seen = _UNKNOWN.get()
    message = f"{fields._field(str(key))}: unknown key, {hint}"
    if seen is None:
        _warn_unknown(fields.file, message, 1)
        return
    pattern = re.sub(r"\[\d+\]", "[*]", f"{fields.where}.{key}")
    entry = seen.setdefault(pattern, [message, 0])
    entry[1] += 1


def _warn_unknown(file: str | None, message: str, times: int) -> None:
    more = f" (and {times - 1} more like it)" if times > 1 else ""
    text = f"{file}: {message}{more}" if file else f"{message}{more}"
    warnings.warn(UnknownKeyWarning(text), stacklevel=4)


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


def wrap_errors(load: Callable[[], Any], file: str | None, strict: bool | None = None) -> Any:
    """Run ``load`` and attach ``file`` to any PlacerError it raises; unknown
    keys it meets are warned about once per key (an error when ``strict``;
    None: the default set by :func:`set_strict`)."""
    token = _STRICT.set(_STRICT.get() if strict is None else bool(strict))
    seen = _UNKNOWN.get()
    own = seen is None
    unknown_token = _UNKNOWN.set({}) if own else None
    try:
        result = load()
        if own:
            for message, times in _UNKNOWN.get().values():
                _warn_unknown(file, message, times)
        return result
    except PlacerError as exc:
        raise exc.located(file) from None
    finally:
        if own:
            _UNKNOWN.reset(unknown_token)
        _STRICT.reset(token)


@contextlib.contextmanager
def strictness(strict: bool | None):
    """Within the block, loaders treat unknown keys as errors (``True``),
    warnings (``False``) or as set by :func:`set_strict` (None)."""
    token = _STRICT.set(_STRICT.get() if strict is None else bool(strict))
    try:
        yield
    finally:
        _STRICT.reset(token)


# --- output places -----------------------------------------------------------------

def check_outputs(outputs: Iterable[tuple[str, PathLike | None]],
                  inputs: Iterable[PathLike | None] = ()) -> None:
    """Refuse, before any work, output places that cannot or must not be
    written: ``outputs`` are ``(option, path)`` pairs (None paths skipped),
    ``inputs`` the files the command reads. An output may not be an input
    (same resolved file), a directory, or inside a place that is not a
    writable directory; an existing file is fine (replaced atomically)."""
    read = []
    for item in inputs:
        if item is not None and os.path.isfile(item):
            read.append(Path(item))
    chosen: dict[Path, str] = {}
    for option, path in outputs:
        if path is None:
            continue
        path = Path(path)
        where = dict(file=str(path), field=option)
        for source in read:
            if path.resolve() == source.resolve() or (path.exists()
                                                      and os.path.samefile(path, source)):
                raise PlacerError("is also an input of this command; writing it would replace "
                                  f"the input {str(source)!r}", **where,
                                  fix="give another output file")
        if path.resolve() in chosen:
            raise PlacerError(f"is also written as {chosen[path.resolve()]}", **where,
                              fix="give different output files")
        chosen[path.resolve()] = option
        if path.is_dir():
            raise PlacerError("is a directory", **where,
                              fix=f"name a file inside it, e.g. {path / 'out.json'}")
        parent = path.parent if str(path.parent) else Path(".")
        existing = parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise PlacerError(f"cannot be written: {str(existing)!r} is not a directory", **where,
                              fix="give a path inside a directory")
        try:    # a real probe: access() says yes to root on read-only places
            fd, probe = tempfile.mkstemp(prefix=".placer-probe.", dir=existing)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise PlacerError(f"cannot be written in {str(existing)!r}: "
                              f"{exc.strerror or exc}", **where,
                              fix="give a path in a directory you can write to") from None
