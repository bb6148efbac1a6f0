"""The package keeps the shape its README describes: each layer imports only
itself and the layers below, ``engine``, ``control`` and ``observe`` never
import each other, no modules import each other in a circle, and the library
neither imports the standalone configuration nor reads the environment."""

import pathlib
import shutil

import pytest

from tests import importrules

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.backends("sqlite")


@pytest.fixture
def copy(tmp_path):
    """A copy of the package to put a misplaced import into."""
    shutil.copytree(
        ROOT / "everystep", tmp_path / "everystep", ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path


def _append(path, text):
    path.write_text(path.read_text() + "\n\n" + text + "\n")


def test_each_layer_imports_only_itself_and_the_layers_below():
    assert importrules.layer_violations(importrules.imports(ROOT)) == []


def test_no_modules_import_each_other_in_a_circle():
    assert importrules.circles(importrules.imports(ROOT)) == []


def test_the_library_never_imports_the_standalone_configuration_or_runtime():
    assert importrules.standalone_violations(importrules.imports(ROOT)) == []


def test_no_module_but_the_management_commands_reads_the_environment():
    assert importrules.environment_readers(ROOT) == []


def test_every_module_of_the_library_is_seen():
    """The checks read the modules that are there: a module of every part,
    the lazy imports inside functions included."""
    found = importrules.imports(ROOT)
    sources = {imp.source for imp in found}
    for module in (
        "everystep.core.serde",
        "everystep.db.runs",
        "everystep.engine.runner",
        "everystep.worker.orchestrator",
    ):
        assert module in sources
    lazy = [
        imp
        for imp in found
        if imp.source == "everystep.api" and imp.target == "everystep.engine.steps"
    ]
    assert lazy, "api imports the steps inside its functions"


def test_a_lazy_import_of_a_higher_layer_is_refused(copy):
    _append(
        copy / "everystep/core/serde.py",
        "def _misplaced():\n    from everystep.db import runs\n    return runs",
    )
    wrong = importrules.layer_violations(importrules.imports(copy))
    assert (
        len(wrong) == 1
        and wrong[0].startswith("everystep.core.serde:")
        and "everystep.db.runs" in wrong[0]
    )


def test_engine_control_and_observe_never_import_each_other(copy):
    _append(copy / "everystep/observe/metrics.py", "from everystep.control import actions")
    wrong = importrules.layer_violations(importrules.imports(copy))
    assert [w for w in wrong if "everystep.control.actions (control)" in w], wrong


def test_a_name_loaded_lazily_from_the_package_counts_as_its_module(copy):
    """``from everystep import schedule`` in a low layer imports the API."""
    _append(
        copy / "everystep/db/runs.py",
        "def _misplaced():\n    from everystep import schedule\n    return schedule",
    )
    wrong = importrules.layer_violations(importrules.imports(copy))
    assert [w for w in wrong if "imports everystep.api" in w], wrong


def test_a_circle_is_found(copy):
    _append(
        copy / "everystep/core/clock.py",
        "def _misplaced():\n    from everystep.core import cron\n    return cron",
    )
    _append(
        copy / "everystep/core/cron.py",
        "def _misplaced():\n    from everystep.core import clock\n    return clock",
    )
    found = importrules.circles(importrules.imports(copy))
    assert ["everystep.core.clock", "everystep.core.cron"] in found


def test_an_import_of_the_standalone_configuration_is_found(copy):
    _append(copy / "everystep/checks.py", "def _misplaced():\n    import everystep_config.worker")
    assert importrules.standalone_violations(importrules.imports(copy))


def test_a_read_of_the_environment_is_found(copy):
    _append(
        copy / "everystep/worker/options.py", "import os\nPOOL = os.environ.get('EVERYSTEP_POOL')"
    )
    _append(copy / "everystep/apps.py", "from os import getenv")
    readers = importrules.environment_readers(copy)
    assert [r.split(":")[0] for r in readers] == ["everystep.apps", "everystep.worker.options"], (
        readers
    )
