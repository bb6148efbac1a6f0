"""The operator UI's URLs: mount them in a Django project with
``path("everystep/", include("everystep.urls"))``."""

from django.urls import path

from everystep.ui import api, assets, login, views

app_name = "everystep"

urlpatterns = [
    path("", views.runs, name="runs"),
    path("run/<str:run_id>", views.run, name="run"),
    path("run/<str:run_id>/resolve", views.resolve, name="resolve"),
    path("run/<str:run_id>/cancel", views.cancel, name="cancel"),
    path("run/<str:run_id>/retry", views.retry, name="retry"),
    path("blocked", views.blocked, name="blocked"),
    path("workers", views.workers, name="workers"),
    path("workers/requeue", views.requeue, name="requeue"),
    path("login", login.login, name="login"),
    path("logout", login.logout, name="logout"),
    path("assets/<str:name>", assets.asset, name="asset"),
    path("api/runs", api.runs, name="api-runs"),
    path("api/run/<str:run_id>", api.run, name="api-run"),
    path("api/workers", api.workers, name="api-workers"),
    path("api/stream", api.stream, name="api-stream"),
]
