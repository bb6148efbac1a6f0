"""``python -m bench.profiled_worker WORKER_ARGS…``: ``manage.py
everystep_worker`` under yappi, every thread profiled on its own CPU clock,
so a function's time is CPU spent in it, not a wait for the database.
SIGUSR1 starts the profile afresh (after a warm-up); when the worker
exits, it is written to ``$BENCH_PROFILE`` (pstats' format).
"""

import atexit
import os
import signal
import sys

import yappi


def _write():
    yappi.stop()
    yappi.get_func_stats().save(os.environ["BENCH_PROFILE"], type="pstat")


def main():
    from django.core.management import execute_from_command_line

    yappi.set_clock_type("cpu")
    signal.signal(signal.SIGUSR1, lambda signum, frame: yappi.clear_stats())
    atexit.register(_write)
    yappi.start(builtins=True, profile_threads=True)
    execute_from_command_line(["django-admin", "everystep_worker", *sys.argv[1:]])


if __name__ == "__main__":
    main()
