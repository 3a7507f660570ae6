"""Describe a GPU server as a placer cluster from ``nvidia-smi`` output.

Parses the text of

    nvidia-smi --query-gpu=name,memory.total --format=csv
    nvidia-smi topo -m

(samples below; pass ``--smi FILE --topo FILE`` to read your own), gives each
GPU a peak FLOP/s from a small table of dense fp16/bf16 tensor-core peaks,
prices each pair of GPUs by how ``topo -m`` says they connect (``NV#``: # NVLink
links; ``PIX``/``PXB``/``PHB``/``NODE``/``SYS``: PCIe paths, slower the more
bridges and CPU sockets they cross), saves a ``placer.cluster/v1`` YAML, loads
it back and shows it, then plans GPT-350M on it.

    python examples/cluster_from_nvidia_smi.py          # ~1 s
    nvidia-smi --query-gpu=name,memory.total --format=csv > smi.csv
    nvidia-smi topo -m > topo.txt
    python examples/cluster_from_nvidia_smi.py --smi smi.csv --topo topo.txt -o mybox.yaml

Prints the parsed GPUs, the bandwidth matrix, the YAML and ``cluster box: ...``.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

import numpy as np

import placer
from placer.cli import show_cluster

# A workstation: two A100s joined by an NVLink bridge (12 links), two RTX
# A6000s joined by theirs (4 links), the pairs on different CPU sockets.
SAMPLE_SMI = """\
name, memory.total [MiB]
NVIDIA A100 80GB PCIe, 81920 MiB
NVIDIA A100 80GB PCIe, 81920 MiB
NVIDIA RTX A6000, 49140 MiB
NVIDIA RTX A6000, 49140 MiB
"""

SAMPLE_TOPO = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV12\tSYS\tSYS\t0-15,32-47\t0\t\tN/A
GPU1\tNV12\t X \tSYS\tSYS\t0-15,32-47\t0\t\tN/A
GPU2\tSYS\tSYS\t X \tNV4\t16-31,48-63\t1\t\tN/A
GPU3\tSYS\tSYS\tNV4\t X \t16-31,48-63\t1\t\tN/A

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""

# Dense fp16/bf16 tensor-core peak FLOP/s; the first key found in the name wins.
PEAK_FLOPS = [("H200", 9.89e14), ("H100", 9.89e14), ("A100", 3.12e14), ("A6000", 1.55e14),
              ("L40", 1.81e14), ("A10", 1.25e14), ("L4", 1.21e14), ("V100", 1.25e14),
              ("T4", 6.5e13), ("4090", 1.65e14), ("3090", 7.1e13)]
NVLINK_PER_LINK = 2.5e10        # bytes/s per NVLink link and direction (NVLink 3)
PCIE = {"PIX": (2.4e10, 8e-6), "PXB": (2.2e10, 9e-6), "PHB": (2.0e10, 1e-5),
        "NODE": (1.8e10, 1.2e-5), "SYS": (1.2e10, 1.6e-5)}   # PCIe 4.0 x16 and worse
NVLINK_LATENCY = 4e-6


def peak_flops(name: str) -> float:
    for key, peak in PEAK_FLOPS:
        if key in name.upper():
            return peak
    raise SystemExit(f"no peak FLOP/s known for {name!r}: add it to PEAK_FLOPS")


def parse_smi(text: str) -> list[tuple[str, float]]:
    """``name, memory.total [MiB]`` CSV -> [(name, bytes)]."""
    rows = []
    for line in text.strip().splitlines()[1:]:
        name, memory = (x.strip() for x in line.rsplit(",", 1))
        value, unit = memory.split()
        rows.append((name, float(value) * {"MiB": 2**20, "GiB": 2**30}[unit]))
    return rows


def parse_topo(text: str) -> list[list[str]]:
    """The GPU-to-GPU block of ``nvidia-smi topo -m`` (``X`` on the diagonal)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = lines[0].split("\t")
    gpus = [h.strip() for h in header if re.fullmatch(r"GPU\d+", h.strip())]
    matrix = []
    for line in lines[1:]:
        cells = [c.strip() for c in line.split("\t")]
        if not re.fullmatch(r"GPU\d+", cells[0]):
            break
        matrix.append(cells[1:1 + len(gpus)])
    if len(matrix) != len(gpus):
        raise SystemExit(f"topo: expected {len(gpus)} GPU rows, got {len(matrix)}")
    return matrix


def link(kind: str) -> tuple[float, float]:
    """(bytes/s, seconds) of one ``topo -m`` connection."""
    match = re.fullmatch(r"NV(\d+)", kind)
    if match:
        return int(match.group(1)) * NVLINK_PER_LINK, NVLINK_LATENCY
    if kind in PCIE:
        return PCIE[kind]
    raise SystemExit(f"unknown connection {kind!r} in topo -m output")


def build(smi: str, topo: str, name: str = "box") -> placer.Cluster:
    gpus = parse_smi(smi)
    kinds = parse_topo(topo)
    if len(gpus) != len(kinds):
        raise SystemExit(f"{len(gpus)} GPUs in the CSV but {len(kinds)} in topo -m")
    devices = [placer.Device(f"cuda:{i}", flops=peak_flops(n), memory=mem, site=name,
                             kind=n.removeprefix("NVIDIA ").replace(" ", "-"))
               for i, (n, mem) in enumerate(gpus)]
    n = len(devices)
    bandwidth, latency = np.full((n, n), np.inf), np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i != j:
                bandwidth[i, j], latency[i, j] = link(kinds[i][j])
    return placer.Cluster(name, devices, bandwidth, latency,
                          meta={"source": "nvidia-smi --query-gpu + topo -m"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smi", help="file with the --query-gpu CSV (default: the sample)")
    parser.add_argument("--topo", help="file with the topo -m matrix (default: the sample)")
    parser.add_argument("-o", "--output", help="YAML to write (default: in a temp folder)")
    args = parser.parse_args(argv)
    smi = Path(args.smi).read_text() if args.smi else SAMPLE_SMI
    topo = Path(args.topo).read_text() if args.topo else SAMPLE_TOPO

    cluster = build(smi, topo)
    for d in cluster.devices:
        print(f"{d.name}: {d.kind}, {d.memory / 2**30:.0f} GiB, {d.flops / 1e12:.0f} TFLOP/s")
    print("\nbandwidth GB/s (row -> column):")
    print("        " + "".join(f"{n:>8}" for n in cluster.names))
    for n, row in zip(cluster.names, cluster.bandwidth):
        print(f"{n:>8}" + "".join(f"{'-' if np.isinf(b) else f'{b / 1e9:.0f}':>8}" for b in row))

    path = Path(args.output or Path(tempfile.mkdtemp(prefix="placer-smi-")) / "box.yaml")
    cluster.save(path)
    loaded = placer.Cluster.load(path)
    assert loaded.fingerprint() == cluster.fingerprint()
    print(f"\nwrote {path}; it loads back identical (fingerprint "
          f"{loaded.fingerprint()[:12]}). The YAML:\n")
    print(path.read_text())
    print(show_cluster(loaded)[1])

    graph = placer.datasets.graph("gpt-350m.module")
    plan = placer.optimize(graph, loaded, method="pipeline_dp", seed=0, time_budget=5)
    report = placer.simulate(graph, loaded, plan)
    groups = sorted({tuple(ds) for ds in plan.placement.values()})
    print(f"\n{graph.name} on {loaded.name} by pipeline_dp: step {report.step_time * 1e3:.1f} ms, "
          f"stages on {[list(g) for g in groups]}, {plan.microbatches} microbatches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
