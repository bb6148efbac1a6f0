"""Views to mount in a Django project.

``path("everystep/metrics", everystep.views.metrics_view)`` serves the
Prometheus metrics of the process (`everystep.observe.metrics`): an embedded
worker's counters, and the queue gauges read from the database.
"""

from django.db import transaction
from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from everystep.observe import metrics


@transaction.non_atomic_requests
def metrics_view(request):
    """The default Prometheus registry in the text exposition format."""
    metrics.install()
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
