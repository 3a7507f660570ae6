"""The README's Python example runs as written."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_python_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    code = code.replace('time_budget=10', 'time_budget=3')  # same call, shorter search
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600, env={"PYTHONPATH": str(ROOT),
                                                      "MPLBACKEND": "Agg", "PATH": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    measured, predicted = out.stdout.strip().splitlines()[-1].split()
    assert float(measured) > 0 and float(predicted) > 0
    assert (tmp_path / "plan.json").exists() and (tmp_path / "step.trace.json").exists()
