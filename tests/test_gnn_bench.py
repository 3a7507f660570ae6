"""``placer bench learned`` on one tiny case with a tiny policy."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("torch_geometric")

from gnn.checkpoint import save_policy  # noqa: E402
from gnn.model import PlacementPolicy, PolicyConfig  # noqa: E402


def test_bench_learned_writes_rows_and_summary(tmp_path, capsys):
    from placer.bench.learned import bench_learned
    from placer.search import strategies
    torch.manual_seed(0)
    save_policy(tmp_path / "p", PlacementPolicy(PolicyConfig(hidden=16, layers=1)))
    out = tmp_path / "bench.json"
    result = bench_learned(["unet.module"], ["edge-wireless"], time_budget=1.0, finetune=0.3,
                           checkpoint=tmp_path / "p", samples=4, out=out)
    data = json.loads(out.read_text())
    row = data["rows"][0]
    for key in ("greedy", "zero_shot", "fine_tuned"):
        assert row[key]["step_time"] > 0 and row[key]["plan_seconds"] >= 0
    if "evolution" in strategies():
        assert row["hybrid"]["step_time"] > 0
        assert data["summary"]["cases"] == 1
        assert result["summary"]["zero_shot_vs_evolution_gmean"] > 0
    assert "unet.module" in capsys.readouterr().out
