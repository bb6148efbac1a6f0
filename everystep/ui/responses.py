"""How the UI answers: a page (or, asked by htmx, just its live part), JSON,
or a problem — a one-line reason with its HTTP status, never a traceback."""

from django.http import HttpResponse
from django.template.loader import render_to_string

from everystep.core.serde import readable_json


def page(request, template, context, status=200):
    """The page `template` (``everystep/<template>.html``); to an htmx
    request, only its live part (``everystep/_<template>.html``)."""
    live = request.headers.get("HX-Request") == "true"
    name = f"everystep/_{template}.html" if live else f"everystep/{template}.html"
    context = {"user": getattr(request, "everystep_user", None), **context}
    return HttpResponse(render_to_string(name, context, request=request), status=status)


def json(data, status=200):
    """`data` as JSON; dates, UUIDs and bytes as a reader wants them."""
    return HttpResponse(readable_json(data), status=status, content_type="application/json")


def problem(request, status, message, *, api=None):
    """`message` with `status`: JSON to the API (or a client asking for
    JSON), else a small page."""
    if api is None:
        api = "/api/" in request.path or "application/json" in request.headers.get("Accept", "")
    if api:
        return json({"error": message}, status=status)
    body = render_to_string(
        "everystep/problem.html",
        {"status": status, "message": message, "user": getattr(request, "everystep_user", None)},
        request=request,
    )
    return HttpResponse(body, status=status)
