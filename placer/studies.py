"""Optuna studies in an RDB shared by workers: SQLite on one host,
PostgreSQL across hosts.

:func:`open_storage` turns a storage URL into an
:class:`optuna.storages.RDBStorage` that ``placer tune`` and the ``optuna``
strategy share. Workers send a heartbeat while a trial runs; a worker that
dies (killed, its machine lost) leaves its trial RUNNING with a stale
heartbeat, and the next worker that starts a trial marks it FAIL and queues
the same parameters again (Optuna's ``RetryHeartbeatStaleTrialCallback``),
so nothing is lost or left dangling.

``postgresql://USER:PASSWORD@HOST[:PORT]/DB`` uses whichever driver is
installed, psycopg 3 (``pip install 'placer[postgres]'``) or psycopg2.
A bad URL, an unreachable server, a wrong password, a missing database or
a missing driver is one :class:`~placer.errors.StrategyError` line naming
the fix, with the password hidden:

>>> safe_url("postgresql://tuner:hunter2@db.lab:5432/placer")
'postgresql://tuner:***@db.lab:5432/placer'
>>> open_storage("postgres://tuner:hunter2@db.lab/placer")
Traceback (most recent call last):
...
placer.errors.StrategyError: --storage: not a storage URL: 'postgres://tuner:***@db.lab/placer' (fix: write postgresql://USER:PASSWORD@HOST[:PORT]/DATABASE, or sqlite:///FILE)
"""

from __future__ import annotations

import importlib.util
import time
import warnings

from .errors import StrategyError

