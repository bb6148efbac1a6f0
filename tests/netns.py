"""A real kernel network partition on 127.0.0.1, inside a private network
namespace.

`Namespace()` creates a network namespace whose only interface is its own
loopback, up, with 127.0.0.1; nothing in it can reach the host's network or
be reached from it. What the tests start in it talks over that loopback:

- `ns.popen(cmd, ...)` / `ns.run(cmd, ...)` start a process inside
  (through `nsenter`); `ns.command(cmd)` is the command line that does so,
  for a caller that starts the process itself.
- `ns.call(func, *args)` runs func on a thread of this process that entered
  the namespace: sockets func opens (a driver connection) live in the
  namespace and stay there whichever thread uses them later.
- `ns.start_server("postgres" | "mariadb")` starts a throwaway database
  server inside, the way `tests/servers.py` starts the suite's own.
- `ns.partition(port)` adds nftables rules that silently DROP every TCP
  packet to and from that port as it arrives (input hook; no RST, no
  ICMP): the sender's kernel believes the packet left, as on a real
  network. `ns.partition(port, group)` cuts off only the processes started
  under that group id (`ns.command(cmd, group)`): one host of several.
  Connections stay ESTABLISHED, the kernel retransmits, connects
  time out, keepalives and TCP user timeouts fire. `ns.heal()`
  deletes the rules; retransmitted data is then delivered, so a query sent
  during the partition completes once the peer's next retransmission gets
  through (retransmissions back off exponentially: after a long partition
  that can take as long again).

Leaving the context stops every server and process it started, by PID
(SIGTERM, then SIGKILL of the process's own group), and the namespace goes
with its last process. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), `nsenter`
and `nft` (scripts/install-test-deps installs nftables); `NamespaceError`
says which step failed otherwise.

Run as `python -m tests.netns serve BACKEND DIR`, this module is the helper
that starts a server inside the namespace and stops it when its standard
input closes.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.processes import ServerProcess, kill_group, stop_process

REPO = Path(__file__).resolve().parent.parent
TABLE = "everystep_partition"
CUT_MARK = 0x4242  # conntrack's mark on the connections of a group cut off alone
SERVER_START_TIMEOUT = 120.0
SERVER_STOP_TIMEOUT = 40.0
PROCESS_STOP_TIMEOUT = 10.0
COMMAND_TIMEOUT = 30.0
TOOL_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
FIX = "scripts/install-test-deps installs it"

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


class NamespaceError(RuntimeError):
    """The namespace, or a partition in it, could not be made."""


class ServerHelper(ServerProcess):
    """The process that runs a database server inside a namespace (this
    module, run as ``serve``): it prints the server's URL, port and PID on
    one line, and stops the server when its standard input closes."""

    start_timeout = SERVER_START_TIMEOUT
    stop_timeout = PROCESS_STOP_TIMEOUT
    poll_interval = 0.05
    error = NamespaceError

    def __init__(self, backend: str, base_dir: Path):
        super().__init__()
        self.where = f"the helper of a {backend} server in the namespace"
        self.log_path = base_dir / "helper.log"
        self._output = b""

    def ready(self) -> bool:
        """Whether the helper has printed its server's line."""
        stdout = self.process.stdout
        if select.select([stdout], [], [], 0)[0]:
            self._output += os.read(stdout.fileno(), 4096)
        return b"\n" in self._output

    def info(self) -> dict:
        """The server's URL, port and PID, as the helper printed them."""
        return json.loads(self._output.split(b"\n", 1)[0])


