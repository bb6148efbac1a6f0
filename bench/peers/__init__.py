"""Peers measured beside everystep, on the same PostgreSQL server in the
same run: DBOS Transact and Procrastinate.

Each peer runs in a virtualenv of its own, ``.venv-bench-peers`` (made by
``make bench`` from ``bench/requirements-peers.txt``), so that its
dependencies never mix with everystep's: its script (``dbos_bench.py``,
``procrastinate_bench.py``) runs there as a subprocess, against a fresh
database, and prints one JSON object of figures. A peer that cannot run is
reported as not measured, with the reason.
"""

import json
import pathlib

from bench import harness
from bench.common import ROOT

PYTHON = ROOT / ".venv-bench-peers" / "bin" / "python"
HERE = pathlib.Path(__file__).resolve().parent
PACKAGES = ("dbos", "procrastinate")


def available():
    """None when the peers' virtualenv is there, else why it is not."""
    if not PYTHON.exists():
        return "no .venv-bench-peers: `make bench` creates it from bench/requirements-peers.txt"
    return None


def versions():
    """The peers' package versions in their virtualenv (empty without it)."""
    if available():
        return {}
    script = (
        "import importlib.metadata as m, json\n"
        f"print(json.dumps({{p: m.version(p) for p in {PACKAGES!r}}}))"
    )
    try:
        return json.loads(harness.run([str(PYTHON), "-c", script], None, 60, "peer versions"))
    except (harness.SectionFailed, ValueError):
        return {}


def measure(peer, url, *args, timeout=600):
    """Run `peer`'s script against the PostgreSQL database at `url`; its
    figures, or ``{"not_measured": reason}``."""
    reason = available()
    if reason:
        return {"not_measured": reason}
    command = [
        str(PYTHON),
        str(HERE / f"{peer}_bench.py"),
        url.replace("postgres://", "postgresql://", 1),
        *map(str, args),
    ]
    try:
        stdout = harness.run(command, None, timeout, what=f"{peer}_bench.py")
        return json.loads(stdout.strip().splitlines()[-1])
    except (harness.SectionFailed, ValueError, IndexError) as exc:
        return {"not_measured": " ".join(str(exc).split())[:400]}
