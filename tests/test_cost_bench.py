"""The cost benchmark's quick mode runs, prints a table and writes JSON."""

import json

from placer.bench.cost import bench_cost, kendall_tau


def test_quick_bench_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    result = bench_cost(quick=True, out=out, seconds=0.05)
    data = json.loads(out.read_text())
    assert data["rows"] == result["rows"]
    row = data["rows"][0]
    assert row["ops"] == 100 and row["devices"] == 4
    assert row["sim_per_s"] > 0 and row["analytical_per_s"] > 0
    assert row["analytical_fresh_per_s"] > 0 and row["analytical_array_per_s"] > 0
    assert -1.0 <= row["kendall_tau"] <= 1.0
    assert data["memory"]["estimates"] > 0
    assert "sim/s" in capsys.readouterr().out


def test_kendall_tau_hand_values():
    assert kendall_tau([1, 2, 3], [1, 2, 3]) == 1.0
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    # 3 concordant, 1 discordant... pairs: (1,2)+ (1,3)+ (1,4)+ (2,3)- (2,4)+ (3,4)+
    assert abs(kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) - 4 / 6) < 1e-12
