"""The operator UI's URLs: mount them in a Django project with
``path("everystep/", include("everystep.urls"))``. Every view answers with
the UI's security headers (`everystep.ui.security`)."""

from django.urls import path

from everystep.ui import api, assets, login, security, views

app_name = "everystep"

urlpatterns = [
    path("", security.headers(views.runs), name="runs"),
    path("run/<str:run_id>", security.headers(views.run), name="run"),
    path("run/<str:run_id>/resolve", security.headers(views.resolve), name="resolve"),
    path("run/<str:run_id>/cancel", security.headers(views.cancel), name="cancel"),
    path("run/<str:run_id>/retry", security.headers(views.retry), name="retry"),
    path("run/<str:run_id>/send", security.headers(views.send), name="send"),
    path("run/<str:run_id>/fork", security.headers(views.fork), name="fork"),
    path("runs/<str:action>", security.headers(views.bulk), name="bulk"),
    path("blocked", security.headers(views.blocked), name="blocked"),
    path("workers", security.headers(views.workers), name="workers"),
    path("queues", security.headers(views.queues), name="queues"),
    path("workers/requeue", security.headers(views.requeue), name="requeue"),
    path("login", security.headers(login.login), name="login"),
    path("logout", security.headers(login.logout), name="logout"),
    path("assets/<str:name>", security.headers(assets.asset), name="asset"),
    path("api/runs", security.headers(api.runs), name="api-runs"),
    path("api/run/<str:run_id>", security.headers(api.run), name="api-run"),
    path("api/workers", security.headers(api.workers), name="api-workers"),
    path("api/stream", security.headers(api.stream), name="api-stream"),
]
