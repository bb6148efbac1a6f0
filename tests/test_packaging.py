"""What ``pip install everystep`` brings into a Django project: Django and
the engine's own needs, with each database driver and Sentry's SDK an
extra the project asks for; the runtime (the zipapp, the image) bundles
them all."""

import email
import re
import subprocess
import sys
import zipfile

import pytest

from tests.workerproc import REPO

pytestmark = pytest.mark.backends("sqlite")


@pytest.fixture(scope="module")
def metadata(tmp_path_factory):
    """The METADATA of the wheel built from the checkout, as pip builds it."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("everystep-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(archive.read(name))


def requirements(metadata):
    """Requirement name → the extra it belongs to (None: always installed)."""
    found = {}
    for line in metadata.get_all("Requires-Dist"):
        requirement, _, marker = line.partition(";")
        # The name ends where extras or a version begin: [ < > = ~ ! or a space.
        name = re.match(r"[A-Za-z0-9._-]+", requirement.strip()).group().lower()
        extra = marker.split("extra ==")[1].strip().strip("'\"") if "extra ==" in marker else None
        found.setdefault(name, set()).add(extra)
    return found


def test_drivers_and_sentry_are_extras_not_forced_on_every_project(metadata):
    found = requirements(metadata)
    assert None in found["django"]
    assert found["psycopg"] >= {"postgres"} and None not in found["psycopg"]
    assert found["pymysql"] >= {"mysql"} and None not in found["pymysql"]
    assert found["sentry-sdk"] >= {"sentry"} and None not in found["sentry-sdk"]
    assert set(metadata.get_all("Provides-Extra")) >= {"postgres", "mysql", "sentry", "runtime"}


def test_the_runtime_bundles_every_driver_and_sentry(metadata):
    """The zipapp and the image install ``everystep[runtime]``; their own
    tests run them on PostgreSQL and MariaDB and report to Sentry."""
    (bundle,) = [
        line
        for line in metadata.get_all("Requires-Dist")
        if line.startswith("everystep[") and 'extra == "runtime"' in line
    ]
    extras = bundle[len("everystep[") : bundle.index("]")].split(",")
    assert sorted(extras) == ["mysql", "postgres", "sentry"]
