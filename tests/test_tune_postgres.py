"""placer tune and the optuna strategy on a real PostgreSQL server (started
here, see postgres_server.py): two workers split one study, a worker killed
mid-trial is recovered from, the strategy shares and resumes a study, and a
bad URL, a dead server or a missing driver is one line without the password.

Without the server binaries or a driver the tests skip, except under CI
(``CI`` set), where ``.ci/run`` installs both and a skip would hide a break.
"""

import collections
import datetime
import functools
import importlib.util
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

import postgres_server as pgs

ROOT = pathlib.Path(__file__).resolve().parent.parent
CASE = "layered-n30-w3-s0@two-sites"


def _require(ok: bool, why: str) -> None:
    if ok:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{why}; .ci/run installs it (make postgres, pip install '.[postgres]')")
    pytest.skip(why)


@pytest.fixture(scope="session")
def pg_server():
    _require(_driver(), "no PostgreSQL driver (pip install 'placer[postgres]')")
    bin_dir = pgs.bindir()
    _require(bin_dir is not None, "PostgreSQL server binaries (initdb, pg_ctl) not found")
    with pgs.postgres(bin_dir) as server:
        yield server


def _driver() -> bool:
    return any(importlib.util.find_spec(m) is not None for m in ("psycopg", "psycopg2"))


@pytest.fixture
def pg_url(pg_server, request):
    """A fresh database on the tests' shared server, for this test alone."""
    return pg_server.create_database(re.sub(r"\W", "_", request.node.name)[:50].lower())


def _env() -> dict:
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return dict(os.environ, PYTHONPATH=path, MPLBACKEND="Agg")


