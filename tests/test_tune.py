"""placer tune: a shared RDB study, resumable, two workers at once."""

import json
import multiprocessing

import pytest

from placer.tune import tune, tune_main

CASES = ["layered-n30-w3-s0@two-sites"]


def _worker(url, out):
    tune(CASES, trials=2, storage=url, study="shared", evaluations=60, output=out, seed=None)


def test_two_workers_share_one_sqlite_study(tmp_path):
    optuna = pytest.importorskip("optuna")
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    # create the study first so the workers do not race to create its tables
    tune(CASES, trials=1, storage=url, study="shared", evaluations=60,
         output=str(tmp_path / "first.json"))
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(url, str(tmp_path / f"w{i}.json")))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    study = optuna.load_study(study_name="shared", storage=url)
    assert len([t for t in study.trials if t.state.name == "COMPLETE"]) == 5
    best = json.loads((tmp_path / "w1.json").read_text())
    assert best["trials"] >= 3 and set(best["config"]) >= {"population", "crossover"}


def test_tune_main_resumes(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 't.db'}"
    out = tmp_path / "best.json"
    args = ["--case", CASES[0], "--trials", "1", "--storage", url, "--evaluations", "40",
            "-o", str(out), "--seed", "0"]
    assert tune_main(args) == 0
    assert tune_main(args) == 0
    assert json.loads(out.read_text())["trials"] == 2
    assert tune_main(["--case", "nonsense", "--storage", url]) == 2


@pytest.mark.parametrize("url, fix", [
    ("sqlite:////no/such/folder/t.db", "folder exists"),
    ("postgres://tuner:hunter2@db.lab/placer", "write postgresql://"),
    ("db.lab/placer", "write postgresql://"),
    ("mysql://tuner:hunter2@db.lab/placer", "install the Python driver"),
    ("postgresql://tuner:hun@ter2@db.lab/placer", "%40"),
])
def test_bad_storage_is_one_line_naming_the_fix(url, fix, capsys):
    assert tune_main(["--case", CASES[0], "--trials", "1", "--storage", url, "-o", ""]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and fix in err, err
    assert err.startswith("placer tune: error: --storage:") and "hunter2" not in err


def test_safe_url_hides_the_password():
    from placer.studies import safe_url
    assert safe_url("postgresql://u:p%40ss@h:5/db") == "postgresql://u:***@h:5/db"
    assert safe_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert safe_url("sqlite:///t.db") == "sqlite:///t.db"


def test_optuna_strategy_refuses_a_bad_storage_url_at_once():
    from placer.errors import StrategyError
    from placer.search import get_strategy
    with pytest.raises(StrategyError, match="storage: not a storage URL") as err:
        get_strategy("optuna", storage="postgres://u:hunter2@h/db")
    assert "hunter2" not in str(err.value)