#: PostgreSQL drivers tried for a plain ``postgresql://`` URL, in order
DRIVERS = (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2"))
#: seconds between a running trial's heartbeats (a dead worker's trial is
#: failed and retried once its heartbeat is 2x this old)
HEARTBEAT = 60
#: times one trial's parameters are retried after the workers running them died
MAX_RETRY = 3
URL_FIX = "write postgresql://USER:PASSWORD@HOST[:PORT]/DATABASE, or sqlite:///FILE"
INSTALL_FIX = "pip install 'placer[postgres]' (the psycopg driver)"


def safe_url(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    cred, host = rest.rsplit("@", 1)
    if ":" not in cred:
        return url
    return f"{scheme}://{cred.split(':', 1)[0]}:***@{host}"


def _password(url: str) -> str | None:
    if "://" not in url or "@" not in url:
        return None
    cred = url.split("://", 1)[1].rsplit("@", 1)[0]
    return cred.split(":", 1)[1] if ":" in cred else None


def driver_url(url: str, field: str = "--storage") -> str:
    """``url`` with an installed PostgreSQL driver named (``postgresql+psycopg``
    for a plain ``postgresql://``); other URLs unchanged."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme in ("postgres", "psql", "pg"):
        raise StrategyError(f"not a storage URL: {safe_url(url)!r}", field=field, fix=URL_FIX)
    if scheme != "postgresql":
        return url
    for module, with_driver in DRIVERS:
        if importlib.util.find_spec(module) is not None:
            return with_driver + url[len(scheme):]
    raise StrategyError("no PostgreSQL driver is installed for "
                        f"{safe_url(url)!r}", field=field, fix=INSTALL_FIX)


def _engine_kwargs(url: str) -> dict:
    if url.startswith("sqlite"):
        # wait for locks held by other workers instead of failing
        return {"connect_args": {"timeout": 60}}
    if url.startswith(("postgresql+psycopg", "postgresql+psycopg2")):
        # an unreachable host fails in seconds, not after the TCP timeout;
        # a worker idle through a server restart reconnects
        return {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
    return {}


def _retry_callback():
    import optuna
    # optuna >= 4.9 renamed RetryFailedTrialCallback
    cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) \
        or optuna.storages.RetryFailedTrialCallback
    return cls(max_retry=MAX_RETRY)


def _storage(url: str, heartbeat: int | None):
    import inspect

    import optuna
    kwargs: dict = {"engine_kwargs": _engine_kwargs(url)}
    if heartbeat:
        kwargs["heartbeat_interval"] = int(heartbeat)
        # optuna >= 4.9 renamed failed_trial_callback
        params = inspect.signature(optuna.storages.RDBStorage).parameters
        name = ("heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params
                else "failed_trial_callback")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if heartbeat:
            kwargs[name] = _retry_callback()
        return optuna.storages.RDBStorage(url, **kwargs)


def open_storage(url: str, *, heartbeat: int | None = HEARTBEAT, field: str = "--storage",
                 attempts: int = 3):
    """An :class:`optuna.storages.RDBStorage` for ``url`` with heartbeats
    every ``heartbeat`` seconds (None or 0: none, so a dead worker's trial
    stays RUNNING). Raises :class:`StrategyError` (one line, no password)
    when the URL, the driver, the server or the database is wrong. Workers
    that create a new database's tables at the same moment retry."""
    import sqlalchemy.exc
    if heartbeat is not None and (int(heartbeat) != heartbeat or heartbeat < 0):
        raise StrategyError(f"heartbeat must be a whole number of seconds >= 0, got "
                            f"{heartbeat!r}", field="--heartbeat" if field.startswith("--")
                            else "heartbeat")
    if not isinstance(url, str) or "://" not in url:
        raise StrategyError(f"not a storage URL: {safe_url(str(url))!r}", field=field,
                            fix=URL_FIX)
    if url.split("://", 1)[1].split("/", 1)[0].count("@") > 1:
        raise StrategyError(f"the storage URL holds '@' more than once: "
                            f"{safe_url(url).split('@')[-1]!r}", field=field,
                            fix="write an '@' in the user or password as %40")
    full = driver_url(url, field)
    secret = _password(url)

    def fail(message: str, fix: str) -> StrategyError:
        text = f"cannot open study storage {safe_url(url)!r}: {message}"
        if secret:
            text = text.replace(secret, "***")
        return StrategyError(" ".join(text.split()), field=field, fix=fix)

    for attempt in range(attempts):
        try:
            return _storage(full, heartbeat)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as exc:
            # another worker is creating the same tables right now
            if attempt == attempts - 1:
                raise fail(_driver_message(exc), "start the workers again") from None
            time.sleep(0.5 * (attempt + 1))
        except sqlalchemy.exc.OperationalError as exc:
            message = _driver_message(exc)
            if "password authentication failed" in message:
                fix = "check the user and password in the URL"
            elif "does not exist" in message:
                fix = "create it on the server, e.g. createdb -h HOST -U USER DATABASE"
            elif url.startswith("sqlite"):
                fix = "check that the file's folder exists and is writable"
            else:
                fix = "start the server, or check the host, port and firewall in the URL"
            raise fail(message, fix) from None
        except (sqlalchemy.exc.NoSuchModuleError, sqlalchemy.exc.ArgumentError):
            raise fail("unknown URL form", URL_FIX) from None
        except ImportError:
            fix = (INSTALL_FIX if full.startswith(("postgresql+psycopg", "postgresql+psycopg2"))
                   else "install the Python driver the URL names, or use postgresql:// "
                        "(pip install 'placer[postgres]') or sqlite:///FILE")
            raise fail("its database driver is not installed", fix) from None
        except sqlalchemy.exc.SQLAlchemyError as exc:
            raise fail(_driver_message(exc), "check the URL and the server") from None
        except RuntimeError as exc:
            if "compatib" not in str(exc):
                raise
            raise fail("the study tables were written by another optuna version",
                       "run optuna storage upgrade --storage URL") from None
    raise AssertionError("unreachable")


def _driver_message(exc) -> str:
    """The driver's own message, without SQLAlchemy's wrapping."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc)
    return " ".join(line.strip() for line in text.splitlines()
                    if line.strip() and not line.startswith("(Background"))


def stale_trials_failed(study) -> None:
    """Fail (and queue again) the trials of workers whose heartbeat stopped."""
    import optuna
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


__all__ = ["open_storage", "safe_url", "driver_url", "stale_trials_failed", "HEARTBEAT",
           "MAX_RETRY"]