def _placer(*args: str, cwd=None) -> subprocess.Popen:
    """A ``placer`` command as its own process, as a worker on another host runs it."""
    return subprocess.Popen([sys.executable, "-m", "placer.cli", *args], cwd=cwd, env=_env(),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _tune(url: str, study: str, *args: str) -> subprocess.Popen:
    return _placer("tune", "--case", CASE, "--storage", url, "--study", study, *args)


def _finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert pgs.PASSWORD not in out + err
    return out


@functools.lru_cache(maxsize=None)
def _storage(url: str):
    from placer.studies import open_storage
    return open_storage(url, heartbeat=None)


def _trials(url: str, study: str):
    import optuna
    return optuna.load_study(study_name=study, storage=_storage(url)).get_trials(deepcopy=False)


def _states(trials) -> collections.Counter:
    return collections.Counter(t.state.name for t in trials)


def test_two_workers_split_one_study(pg_url, tmp_path):
    # both start at once on an empty database: they race to create its tables
    procs = [_tune(pg_url, "split", "--trials", "3", "--evaluations", "60", "--json",
                   "-o", str(tmp_path / f"w{i}.json")) for i in range(2)]
    outs = [json.loads(_finish(p)) for p in procs]
    trials = _trials(pg_url, "split")
    assert _states(trials) == {"COMPLETE": 6}
    assert sorted(t.number for t in trials) == list(range(6))   # no number twice
    by_worker = collections.Counter(t.user_attrs["worker"] for t in trials)
    assert sorted(by_worker.values()) == [3, 3]
    best = min(t.value for t in trials)
    for i, out in enumerate(outs):
        assert 3 <= out["trials"] <= 6 and out["value"] >= best
        assert out["storage"] == pg_url.replace(pgs.PASSWORD, "***")
        assert json.loads((tmp_path / f"w{i}.json").read_text()) == out


def test_workers_racing_to_create_the_tables_all_get_the_study(pg_url):
    # three workers open a fresh database at the same instant (each waits,
    # imports done, for a line on stdin): all but one collide creating
    # optuna's tables (a unique or duplicate-table error) and retry, and all
    # then share the one study
    code = ("import sys, optuna; from placer.studies import open_storage; "
            "print('ready', flush=True); sys.stdin.readline(); "
            "s = optuna.create_study(study_name='race', storage=open_storage(sys.argv[1]), "
            "load_if_exists=True); s.enqueue_trial({'x': 1.0}); print(s._study_id)")
    procs = [subprocess.Popen([sys.executable, "-c", code, pg_url], env=_env(), text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(3)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.communicate()[1][-2000:]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    ids = {_finish(p).strip() for p in procs}
    assert len(ids) == 1 and len(_trials(pg_url, "race")) == 3


def test_killed_worker_is_recovered_and_nothing_lost(pg_url, tmp_path):
    cmd = ("--total-trials", "4", "--heartbeat", "1")
    first = _tune(pg_url, "resume", *cmd, "--evaluations", "300", "-o", str(tmp_path / "a.json"))
    try:
        # SIGKILL it in the first half of a trial, once two trials are done
        # and this one's settings are drawn (the half: of the shortest done)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and first.poll() is None:
            try:
                trials = _trials(pg_url, "resume")
            except KeyError:        # the study does not exist yet
                trials = []
            done = [t.duration for t in trials if t.state.name == "COMPLETE"]
            running = [t for t in trials if t.state.name == "RUNNING" and len(t.params) == 8]
            if len(done) >= 2 and running and \
                    datetime.datetime.now() - running[0].datetime_start < min(done) / 2:
                first.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
    finally:
        first.kill()
        first.communicate()
    assert first.returncode == -signal.SIGKILL
    before = _trials(pg_url, "resume")
    killed = [t for t in before if t.state.name == "RUNNING"]
    assert len(killed) == 1, _states(before)
    completed = {t.number: (t.value, t.params) for t in before if t.state.name == "COMPLETE"}
    assert len(completed) >= 2

    time.sleep(2.5)     # the killed worker's heartbeat is now older than the grace period
    # the same command again (shorter trials): it finishes the study
    out = _finish(_tune(pg_url, "resume", *cmd, "--evaluations", "100",
                        "-o", str(tmp_path / "b.json")))
    assert "best of 4 trial(s)" in out
    after = {t.number: t for t in _trials(pg_url, "resume")}
    states = _states(after.values())
    assert states == {"COMPLETE": 4, "FAIL": 1}, states     # nothing RUNNING or WAITING
    assert after[killed[0].number].state.name == "FAIL"
    for number, (value, params) in completed.items():
        assert (after[number].state.name, after[number].value, after[number].params) == \
            ("COMPLETE", value, params)
    retried = [t for t in after.values()
               if t.system_attrs.get("failed_trial") == killed[0].number]
    assert len(retried) == 1 and retried[0].state.name == "COMPLETE"
    assert retried[0].params == killed[0].params
    assert json.loads((tmp_path / "b.json").read_text())["trials"] == 4
    # the study is done: the same command again runs no trial
    from placer.tune import tune_main
    assert tune_main(["--case", CASE, "--storage", pg_url, "--study", "resume", *cmd,
                      "-o", str(tmp_path / "c.json")]) == 0
    assert len(_trials(pg_url, "resume")) == 5


def test_optuna_strategy_shares_and_resumes_a_study(pg_url):
    import placer
    from placer.errors import StrategyError
    from placer.search import optimize_with_report
    g = placer.datasets.layered(30, width=3, seed=0)
    c = placer.Cluster.preset("two-sites")

    def run(seed, graph=g, **options):
        return optimize_with_report(graph, c, "optuna", seed=seed, time_budget=None,
                                    evaluations=300, final_cost_model="analytical",
                                    trials=5, **options)

    alone, _ = run(0)
    first, first_report = run(0, storage=pg_url, study="plan")
    # a lone worker on a fresh study: the same trials and plan as in memory
    assert first.placement == alone.placement and first.extra["optuna"]["study_trials"] == 5
    assert pgs.PASSWORD not in json.dumps(first.extra)
    second, second_report = run(1, storage=pg_url, study="plan")
    trials = _trials(pg_url, "plan")
    assert _states(trials) == {"COMPLETE": 10} and second.extra["optuna"]["study_trials"] == 10
    # the second run returns the best plan of both runs' trials
    assert second_report.objective == pytest.approx(min(t.value for t in trials))
    assert second_report.objective <= first_report.objective
    # the study is bound to its problem
    other = placer.datasets.layered(30, width=3, seed=1)
    with pytest.raises(StrategyError, match="another problem"):
        run(0, graph=other, storage=pg_url, study="plan")


def _error_line(capsys, args) -> str:
    from placer.tune import tune_main
    assert tune_main(["--case", CASE, "--trials", "1", "-o", "", *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("placer tune: error: --storage:"), captured.err
    assert pgs.PASSWORD not in captured.out + captured.err
    return lines[0]


def test_bad_storage_is_one_line_without_the_password(pg_server, pg_url, capsys):
    port = pg_server.port
    wrong = pg_url.replace(pgs.PASSWORD, "not-" + pgs.PASSWORD)
    assert "check the user and password" in _error_line(capsys, ["--storage", wrong])
    nodb = pg_server.url_of("no_such_db")
    assert "createdb" in _error_line(capsys, ["--storage", nodb])
    down = pg_url.replace(f":{port}/", f":{pgs._free_port()}/")
    assert "start the server" in _error_line(capsys, ["--storage", down])
    bad = pg_url.replace("postgresql://", "postgres://")
    assert "write postgresql://" in _error_line(capsys, ["--storage", bad])
    assert "write postgresql://" in _error_line(capsys, ["--storage", "db.lab/placer"])


def test_missing_driver_is_one_line_naming_the_extra():
    # the real entry point, in a process where neither driver can be imported
    # (it fails before connecting: no server needed)
    pg_url = f"postgresql://{pgs.USER}:{pgs.PASSWORD}@127.0.0.1:5432/{pgs.DATABASE}"
    code = ("import sys; sys.modules['psycopg'] = sys.modules['psycopg2'] = None; "
            "from placer.cli import main; sys.exit(main())")
    out = subprocess.run([sys.executable, "-c", code, "tune", "--case", CASE,
                          "--storage", pg_url], env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'placer[postgres]'" in lines[0], out.stderr
    assert pgs.PASSWORD not in out.stdout + out.stderr


def _readme_recipe() -> list[str]:
    """The commands of README's shared-study section, one string each."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Shared studies on PostgreSQL")
    section = text[start:text.find("\n## ", start + 3)]
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", section, re.S))
    lines = re.sub(r"\\\n\s*", " ", blocks).splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def test_readme_shared_study_recipe_runs_as_written(pg_server, tmp_path):
    recipe = _readme_recipe()
    assert recipe[0] == "pip install 'placer[postgres]'"
    setup = [c.split() for c in recipe if c.split()[0] in ("createuser", "createdb")]
    tune = [c.split() for c in recipe if c.startswith("placer tune")]
    assert len(setup) == 2 and len(tune) == 1, recipe
    # the database host's part, against this server; without a controlling
    # terminal (setsid) the password prompt reads stdin
    url = next(a for a in tune[0] if a.startswith("postgresql://"))
    password = url.split("://")[1].split("@")[0].split(":")[1]
    connect = ["-h", pg_server.root, "-p", str(pg_server.port), "-U", pgs.USER]
    for cmd in setup:
        done = subprocess.run([os.path.join(pg_server.bin, cmd[0]), *cmd[1:], *connect],
                              input=f"{password}\n{password}\n", capture_output=True,
                              text=True, timeout=60, preexec_fn=os.setsid)
        assert done.returncode == 0, done.stderr
    # each machine's part: the same command in two processes, a smaller study
    args = [a.replace("@db-host:5432/", f"@127.0.0.1:{pg_server.port}/") for a in tune[0][1:]]
    total = args.index("--total-trials") + 1
    assert int(args[total]) > 4
    args[total] = "4"
    procs = []
    for i in range(2):
        (tmp_path / f"m{i}").mkdir()
        procs.append(_placer(*args, "--case", CASE, "--evaluations", "60",
                             cwd=tmp_path / f"m{i}"))
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        assert password not in out + err
    study = args[args.index("--study") + 1]
    stored = url.replace("@db-host:5432/", f"@127.0.0.1:{pg_server.port}/")
    trials = _trials(stored, study)
    done = [t for t in trials if t.state.name == "COMPLETE"]
    # each worker stops once the study holds 4; the other may be mid-trial then
    assert 4 <= len(done) <= 5 and len(done) == len(trials)
    assert len({t.user_attrs["worker"] for t in done}) == 2
    output = args[args.index("-o") + 1]
    assert all((tmp_path / f"m{i}" / output).exists() for i in range(2))
