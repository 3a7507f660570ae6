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


def test_readme_pictures_and_links_exist():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)\)", text)
    local = [t for t in targets if "://" not in t]
    assert any(t.endswith(".png") for t in local)
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing
    for png in (t for t in local if t.endswith(".png")):
        assert (ROOT / png).read_bytes()[:4] == b"\x89PNG", png


def test_readme_cli_commands_name_real_subcommands():
    from placer.cli import build_parser
    text = (ROOT / "README.md").read_text()
    known = set(build_parser()._subparsers._group_actions[0].choices)
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
    inline = "\n".join(re.findall(r"`(placer [^`]+)`", text))
    used = set(re.findall(r"^\s*placer ([a-z]+)", blocks + "\n" + inline, re.M))
    assert used and used <= known, used - known
