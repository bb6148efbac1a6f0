"""Throwaway PostgreSQL and MariaDB servers for the test suite.

Each server lives in its own directory, listens on a free port on 127.0.0.1
and is stopped when the test process ends. The URL of a server is exported in
the environment so that worker subprocesses started by the tests connect to
the same server instead of starting their own.

This module imports nothing from Django: settings use it to build their
DATABASES before Django is configured.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from tests.processes import ServerProcess, tail

START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
POLL_INTERVAL = 0.05

ENV_VARS = {
    "postgres": "EVERYSTEP_TEST_PG_URL",
    "mariadb": "EVERYSTEP_TEST_MARIADB_URL",
    "pgbouncer": "EVERYSTEP_TEST_PGBOUNCER_URL",
}
FIX = "run `make test`, which installs it, or scripts/install-test-deps"
PG_OS_USER = "everystep-test"
# Both servers ask for a password over TCP, as production servers do, so
# that wrong credentials can be tested.
PASSWORD = "everystep-test-password"
# PgBouncer's server connections per database and user: fewer than a test's
# workers hold, so that they share them as a pooler's clients do.
PGBOUNCER_POOL_SIZE = 10

_lock = threading.RLock()  # PgBouncer starts PostgreSQL under it
_started: dict[str, DatabaseServer] = {}
_temp_dirs: dict[str, Path] = {}


@dataclass(eq=False)
class DatabaseServer(ServerProcess):
    """A database server process that this process started and can stop, start and restart."""

    backend: str
    url: str
    port: int
    base_dir: Path
    command: list
    ready_command: list  # exits 0 once the server accepts connections
    stop_signal: int = signal.SIGTERM
    run_as: dict = field(default_factory=dict)  # Popen's user/group/extra_groups

    start_timeout = START_TIMEOUT
    stop_timeout = STOP_TIMEOUT
    poll_interval = POLL_INTERVAL

    def __post_init__(self):
        super().__init__()

    @property
    def log_path(self) -> Path:
        return self.base_dir / "server.log"

    @property
    def where(self) -> str:
        return f"{self.backend} server on port {self.port}"

    def __repr__(self) -> str:
        return f"<DatabaseServer {self.backend} {self.url} pid={self.pid}>"

    def start(self) -> None:
        """Start the server on its port and data dir; return once it accepts connections."""
        self.launch(self.command, cwd=self.base_dir, env=_clean_env(), **self.run_as)

    def ready(self) -> bool:
        """Whether a real connection succeeds."""
        return _succeeds(self.ready_command)

    def restart(self) -> None:
        """Stop the server and start it again with the same data and port."""
        self.stop()
        self.start()


def start_postgres(base_dir: Path) -> DatabaseServer:
    """Create a cluster in base_dir, start it and create the database `everystep`.

    Runs as an unprivileged OS user when this process is root, since
    PostgreSQL refuses to run as root.
    """
    bin_dir = _postgres_bin_dir()
    base_dir = Path(base_dir)
    base_dir.mkdir(parents=True, exist_ok=True)
    data = base_dir / "data"
    run_as = {}
    if os.geteuid() == 0:
        uid, gid = _postgres_os_user()
        os.chown(base_dir, uid, gid)
        _let_others_traverse(base_dir)
        run_as = {"user": uid, "group": gid, "extra_groups": []}
    # --no-sync only skips initdb's own flush of a throwaway cluster; the
    # server keeps its default durability.
    password_file = base_dir / "password"
    password_file.write_text(PASSWORD + "\n")
    if run_as:
        os.chown(password_file, run_as["user"], run_as["group"])
    initdb = [bin_dir / "initdb", "-D", data, "-U", "everystep", f"--pwfile={password_file}"]
    initdb += ["--auth-local=trust", "--auth-host=scram-sha-256"]
    initdb += ["--encoding=UTF8", "--locale=C", "--no-sync"]
    _run(initdb, base_dir, run_as)

    port = free_port()
    host = ["-h", "127.0.0.1", "-p", str(port), "-U", "everystep"]
    server = DatabaseServer(
        backend="postgres",
        url=f"postgres://everystep:{PASSWORD}@127.0.0.1:{port}/everystep",
        port=port,
        base_dir=base_dir,
        command=[
            bin_dir / "postgres",
            "-D",
            data,
            "-p",
            str(port),
            "-h",
            "127.0.0.1",
            "-k",
            data,
            "-c",
            "max_connections=200",
            # What each statement cost, and how often it ran: the many-workers
            # test counts the claims in it.
            "-c",
            "shared_preload_libraries=pg_stat_statements",
        ],
        ready_command=[bin_dir / "pg_isready", "-q", "-t", "5", *host, "-d", "postgres"],
        # SIGINT is PostgreSQL's fast shutdown; SIGTERM would wait for every
        # client (a worker still connected) to disconnect on its own.
        stop_signal=signal.SIGINT,
        run_as=run_as,
    )
    server.start()
    try:
        _run([bin_dir / "createdb", *host, "everystep"], base_dir, env={"PGPASSWORD": PASSWORD})
    except BaseException:
        server.stop()
        raise
    return server


def start_mariadb(base_dir: Path) -> DatabaseServer:
    """Create a data dir in base_dir, start MariaDB and create the database `everystep`.

    `root` connects over TCP from 127.0.0.1 with the password `PASSWORD`.
    """
    mariadbd, install_db, admin = _mariadb_binaries()
    base_dir = Path(base_dir)
    base_dir.mkdir(parents=True, exist_ok=True)
    data = base_dir / "data"
    # mariadbd refuses to run as root unless told to.
    as_root = ["--user=root"] if os.geteuid() == 0 else []
    _run(
        [
            install_db,
            "--no-defaults",
            f"--datadir={data}",
            "--skip-test-db",
            "--auth-root-authentication-method=normal",
            "--skip-name-resolve",
            *as_root,
        ],
        base_dir,
    )

    # Run by the server before it accepts connections, at every start (it is
    # idempotent): no client has to log in over the socket first.
    init_file = base_dir / "init.sql"
    init_file.write_text(
        "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';\n"
        f"ALTER USER 'root'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}';\n"
        "GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;\n"
        "CREATE DATABASE IF NOT EXISTS everystep CHARACTER SET utf8mb4;\n"
    )
    port = free_port()
    server = DatabaseServer(
        backend="mariadb",
        url=f"mysql://root:{PASSWORD}@127.0.0.1:{port}/everystep",
        port=port,
        base_dir=base_dir,
        command=[
            mariadbd,
            "--no-defaults",
            f"--datadir={data}",
            f"--port={port}",
            "--bind-address=127.0.0.1",
            f"--socket={base_dir / 'mysqld.sock'}",
            f"--pid-file={base_dir / 'mysqld.pid'}",
            *as_root,
            "--skip-name-resolve",
            "--max-connections=300",
            "--innodb-buffer-pool-size=128M",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_unicode_ci",
            "--innodb-buffer-pool-load-at-startup=OFF",
            "--innodb-buffer-pool-dump-at-shutdown=OFF",
            f"--init-file={init_file}",
        ],
        ready_command=[
            admin,
            "--no-defaults",
            "--protocol=tcp",
            "-h",
            "127.0.0.1",
            "-P",
            str(port),
            "-u",
            "root",
            "--connect-timeout=5",
            "ping",
        ],
    )
    server.start()
    return server


def start_pgbouncer(base_dir: Path, postgres_url: str | None = None) -> DatabaseServer:
    """Start PgBouncer in transaction mode in front of the PostgreSQL at
    `postgres_url` (by default the test server, started first if need be),
    as a platform's pooler stands in front of its database: every database
    name passes through, the password is checked (SCRAM), the pool is
    smaller than the clients it serves, and a client's transactions go to
    its server connections in turn (as they do under other clients' load,
    not to the one it used last). Its admin console is the database
    ``pgbouncer`` (`pgbouncer_admin`)."""
    pgbouncer = shutil.which("pgbouncer", path="/usr/sbin:/usr/bin:/sbin:" + os.environ["PATH"])
    if pgbouncer is None:
        raise RuntimeError(f"PgBouncer not found (pgbouncer): {FIX}")
    postgres = urllib.parse.urlsplit(postgres_url or server_url("postgres"))
    base_dir = Path(base_dir)
    base_dir.mkdir(parents=True, exist_ok=True)
    run_as = {}
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        uid, gid = _postgres_os_user()
        os.chown(base_dir, uid, gid)
        _let_others_traverse(base_dir)
        run_as = {"user": uid, "group": gid, "extra_groups": []}
    port = free_port()
    (base_dir / "userlist.txt").write_text(f'"everystep" "{PASSWORD}"\n')
    (base_dir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host=127.0.0.1 port={postgres.port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = scram-sha-256\n"
        f"auth_file = {base_dir / 'userlist.txt'}\n"
        "admin_users = everystep\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {PGBOUNCER_POOL_SIZE}\n"
        "server_round_robin = 1\n"
        "max_client_conn = 1000\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"pidfile = {base_dir / 'pgbouncer.pid'}\n"
    )
    for name in ("userlist.txt", "pgbouncer.ini"):
        if run_as:
            os.chown(base_dir / name, run_as["user"], run_as["group"])
    pg_isready = _postgres_bin_dir() / "pg_isready"
    server = DatabaseServer(
        backend="pgbouncer",
        url=f"postgres://everystep:{PASSWORD}@127.0.0.1:{port}/everystep",
        port=port,
        base_dir=base_dir,
        command=[pgbouncer, base_dir / "pgbouncer.ini"],
        ready_command=[pg_isready, "-q", "-t", "5", "-h", "127.0.0.1", "-p", str(port)],
        stop_signal=signal.SIGINT,  # PgBouncer's immediate shutdown
        run_as=run_as,
    )
    server.start()
    return server


def pgbouncer_admin(command: str, pgbouncer_url: str | None = None) -> list:
    """Run `command` (``RECONNECT``, ``PAUSE``, ``SHOW POOLS`` …) on the
    admin console of the PgBouncer at `pgbouncer_url` (by default the
    test one) and return its rows."""
    import psycopg  # only the tests that drive PgBouncer need the driver here

    url = urllib.parse.urlsplit(pgbouncer_url or server_url("pgbouncer"))
    with psycopg.connect(
        host="127.0.0.1",
        port=url.port,
        user="everystep",
        password=PASSWORD,
        dbname="pgbouncer",
        autocommit=True,
    ) as admin:
        cursor = admin.execute(command)
        return cursor.fetchall() if cursor.description else []


_STARTERS = {"postgres": start_postgres, "mariadb": start_mariadb, "pgbouncer": start_pgbouncer}


def server_url(backend: str) -> str:
    """URL of the test server for backend: the one in the environment, or one started here.

    A server started here is started once per process, exported under the
    same environment variable for child processes, and stopped by stop_all().
    """
    var = _env_var(backend)
    with _lock:
        if backend in _started:
            os.environ[var] = _started[backend].url
        if os.environ.get(var):
            return os.environ[var]
        base_dir = Path(tempfile.mkdtemp(prefix=f"everystep-{backend}-"))
        try:
            server = _STARTERS[backend](base_dir)
        except BaseException:
            shutil.rmtree(base_dir, ignore_errors=True)
            raise
        _temp_dirs[backend] = base_dir
        _started[backend] = server
        os.environ[var] = server.url
        return server.url


def running_server(backend: str) -> DatabaseServer | None:
    """The server for backend that this process started, None if it came from the environment."""
    _env_var(backend)
    return _started.get(backend)


def stop_all() -> None:
    """Stop every server this process started and remove their temporary directories."""
    with _lock:
        for backend, server in list(_started.items()):
            # A forked child inherits the registry, but the servers are its parent's.
            if not server.owned_here():
                continue
            server.stop()
            if os.environ.get(ENV_VARS[backend]) == server.url:
                del os.environ[ENV_VARS[backend]]
            shutil.rmtree(_temp_dirs.pop(backend), ignore_errors=True)
            del _started[backend]


atexit.register(stop_all)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_base_port(*offsets: int) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, and so were the
    ports `offsets` above it (honcho gives its processes base, base + 100, …)."""
    while True:
        base = free_port()
        try:
            with contextlib.ExitStack() as held:
                for offset in offsets:
                    sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        return base


