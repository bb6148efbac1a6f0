"""The UI's own assets — its stylesheet, its script and htmx — served by
the app itself (no CDN, no ``collectstatic``), from the package, so they
work offline and inside the zipapp."""

import importlib.resources
import mimetypes

from django.http import HttpResponse, HttpResponseNotFound
from django.views.decorators.http import require_GET

FOLDER = importlib.resources.files("everystep") / "static" / "everystep"
MAX_AGE = 3600


@require_GET
def asset(request, name):
    """One file of `FOLDER` by its name; 404 for anything else."""
    if "/" in name or name.startswith("."):
        return HttpResponseNotFound("no such asset")
    path = FOLDER / name
    if not path.is_file():
        return HttpResponseNotFound("no such asset")
    content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
    response = HttpResponse(path.read_bytes(), content_type=content_type)
    response["Cache-Control"] = f"public, max-age={MAX_AGE}"
    return response