@dataclass(eq=False)
class NamespacedServer:
    """A database server inside a namespace, run by a helper process that stops it."""

    backend: str
    url: str
    port: int
    pid: int  # the server's own process, a child of the helper
    helper: ServerHelper
    base_dir: Path
    namespace_id: str

    def stop(self) -> None:
        """Stop the server (the helper stops it when its stdin closes); kill it if it lingers."""
        if self.helper.pid is not None:
            self.helper.process.stdin.close()
            try:
                self.helper.process.wait(SERVER_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
        self.helper.stop()  # SIGTERM, then SIGKILL, if it still runs
        # A helper that died first left its server behind: kill it while it
        # is still the process inside the namespace (its PID not reused).
        if _namespace_of(self.pid) == self.namespace_id:
            kill_group(self.pid)
        shutil.rmtree(self.base_dir, ignore_errors=True)


class Namespace:
    """A private network namespace with only its loopback (see the module doc)."""

    def __init__(self):
        self._fd = None
        self.id = None  # e.g. "net:[4026532174]", the readlink of /proc/PID/ns/net
        self._processes: list[subprocess.Popen] = []
        self._servers: list[NamespacedServer] = []
        self._partitioned: set[int] = set()

    def __enter__(self) -> Namespace:
        self.open()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def open(self) -> None:
        """Create the namespace and bring its loopback up."""
        if self._fd is not None:
            return
        self._nsenter = _tool("nsenter")
        self._nft = _tool("nft")
        self._fd = _on_thread(_new_namespace)
        self.id = os.readlink(f"/proc/self/fd/{self._fd}")

    @property
    def path(self) -> str:
        """A path to the namespace, for `nsenter --net=` and `setns`."""
        if self._fd is None:
            raise NamespaceError("the namespace is not open")
        return f"/proc/{os.getpid()}/fd/{self._fd}"

    def command(self, cmd, group: int | None = None) -> list[str]:
        """cmd prefixed so that it runs inside the namespace (nsenter execs it:
        same PID); with `group`, under that group id, so that
        `partition(port, group)` can cut it off alone."""
        setgid = [] if group is None else [f"--setgid={int(group)}"]
        return [self._nsenter, f"--net={self.path}", *setgid, "--", *map(str, cmd)]

    def popen(self, cmd, **popen) -> subprocess.Popen:
        """Start cmd inside, in a session of its own; it is stopped by close()."""
        popen.setdefault("stdin", subprocess.DEVNULL)
        popen.setdefault("start_new_session", True)
        process = subprocess.Popen(self.command(cmd), **popen)
        self._processes.append(process)
        return process

    def run(self, cmd, timeout=COMMAND_TIMEOUT, **options) -> subprocess.CompletedProcess:
        """Run cmd inside to completion (killed by PID if it outlives timeout)."""
        if "input" not in options:
            options.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(self.command(cmd), timeout=timeout, **options)

    def call(self, func, *args, timeout=COMMAND_TIMEOUT, **kwargs):
        """func(*args, **kwargs) on a thread inside the namespace; its result or exception."""
        fd = self._fd
        if fd is None:
            raise NamespaceError("the namespace is not open")

        def inside():
            os.setns(fd, os.CLONE_NEWNET)
            return func(*args, **kwargs)

        return _on_thread(inside, timeout)

    def start_server(self, backend: str) -> NamespacedServer:
        """Start a PostgreSQL or MariaDB server inside, on 127.0.0.1 of the namespace."""
        base_dir = Path(tempfile.mkdtemp(prefix=f"everystep-netns-{backend}-"))
        helper = ServerHelper(backend, base_dir)
        try:
            helper.launch(
                self.command([sys.executable, "-m", "tests.netns", "serve", backend, base_dir]),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
        except BaseException:
            log_text = (base_dir / "helper.log").read_text(errors="replace")
            shutil.rmtree(base_dir, ignore_errors=True)
            raise NamespaceError(f"{backend} server in the namespace failed:\n{log_text}") from None
        info = helper.info()
        server = NamespacedServer(
            backend, info["url"], info["port"], info["pid"], helper, base_dir, self.id
        )
        self._servers.append(server)
        return server

    def partition(self, port: int, group: int | None = None) -> None:
        """Silently drop every TCP packet to and from port as it arrives in the
        namespace. With `group`, only the connections of the processes started
        under that group id (`command(cmd, group)`) are cut, the way one host
        loses the network while the others keep it: what they send to port is
        dropped as it leaves, and conntrack marks the connection it left on,
        so that what arrives on that connection is dropped too (from the
        first packet the process sends on it, an ACK included)."""
        port = int(port)
        chain = f"inet {TABLE} input"
        if group is None:
            rules = f"add rule {chain} tcp dport {port} drop\n"
            rules += f"add rule {chain} tcp sport {port} drop\n"
        else:
            out = f"inet {TABLE} output"
            rules = (
                f"add chain {out} {{ type filter hook output priority 0 ; policy accept ; }}\n"
                f"add rule {out} meta skgid {int(group)} tcp dport {port} "
                f"ct mark set {CUT_MARK} drop\n"
                f"add rule {chain} ct mark {CUT_MARK} drop\n"
            )
        self._nft_script(
            f"add table inet {TABLE}\n"
            f"add chain {chain} {{ type filter hook input priority 0 ; policy accept ; }}\n" + rules
        )
        self._partitioned.add(port)

    def heal(self) -> None:
        """Remove every partition: packets flow again."""
        if self._partitioned:
            self._nft_script(f"delete table inet {TABLE}\n")
            self._partitioned.clear()

    @property
    def partitioned(self) -> frozenset[int]:
        return frozenset(self._partitioned)

    def processes_inside(self) -> list[int]:
        """PIDs of the processes now in the namespace (all started through it)."""
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                if _namespace_of(int(entry)) == self.id:
                    pids.append(int(entry))
        return pids

    def close(self) -> None:
        """Stop every process and server started inside, by PID; release the namespace."""
        if self._fd is None:
            return
        for process in reversed(self._processes):
            stop_process(process, timeout=PROCESS_STOP_TIMEOUT)
        for server in reversed(self._servers):
            server.stop()
        self._processes.clear()
        self._servers.clear()
        self._partitioned.clear()
        self._sweep()
        os.close(self._fd)
        self._fd = None

    def _sweep(self) -> None:
        """SIGKILL what is left inside (a server's orphaned child); wait until none is."""
        deadline = time.monotonic() + PROCESS_STOP_TIMEOUT
        while pids := self.processes_inside():
            if time.monotonic() > deadline:
                raise NamespaceError(f"processes {pids} still inside the namespace")
            for pid in pids:
                _kill(pid)
            time.sleep(0.05)

    def _nft_script(self, script: str) -> None:
        result = self.run([self._nft, "-f", "-"], input=script.encode(), capture_output=True)
        if result.returncode != 0:
            error = result.stderr.decode(errors="replace").strip()
            raise NamespaceError(f"nft -f - failed ({result.returncode}): {error}\n{script}")


def _new_namespace() -> int:
    """On a thread of its own: unshare its network namespace, bring lo up, return an fd to it."""
    import socket

    try:
        os.unshare(os.CLONE_NEWNET)
    except OSError as exc:
        raise NamespaceError(f"unshare(CLONE_NEWNET) failed: {exc}") from exc
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
    return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def _on_thread(func, timeout=COMMAND_TIMEOUT):
    """func() on a new thread (a namespace change dies with it); its result or exception."""
    outcome = {}

    def target():
        try:
            outcome["result"] = func()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="netns", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{func!r} still running inside the namespace after {timeout} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _tool(name: str) -> str:
    path = shutil.which(name, path=TOOL_PATH)
    if path is None:
        raise NamespaceError(f"{name} not found: {FIX}")
    return path


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _namespace_of(pid: int) -> str | None:
    """The network namespace of a live process, e.g. 'net:[4026532174]'; None if gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _serve(backend: str, base_dir: str) -> None:
    """Start a server in base_dir, print its URL, port and PID; stop it when stdin closes."""
    from tests import servers

    start = {"postgres": servers.start_postgres, "mariadb": servers.start_mariadb}[backend]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    server = start(Path(base_dir))
    try:
        info = {"url": server.url, "port": server.port, "pid": server.pid}
        print(json.dumps(info), flush=True)
        sys.stdin.buffer.read()
    finally:
        server.stop()


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"] or len(sys.argv) != 4:
        sys.exit("usage: python -m tests.netns serve postgres|mariadb DIR")
    _serve(sys.argv[2], sys.argv[3])
