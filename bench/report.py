"""The benchmark's table, and the versions and machine it records."""

import importlib.metadata
import os
import platform


def versions():
    found = {"python": platform.python_version()}
    for package in ("django", "psycopg", "pymysql", "everystep"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def machine():
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(
                line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return {"cpus": os.cpu_count(), "cpu": model, "platform": platform.platform()}


def table(results):
    """The figures as a plain-text table, with every figure that has a
    physical limit also shown as a multiple of it."""
    figures = results["figures"]
    rows = []

    def row(label, value, unit, note=""):
        rows.append(
            (label, f"{value:,.1f} {unit}" if isinstance(value, float | int) else str(value), note)
        )

    for backend in ("postgres", "mariadb", "sqlite"):
        steps = figures.get(f"steps.{backend}")
        if steps:
            limit = steps["physical_limit_us"]
            row(f"{backend}: physical limit (autocommit INSERT)", limit, "µs", "1.00×")
            row(
                f"{backend}: recorded step",
                steps["step_us"],
                "µs",
                f"{steps['step_vs_limit']:.2f}× limit, "
                f"{steps['step_round_trips']:.2f} round trips/step",
            )
    for key, value in figures.items():
        if key.startswith("throughput."):
            _, backend, shape = key.split(".", 2)
            steps_per_run = 1 if shape == "one_step" else 5
            label = f"{backend}: {value['runs']:.0f} runs of {steps_per_run} step(s), " + (
                "1 worker (pool 8)"
                if shape == "one_step"
                else f"{shape[:-1]} worker(s) (pool 8 each)"
            )
            limit = figures.get(f"steps.{backend}", {}).get("physical_limit_us")
            note = f"{value['runs_per_s'] * steps_per_run:,.0f} steps/s"
            if limit:
                note += f", {1e6 / limit:,.0f} commits/s is one connection's limit"
            row(label, value["runs_per_s"], "runs/s", note)
    for key, value in figures.items():
        if key.startswith("pickup."):
            _, backend, mode = key.split(".")
            row(
                f"{backend}: pickup, idle worker ({mode})",
                value["pickup_p50_ms"],
                "ms p50",
                f"p99 {value['pickup_p99_ms']:.1f} ms",
            )
    claims = figures.get("claims.postgres")
    if claims:
        row("postgres: claim of 8, empty table", claims["claim_empty_table_8_waiting_us"], "µs")
        row(
            f"postgres: claim of 8, {claims['claim_finished_runs']:,} finished runs",
            claims["claim_full_table_8_waiting_us"],
            "µs",
            f"{claims['claim_ratio_8_waiting']:.2f}× "
            f"(idle queue: {claims['claim_ratio_idle']:.2f}×)",
        )
    replay = figures.get("replay.postgres")
    if replay:
        row(
            f"postgres: resume a run of {replay['replay_steps']} recorded steps",
            replay["replay_ms"],
            "ms",
            f"{replay['replay_queries']:.0f} queries",
        )
    footprint = figures.get("footprint.postgres")
    if footprint:
        row("worker RSS, idle", footprint["worker_rss_idle_mib"], "MiB")
        row(
            f"worker RSS, after {footprint['footprint_runs']} runs",
            footprint["worker_rss_after_runs_mib"],
            "MiB",
        )
    start = figures.get("startup.postgres")
    if start and "error" not in start:
        row("zipapp: exec to ready, cold (first extraction)", start["zipapp_cold_start_s"], "s")
        row("zipapp: exec to ready, warm", start["zipapp_warm_start_s"], "s")
        row("zipapp size", start["zipapp_size_mib"], "MiB")
    for key, value in figures.items():
        if key.startswith("peers."):
            for name, figure in value.items():
                row(f"{key[6:]}: {name}", figure, "")
    width = max(len(label) for label, _, _ in rows)
    lines = [f"{'figure':<{width}}  {'value':>16}  note", "-" * (width + 40)]
    lines += [f"{label:<{width}}  {value:>16}  {note}" for label, value, note in rows]
    return "\n".join(lines)
