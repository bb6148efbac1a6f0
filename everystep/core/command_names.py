"""The command an operator types for each operation, named as the runtime
in use spells it: ``python manage.py everystep_requeue`` in a Django
project, ``everystep requeue`` in the standalone runtime (the zipapp, the
container), which calls `use_standalone_names` as it starts. Messages that
tell the operator what to run next (a blocked run, parked runs, pending
migrations) name it with `command`."""

_standalone = False


def use_standalone_names():
    """Name the standalone runtime's commands from now on."""
    global _standalone
    _standalone = True


def command(operation):
    """How to run `operation` (``requeue``, ``resolve-step``, ``migrate``…) here."""
    if _standalone:
        return f"everystep {operation}"
    if operation == "migrate":
        return "python manage.py migrate"
    return f"python manage.py everystep_{operation.replace('-', '_')}"
