"""The cluster: devices (speed, memory, site) and every link between them.

Links come from rules (a ``default``, per-site-pair ``sites`` and per-device
``pairs`` overrides) or from full ``bandwidth``/``latency`` matrices; either
way the cluster holds full matrices (bytes/s and seconds) indexed like
``devices``. Files use the ``placer.cluster/v1`` format.

>>> c = Cluster.from_rules("demo", [Device("a0", 1e14, 4e10, site="x"),
...                                 Device("b0", 5e13, 1.6e10, site="y")],
...                        default=(1e9, 1e-3), sites=[("x", "y", 1.5e8, 0.035)])
>>> c.link("a0", "b0")
(150000000.0, 0.035)
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ._io import (MAX_DEVICES, Fields, PathLike, atomic_write_text, canonical_json,
                  check_format, documented_keys, load_document, wrap_errors)
from ._paths import data_dir
from .errors import ClusterError

FORMAT = "placer.cluster/v1"


@dataclass
class Device:
    """One accelerator (or CPU): peak ``flops`` (FLOP/s), ``memory`` (bytes),
    the ``site`` it is in and its ``kind`` (e.g. ``"A100-40GB"``).

    ``efficiency`` is the fraction of peak the cost model assumes (None: the
    cost model's default); ``nic_bandwidth`` caps all of the device's
    cross-device traffic together (None: no shared cap beyond its links).

    >>> d = Device("gpu0", flops=3.12e14, memory=8e10, site="rack1", kind="A100-80GB")
    >>> d.to_dict()  # doctest: +NORMALIZE_WHITESPACE
    {'name': 'gpu0', 'flops': 312000000000000.0, 'memory': 80000000000.0,
     'site': 'rack1', 'kind': 'A100-80GB'}
    """

    name: str
    flops: float
    memory: float
    site: str = "default"
    kind: str | None = None
    efficiency: float | None = None
    nic_bandwidth: float | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.flops = float(self.flops)
        self.memory = float(self.memory)

    def to_dict(self) -> dict:
        """The device as a ``placer.cluster/v1`` device entry (see :class:`Device`)."""
        data = {"name": self.name, "flops": self.flops, "memory": self.memory,
                "site": self.site}
        for key in ("kind", "efficiency", "nic_bandwidth"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        data.update(self.extra)
        return data


@dataclass(frozen=True)
class LinkRule:
    """Bandwidth (bytes/s) and latency (s) for the pairs a rule covers.

    >>> LinkRule(1.25e9, 5e-5).bandwidth
    1250000000.0
    """

    bandwidth: float
    latency: float


class Cluster:
    """Devices plus full bandwidth and latency matrices.

    ``bandwidth[i, j]`` is bytes/s from device i to device j (``inf`` on the
    diagonal), ``latency[i, j]`` seconds (0 on the diagonal).

    >>> c = Cluster("pair", [Device("g0", 1e14, 4e10), Device("g1", 1e14, 4e10)],
    ...             bandwidth=[[0, 3e11], [1e11, 0]], latency=[[0, 5e-6], [5e-6, 0]])
    >>> c
    Cluster('pair', devices=2, sites=1, flops=2e+14)
    >>> c.link("g0", "g1"), c.link("g1", "g0")[0], float(c.bandwidth[0, 0])
    ((300000000000.0, 5e-06), 100000000000.0, inf)
    """

    def __init__(self, name: str, devices: Sequence[Device], bandwidth, latency, *,
                 rules: dict | None = None, meta: dict | None = None,
                 file: str | None = None):
        self.name = name
        self.devices = list(devices)
        self.meta = dict(meta or {})
        self._rules = rules
        if not self.devices:
            raise ClusterError("no devices", file=file, field="devices",
                               fix="list at least one device")
        self._index: dict[str, int] = {}
        for i, device in enumerate(self.devices):
            if device.name in self._index:
                raise ClusterError(f"device {device.name!r} is named twice", file=file,
                                   field=f"devices[{i}].name",
                                   fix="give every device a unique name")
            self._index[device.name] = i
        n = len(self.devices)
        self.bandwidth = np.array(bandwidth, dtype=float)
        self.latency = np.array(latency, dtype=float)
        for label, matrix in (("bandwidth", self.bandwidth), ("latency", self.latency)):
            if matrix.shape != (n, n):
                raise ClusterError(f"expected a {n}x{n} matrix, got shape {matrix.shape}",
                                   file=file, field=f"links.{label}",
                                   fix="one row per device, one column per device, in order")
        off = ~np.eye(n, dtype=bool)
        bad = off & ~(self.bandwidth > 0)
        if bad.any():
            i, j = map(int, np.argwhere(bad)[0])
            raise ClusterError(
                f"bandwidth {self.devices[i].name}->{self.devices[j].name} is "
                f"{self.bandwidth[i, j]!r}; it must be > 0", file=file, field="links",
                fix="give every link a positive bandwidth in bytes/s")
        bad = off & ~(np.isfinite(self.latency) & (self.latency >= 0))
        if bad.any():
            i, j = map(int, np.argwhere(bad)[0])
            raise ClusterError(
                f"latency {self.devices[i].name}->{self.devices[j].name} is "
                f"{self.latency[i, j]!r}; it must be finite and >= 0", file=file,
                field="links", fix="give every link a latency in seconds")
        np.fill_diagonal(self.bandwidth, np.inf)
        np.fill_diagonal(self.latency, 0.0)
        self.bandwidth.setflags(write=False)
        self.latency.setflags(write=False)

    # --- construction -----------------------------------------------------
    @classmethod
    def from_rules(cls, name: str, devices: Sequence[Device], *,
                   default: tuple[float, float],
                   sites: Iterable[tuple[str, str, float, float]] = (),
                   pairs: Iterable[tuple[str, str, float, float]] = (),
                   meta: dict | None = None) -> "Cluster":
        """Build matrices from a default link, site-pair rules ``(site_a,
        site_b, bandwidth, latency)`` (``site_a == site_b`` means within that
        site) and device-pair rules; later, more specific rules win.

        >>> devices = [Device(f"g{i}", 1e14, 4e10, site="dc" if i < 2 else "edge")
        ...            for i in range(3)]
        >>> c = Cluster.from_rules("lab", devices, default=(1e9, 1e-3),
        ...                        sites=[("dc", "dc", 3e11, 5e-6)],
        ...                        pairs=[("g1", "g2", 2e9, 5e-4)])
        >>> c.link("g0", "g1"), c.link("g0", "g2"), c.link("g2", "g1")
        ((300000000000.0, 5e-06), (1000000000.0, 0.001), (2000000000.0, 0.0005))
        """
        rules = {"default": {"bandwidth": default[0], "latency": default[1]},
                 "sites": [{"between": [a, b], "bandwidth": bw, "latency": lat}
                           for a, b, bw, lat in sites],
                 "pairs": [{"between": [a, b], "bandwidth": bw, "latency": lat}
                           for a, b, bw, lat in pairs]}
        if not rules["pairs"]:
            del rules["pairs"]
        return cls._from_links(name, list(devices), Fields(rules, "links", None, ClusterError),
                               meta=meta, file=None)

    @classmethod
    def _from_links(cls, name, devices, links: Fields, *, meta, file) -> "Cluster":
        n = len(devices)
        links.extras(documented_keys("cluster", "links"))
        if links.has("bandwidth") or links.has("latency"):
            bandwidth = _matrix(links, "bandwidth", n, positive=True)
            latency = _matrix(links, "latency", n, positive=False)
            return cls(name, devices, bandwidth, latency, meta=meta, file=file)
        default = links.mapping("default")
        default.extras(documented_keys("cluster", "link"))
        bandwidth = np.full((n, n), default.number("bandwidth", positive=True, unit="bytes/s"))
        latency = np.full((n, n), default.number("latency", unit="seconds"))
        by_site: dict[str, list[int]] = {}
        index = {}
        for i, device in enumerate(devices):
            by_site.setdefault(device.site, []).append(i)
            index[device.name] = i
        for kind, lookup in (("sites", by_site),
                             ("pairs", {d.name: [index[d.name]] for d in devices})):
            for k, raw in enumerate(links.sequence(kind, [])):
                rule = links.child(raw, f"{kind}[{k}]")
                rule.extras(documented_keys("cluster", "rule"))
                between = rule.sequence("between")
                if len(between) != 2 or not all(isinstance(x, str) for x in between):
                    rule.fail("between", f"expected two names, got {between!r}",
                              fix=f"write between: [a, b] with two {kind[:-1]} names")
                for end in between:
                    if end not in lookup:
                        known = ", ".join(sorted(lookup)) or "none"
                        rule.fail("between", f"unknown {kind[:-1]} {end!r}",
                                  fix=f"use one of: {known}")
                bw = rule.number("bandwidth", positive=True, unit="bytes/s")
                lat = rule.number("latency", unit="seconds")
                a, b = between
                for i in lookup[a]:
                    for j in lookup[b]:
                        bandwidth[i, j] = bandwidth[j, i] = bw
                        latency[i, j] = latency[j, i] = lat
        return cls(name, devices, bandwidth, latency, rules=links.data, meta=meta, file=file)

    # --- access -----------------------------------------------------------
    def __len__(self) -> int:
        return len(self.devices)

    def __repr__(self) -> str:
        return (f"Cluster({self.name!r}, devices={len(self)}, sites={len(self.sites())}, "
                f"flops={self.total_flops():.3g})")

    @property
    def names(self) -> list[str]:
        """Device names in order.

        >>> Cluster.preset("two-sites").names
        ['a0', 'a1', 'a2', 'a3', 'b0', 'b1', 'b2', 'b3']
        """
        return [d.name for d in self.devices]

    def index(self, name: str) -> int:
        """Position of device ``name``.

        >>> Cluster.preset("two-sites").index("b0")
        4
        """
        try:
            return self._index[name]
        except KeyError:
            raise ClusterError(f"unknown device {name!r}",
                               fix=f"use one of: {', '.join(self.names)}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def device(self, name: str) -> Device:
        """The device named ``name`` (:class:`ClusterError` if there is none).

        >>> Cluster.preset("two-sites").device("b0").kind
        'T4'
        """
        return self.devices[self.index(name)]

    def link(self, src: str, dst: str) -> tuple[float, float]:
        """(bandwidth bytes/s, latency s) from ``src`` to ``dst``.

        >>> c = Cluster.preset("two-sites")
        >>> c.link("a0", "a1"), c.link("a0", "b0")
        ((12500000000.0, 1e-05), (150000000.0, 0.035))
        """
        i, j = self.index(src), self.index(dst)
        return float(self.bandwidth[i, j]), float(self.latency[i, j])

    def sites(self) -> dict[str, list[str]]:
        """Site -> device names, in device order.

        >>> {site: len(names) for site, names in Cluster.preset("two-sites").sites().items()}
        {'oregon': 4, 'virginia': 4}
        """
        out: dict[str, list[str]] = {}
        for d in self.devices:
            out.setdefault(d.site, []).append(d.name)
        return out

    def total_flops(self) -> float:
        """Sum of the devices' peak FLOP/s.

        >>> Cluster.preset("a100x8").total_flops()
        2496000000000000.0
        """
        return float(sum(d.flops for d in self.devices))

    def total_memory(self) -> float:
        """Sum of the devices' memory in bytes.

        >>> Cluster.preset("a100x8").total_memory()
        640000000000.0
        """
        return float(sum(d.memory for d in self.devices))

    def subset(self, names: Iterable[str], name: str | None = None) -> "Cluster":
        """The cluster restricted to ``names`` (in this cluster's order).

        >>> sub = Cluster.preset("two-sites").subset(["b0", "a0"], name="pair")
        >>> sub.names, sub.link("a0", "b0")
        (['a0', 'b0'], (150000000.0, 0.035))
        """
        keep = set(names)
        for n in keep:
            self.index(n)
        idx = [i for i, d in enumerate(self.devices) if d.name in keep]
        sub = np.ix_(idx, idx)
        return Cluster(name or self.name, [self.devices[i] for i in idx],
                       self.bandwidth[sub], self.latency[sub], meta=self.meta)

    def without(self, names: Iterable[str]) -> "Cluster":
        """The cluster minus the devices ``names`` (e.g. failed ones).

        >>> Cluster.preset("two-sites").without(["a0", "b3"]).names
        ['a1', 'a2', 'a3', 'b0', 'b1', 'b2']
        """
        drop = set(names)
        for n in drop:
            self.index(n)
        return self.subset([d for d in self.names if d not in drop])

    # --- files ------------------------------------------------------------
    def to_dict(self) -> dict:
        """The cluster as a ``placer.cluster/v1`` document: its link rules when
        it was built from rules, else full matrices (``null`` on the diagonal).

        >>> d = Cluster.preset("two-sites").to_dict()
        >>> d["format"], len(d["devices"]), sorted(d["links"])
        ('placer.cluster/v1', 8, ['default', 'sites'])
        """
        data = {"format": FORMAT, "name": self.name}
        data.update(self.meta)
        data["devices"] = [d.to_dict() for d in self.devices]
        if self._rules is not None:
            data["links"] = self._rules
        else:
            data["links"] = {"bandwidth": _matrix_out(self.bandwidth),
                             "latency": _matrix_out(self.latency)}
        return data

    def fingerprint(self) -> str:
        """sha256 of devices and full link matrices (rule spelling ignored).

        >>> c = Cluster.preset("two-sites")
        >>> same = Cluster(c.name, c.devices, c.bandwidth, c.latency, meta=c.meta)
        >>> same.fingerprint() == c.fingerprint()
        True
        """
        data = {"devices": [d.to_dict() for d in self.devices],
                "bandwidth": _matrix_out(self.bandwidth),
                "latency": _matrix_out(self.latency)}
        return hashlib.sha256(canonical_json(data).encode()).hexdigest()

    def save(self, path: PathLike) -> None:
        """Write ``placer.cluster/v1`` YAML atomically.

        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "two-sites.yaml"
        >>> Cluster.preset("two-sites").save(path)
        >>> Cluster.load(path).fingerprint() == Cluster.preset("two-sites").fingerprint()
        True
        """
        import yaml
        atomic_write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False,
                                               default_flow_style=None, width=100))

    @classmethod
    def load(cls, path: PathLike, *, strict: bool | None = None) -> "Cluster":
        """Read a ``placer.cluster/v1`` YAML (or JSON) file; see :meth:`save`
        for an example. Unknown keys are warned about (a typo such as
        ``site:`` for ``sites:`` would silently fall back to defaults), or
        refused when ``strict``."""
        data = load_document(path, ClusterError)
        return cls.from_dict(data, file=str(path), strict=strict)

    @classmethod
    def from_dict(cls, data: dict, *, file: str | None = None,
                  strict: bool | None = None) -> "Cluster":
        """Build a cluster from a parsed ``placer.cluster/v1`` document.

        >>> c = Cluster.from_dict({
        ...     "format": "placer.cluster/v1", "name": "lab",
        ...     "devices": [{"name": "gpu", "count": 2, "flops": 1e14, "memory": 4e10}],
        ...     "links": {"default": {"bandwidth": 1e10, "latency": 1e-5}}})
        >>> c.names, c.link("gpu0", "gpu1")
        (['gpu0', 'gpu1'], (10000000000.0, 1e-05))
        """
        return wrap_errors(lambda: cls._from_dict(data, file), file, strict)

    @classmethod
    def _from_dict(cls, data: dict, file: str | None) -> "Cluster":
        top = Fields(data, "", file, ClusterError)
        check_format(top, FORMAT)
        name = top.string("name", default=Path(file).stem if file else "cluster")
        devices: list[Device] = []
        device_keys = documented_keys("cluster", "device")
        for k, raw in enumerate(top.limit("devices", top.sequence("devices"), MAX_DEVICES,
                                          "devices")):
            item = top.child(raw, f"devices[{k}]")
            base = item.string("name")
            count = item.count("count", MAX_DEVICES - len(devices), 1,
                               what=f" devices in a cluster ({len(devices):,} before it)"
                               if devices else " devices in a cluster")
            kind = item.get("kind")
            site = item.get("site", "default")
            for key, value in (("kind", kind), ("site", site)):
                if value is not None and not isinstance(value, str):
                    item.fail(key, f"expected a string, got {value!r}")
            # placer profile's figures, read by the cost models as numbers
            profiled = {key: item.number(key, None, unit="seconds", positive=positive)
                        for key, positive in (("op_overhead", False), ("task_overhead", False),
                                              ("measured_step", False), ("cpu_share", True),
                                              ("cpu_share_all", True))}
            efficiency = item.number("efficiency", None, positive=True)
            if efficiency is not None and efficiency > 1:
                item.fail("efficiency", f"must be in (0, 1], got {efficiency!r}")
            common = dict(
                flops=item.number("flops", positive=True, unit="FLOP/s"),
                memory=item.number("memory", positive=True, unit="bytes"),
                site=site, kind=kind, efficiency=efficiency,
                nic_bandwidth=item.number("nic_bandwidth", None, positive=True,
                                          unit="bytes/s"),
                extra=item.extras({"name", "count", "flops", "memory", "site", "kind",
                                   "efficiency", "nic_bandwidth", *profiled}, device_keys)
                | {key: value for key, value in profiled.items() if value is not None})
            names = [base] if count == 1 and not item.has("count") else \
                [f"{base}{i}" for i in range(count)]
            devices.extend(Device(name=n, **common) for n in names)
        seen: dict[str, int] = {}
        for k, d in enumerate(devices):
            if d.name in seen:
                raise ClusterError(f"device {d.name!r} is named twice", file=file,
                                   field="devices", fix="give every device a unique name")
            seen[d.name] = k
        if not devices:
            top.fail("devices", "no devices", fix="list at least one device")
        meta = top.extras({"format", "name", "devices", "links"}, documented_keys("cluster"))
        return cls._from_links(name, devices, top.mapping("links"), meta=meta, file=file)

    # --- shipped and local clusters ---------------------------------------
    @staticmethod
    def presets() -> list[str]:
        """Names of the shipped cluster scenarios.

        >>> "two-sites" in Cluster.presets() and "dtfm-worldwide" in Cluster.presets()
        True
        """
        folder = data_dir() / "clusters"
        return sorted(p.name.rsplit(".", 1)[0] for p in folder.glob("*.yaml"))

    @classmethod
    def preset(cls, name: str) -> "Cluster":
        """Load a shipped cluster scenario by name (see :meth:`presets`).

        >>> Cluster.preset("dtfm-worldwide")
        Cluster('dtfm-worldwide', devices=64, sites=8, flops=8e+15)
        """
        path = data_dir() / "clusters" / f"{name}.yaml"
        if not path.is_file():
            raise ClusterError(f"unknown preset {name!r}",
                               fix=f"use one of: {', '.join(cls.presets())}")
        return cls.load(path)

    @classmethod
    def local(cls) -> "Cluster":
        """This machine: its CPU and any CUDA GPUs, with nominal speeds and
        PCIe/NVLink-class links (calibrate with ``placer profile``).

        >>> local = Cluster.local()
        >>> local.names[0], local.device("cpu").site
        ('cpu', 'local')
        """
        import torch
        cores = os.cpu_count() or 1
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            memory = 8e9
        devices = [Device("cpu", flops=cores * 3.2e10, memory=float(memory), site="local",
                          kind="cpu")]
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                devices.append(Device(f"cuda:{i}", flops=_gpu_peak_flops(props.name),
                                      memory=float(props.total_memory), site="local",
                                      kind=props.name))
        n = len(devices)
        bandwidth = np.full((n, n), 1.6e10)
        latency = np.full((n, n), 1e-5)
        for i in range(1, n):
            for j in range(1, n):
                if i != j and torch.cuda.can_device_access_peer(i - 1, j - 1):
                    bandwidth[i, j] = 1.0e11
                    latency[i, j] = 5e-6
        return cls("local", devices, bandwidth, latency)


_GPU_PEAKS = [("H200", 9.89e14), ("H100", 9.89e14), ("A100", 3.12e14), ("A10", 1.25e14),
              ("L40", 1.81e14), ("L4", 1.21e14), ("A6000", 1.55e14), ("V100", 1.25e14),
              ("T4", 6.5e13), ("4090", 1.65e14), ("3090", 7.1e13)]


def _gpu_peak_flops(name: str) -> float:
    """Dense fp16/bf16 tensor-core peak for known GPU names (else a guess)."""
    for key, peak in _GPU_PEAKS:
        if key in name.upper():
            return peak
    return 5e13


def _matrix(links: Fields, key: str, n: int, positive: bool) -> np.ndarray:
    rows = links.sequence(key)
    if len(rows) != n or not all(isinstance(r, list) and len(r) == n for r in rows):
        links.fail(key, f"expected {n} rows of {n} numbers",
                   fix="one row per device, one column per device, in order")
    out = np.zeros((n, n))
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            if i == j and value is None:
                continue
            field_name = f"{key}[{i}][{j}]"
            out[i, j] = links.check_number(value, field_name, positive=positive and i != j,
                                           allow_inf=i == j,
                                           unit="bytes/s" if positive else "seconds")
    return out


def _matrix_out(matrix: np.ndarray) -> list[list]:
    return [[None if not math.isfinite(v) else float(v) for v in row] for row in matrix]
