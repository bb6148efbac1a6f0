"""The standalone UI's login form and logout (``EVERYSTEP_UI_PASSWORD``).

In a Django project these pages send the user to the project's own login
(``LOGIN_URL``); its users and permissions apply (`everystep.ui.access`).
"""

from django.http import HttpResponse
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect

from everystep.ui import access


@never_cache
@csrf_protect
def login(request):
    """GET: the form. POST: the password checked, the session signed in, and
    back to the page asked for."""
    next_page = request.POST.get("next") or request.GET.get("next") or ""
    if not url_has_allowed_host_and_scheme(next_page, allowed_hosts={request.get_host()}):
        next_page = ""
    if access.password() is None:
        # Imported here: a standalone UI has no django.contrib.auth installed.
        from django.contrib.auth.views import redirect_to_login

        return redirect_to_login(next_page or reverse("everystep:runs"))
    error = None
    if request.method == "POST":
        if request.POST.get("username", access.USER) == access.USER and access.check_password(
            request.POST.get("password", "")
        ):
            request.session.cycle_key()
            request.session[access.SESSION_KEY] = access.USER
            return redirect(next_page or reverse("everystep:runs"))
        error = "Wrong user name or password."
        access.logger.warning(
            "failed login to the operator UI from %s",
            request.META.get("REMOTE_ADDR", "?"),
            extra={"action": "ui_login_failed"},
        )
    body = render_to_string(
        "everystep/login.html",
        {"next": next_page, "error": error, "user_name": access.USER},
        request=request,
    )
    return HttpResponse(body, status=401 if error else 200)


@csrf_protect
def logout(request):
    """POST: sign the session out."""
    if request.method == "POST" and hasattr(request, "session"):
        request.session.flush()
    return redirect(reverse("everystep:login"))
