import os
import sys

import pytest
from hypothesis import settings

# Deterministic by default (CI must not fail on a newly drawn example);
# HYPOTHESIS_PROFILE=explore draws fresh examples on every run.
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

os.environ.setdefault("MPLBACKEND", "Agg")
# every point-to-point message of the ranks travels with tag 0, as NCCL
# matches them (by order alone); tests/test_schedule.py keeps a run with tags
os.environ.setdefault("PLACER_P2P_TAG0", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels():
    """Compile (fresh checkout) or load the cost models' numba kernels once,
    before any test: a test with a time budget must not spend it compiling."""
    from placer.cost.warmup import warm_up
    warm_up()


@pytest.fixture
def tiny_graph():
    from placer import Edge, Graph, Op
    return Graph("tiny", [
        Op("x", "input", output_bytes=4096),
        Op("fc1", "linear", flops=2e9, param_bytes=4e6, output_bytes=8192),
        Op("act", "relu", output_bytes=8192),
        Op("fc2", "linear", flops=2e9, param_bytes=4e6, output_bytes=4096),
    ], [Edge("x", "fc1", 4096), Edge("fc1", "act", 8192), Edge("act", "fc2", 8192)])
