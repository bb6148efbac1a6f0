"""Start-up and footprint of a worker process.

Start-up: from the exec of ``python -m django everystep_worker`` to its
``ready`` log line (Django set up, database reached, name lock taken),
median of `repeat` starts after one that warms the OS caches. Footprint:
the resident memory (VmRSS from /proc/PID/status) of an idle worker, pool
8. The memory of a worker after thousands of runs is read by
`bench.throughput`, from the worker that drained them.
"""

import os
import time

from bench.common import Workers, median


def measure(repeat=5, log_dir="."):
    url = os.environ["EVERYSTEP_DATABASE_URL"]
    flags = ["--pool", "8", "--poll", "0.2"]
    starts, idle = [], []
    for attempt in range(repeat + 1):
        with Workers(1, flags, url, log_dir, prefix=f"bench-start-{attempt}") as group:
            group.wait_ready()
            if attempt:
                starts.append(group.all[0].ready_after)
                time.sleep(0.5)
                idle.append(group.all[0].rss_mib())
    return {"start_to_ready_s": median(starts), "rss_idle_mib": median(idle)}
