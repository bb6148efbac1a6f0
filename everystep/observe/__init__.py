"""Subscribers of the engine's events: log lines (`logs`), Prometheus
metrics (`metrics`), OpenTelemetry spans (`tracing`) and Sentry reports
(`sentry`).

May import: `everystep.db` and everything below it. Never `engine` or
`control`: what they report reaches them through `everystep.core.events`.
"""
