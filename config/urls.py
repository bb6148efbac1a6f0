"""The standalone operator UI's URLconf: everystep's UI at the root."""

from django.urls import include, path

urlpatterns = [path("", include("everystep.urls"))]
