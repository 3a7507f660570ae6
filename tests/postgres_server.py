"""A throwaway PostgreSQL server for tests: ``initdb`` into a temp dir, the
server on a free loopback port (and a unix socket in that dir), one database
and one password-protected role, stopped (``pg_ctl stop -m immediate``) and
deleted afterwards.

PostgreSQL refuses to run as root, so as root the server runs as the
``postgres`` user (or ``nobody``) with the temp dir handed to it. The server
process is a child of the test process that gets SIGQUIT (PostgreSQL's
immediate shutdown) if the test process dies, so a killed test run leaves no
server behind either.

Binaries are looked up on PATH, then in ``/usr/lib/postgresql/*/bin``
(Debian's ``postgresql`` package, which ``make postgres`` installs).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time

USER, PASSWORD, DATABASE = "placer", "s3cret-pw", "placer"


def bindir() -> str | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl") and shutil.which("postgres"):
        return os.path.dirname(os.path.realpath(found))
    for path in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if all(os.access(os.path.join(path, b), os.X_OK) for b in ("initdb", "pg_ctl",
                                                                   "postgres")):
            return path
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged user to run the server as (None: as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists")


_prctl = ctypes.CDLL(None, use_errno=True).prctl     # looked up before any fork


def _die_with_parent() -> None:
    # immediate shutdown of the postmaster (and so its backends) if we die;
    # runs in the child after its switch to the server's user
    _prctl(1, int(signal.SIGQUIT))      # PR_SET_PDEATHSIG


def _base_dir(other_user: bool) -> str | None:
    """Where the server's folder goes: a RAM disk when there is a roomy one
    (creating and deleting a cluster's thousands of files on a busy disk
    took 8 s), else /tmp when the server runs as another user ($TMPDIR may
    be a folder that user cannot enter), else the default temp folder."""
    with contextlib.suppress(OSError):
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= 1 << 30 and os.access("/dev/shm", os.W_OK):
            return "/dev/shm"
    return "/tmp" if other_user else None


class PostgresServer:
    """One server; :meth:`start` returns its URL, :meth:`stop` ends it."""

    def __init__(self, bin_dir: str):
        self.bin = bin_dir
        self.user = _run_as()
        self.root = tempfile.mkdtemp(prefix="placer-pg-", dir=_base_dir(self.user is not None))
        self.data = os.path.join(self.root, "data")
        self.log = os.path.join(self.root, "server.log")
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)

    def _cmd(self, *args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        cred = {} if self.user is None else {"user": self.user.pw_uid,
                                             "group": self.user.pw_gid, "extra_groups": []}
        return subprocess.run(list(args), check=check, capture_output=True, text=True,
                              cwd=self.root, timeout=60, **cred, **kwargs)

    def _tool(self, name: str) -> str:
        return os.path.join(self.bin, name)

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the database over TCP, with the password."""
        return self.url_of(DATABASE)

    def url_of(self, database: str, password: str = PASSWORD) -> str:
        """The URL of ``database`` on this server."""
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        self._cmd(self._tool("createdb"), "-h", self.root, "-p", str(self.port), "-U", USER,
                  name)
        return self.url_of(name)

    def start(self) -> str:
        pwfile = os.path.join(self.root, "pw")
        with open(pwfile, "w") as f:
            f.write(PASSWORD + "\n")
        if self.user is not None:
            os.chown(pwfile, self.user.pw_uid, self.user.pw_gid)
        # local (socket) connections trusted, TCP ones need the password
        self._cmd(self._tool("initdb"), "-D", self.data, "-U", USER, f"--pwfile={pwfile}",
                  "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8",
                  "--no-sync", "--locale=C")
        for attempt in range(3):
            self.port = _free_port()
            if self._launch():
                break
        else:
            raise RuntimeError(f"PostgreSQL did not start: {self.tail()}")
        return self.create_database(DATABASE)

    def _launch(self) -> bool:
        cred = {} if self.user is None else {"user": self.user.pw_uid,
                                             "group": self.user.pw_gid, "extra_groups": []}
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [self._tool("postgres"), "-D", self.data, "-p", str(self.port), "-k", self.root,
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=50"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.root,
            preexec_fn=_die_with_parent, **cred)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:     # e.g. the port was taken meanwhile
                self.proc = None
                return False
            ready = self._cmd(self._tool("pg_isready"), "-q", "-h", self.root, "-p",
                              str(self.port), "-U", USER, check=False)
            if ready.returncode == 0:
                return True
            time.sleep(0.05)
        self.stop()
        return False

    def tail(self, lines: int = 20) -> str:
        """The end of the server's log (for failure messages)."""
        with contextlib.suppress(OSError), open(self.log, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
        return "(no log)"

    def stop(self) -> None:
        """Immediate shutdown, then delete the data."""
        if self.proc is not None:
            self._cmd(self._tool("pg_ctl"), "stop", "-D", self.data, "-m", "immediate",
                      "-s", check=False)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres(bin_dir: str):
    """A running server for the ``with`` block (its ``url`` names a ready
    database); stopped afterwards, also when starting it or the block fails."""
    server = PostgresServer(bin_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()
