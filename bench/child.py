"""The entry point of one measurement subprocess.

``python -m bench.child SECTION OPTIONS_JSON`` with ``DJANGO_SETTINGS_MODULE``
and ``EVERYSTEP_DATABASE_URL`` set: sets Django up, calls
``bench.SECTION.measure(**options)`` and prints its figures as one JSON
object on the last line of stdout. Each section runs in a process of its
own, against a database of its own, so no measurement inherits another's
connections, caches or garbage.
"""

import importlib
import json
import signal
import sys

import django


def main():
    section, options = sys.argv[1], json.loads(sys.argv[2])
    # SIGTERM unwinds like Ctrl-C, so every worker this process started is
    # stopped by its `finally`.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    django.setup()
    figures = importlib.import_module(f"bench.{section}").measure(**options)
    sys.stdout.write(json.dumps(figures) + "\n")


if __name__ == "__main__":
    main()