def _env_var(backend: str) -> str:
    try:
        return ENV_VARS[backend]
    except KeyError:
        raise ValueError(f"no test server for backend {backend!r}") from None


def _postgres_bin_dir() -> Path:
    """Directory of the newest installed PostgreSQL server binaries."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda d: [int(p) if p.isdigit() else 0 for p in Path(d).parent.name.split(".")],
        reverse=True,
    )
    on_path = shutil.which("postgres")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    needed = ("initdb", "postgres", "pg_isready", "createdb")
    for bin_dir in map(Path, candidates):
        if all((bin_dir / name).exists() for name in needed):
            return bin_dir
    raise RuntimeError(f"PostgreSQL server not found (/usr/lib/postgresql/*/bin/postgres): {FIX}")


def _mariadb_binaries() -> tuple[str, str, str]:
    """Paths of mariadbd, mariadb-install-db and mariadb-admin."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
    names = ("mariadbd", "mariadb-install-db", "mariadb-admin")
    found = [shutil.which(name, path=path) for name in names]
    if not all(found):
        raise RuntimeError(f"MariaDB server not found (mariadbd): {FIX}")
    return tuple(found)


def _postgres_os_user() -> tuple[int, int]:
    """uid and gid of an unprivileged user to run PostgreSQL as, creating one if needed."""
    for name in ("postgres", PG_OS_USER):
        try:
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
        except KeyError:
            pass
    useradd = shutil.which("useradd", path="/usr/sbin:/sbin:/usr/bin") or "useradd"
    # Another test process may create it at the same moment: only the result counts.
    subprocess.run(
        [
            useradd,
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            PG_OS_USER,
        ],
        capture_output=True,
    )
    try:
        entry = pwd.getpwnam(PG_OS_USER)
    except KeyError:
        raise RuntimeError(f"could not create OS user {PG_OS_USER} to run PostgreSQL") from None
    return entry.pw_uid, entry.pw_gid


def _let_others_traverse(path: Path) -> None:
    """Give `others` search permission on path and its parents (not read: no listing)."""
    for directory in [path, *path.resolve().parents]:
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(directory, stat.S_IMODE(mode) | stat.S_IXOTH)


def _run(command: list, cwd: Path, run_as: dict | None = None, env: dict | None = None) -> None:
    """Run a setup command, its output appended to cwd/server.log; raise if it fails."""
    log_path = Path(cwd) / "server.log"
    with open(log_path, "ab") as log:
        status = subprocess.call(
            [str(c) for c in command],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**_clean_env(), **(env or {})},
            **(run_as or {}),
        )
    if status != 0:
        name = Path(str(command[0])).name
        raise RuntimeError(f"{name} failed ({status}); log {log_path}:\n{tail(log_path)}")


def _succeeds(command: list) -> bool:
    """True if command exits 0 within 10 s."""
    try:
        return (
            subprocess.call(
                [str(c) for c in command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=_clean_env(),
                timeout=10,
            )
            == 0
        )
    except subprocess.TimeoutExpired:
        return False


def _clean_env() -> dict[str, str]:
    """The environment without PG*/MYSQL* variables, which would redirect the client tools."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PG", "MYSQL"))}
