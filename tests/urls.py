"""The URLconf of the tests that mount everystep's views, as a Django
project would: the metrics, the operator UI and the admin; and an async
view of the project's own that schedules a run."""

from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path

from everystep import aschedule, views


async def order(request):
    """An async view that schedules a run, as an ASGI project's would."""
    from tests import workflows

    run = await aschedule(workflows.add_twice, 1, 2, idempotency_key=request.GET.get("key"))
    return JsonResponse({"id": str(run.id)})


urlpatterns = [
    path("order", order),
    path("everystep/metrics", views.metrics_view),
    path("everystep/", include("everystep.urls")),
    path("admin/", admin.site.urls),
]
