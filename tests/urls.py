"""The URLconf of the tests that mount everystep's views."""

from django.urls import path

from everystep import views

urlpatterns = [path("everystep/metrics", views.metrics_view)]
