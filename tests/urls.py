"""The URLconf of the tests that mount everystep's views, as a Django
project would: the metrics, the operator UI and the admin."""

from django.contrib import admin
from django.urls import include, path

from everystep import views

urlpatterns = [
    path("everystep/metrics", views.metrics_view),
    path("everystep/", include("everystep.urls")),
    path("admin/", admin.site.urls),
]
