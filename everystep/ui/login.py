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
    error, status, wait = None, 200, 0
    if request.method == "POST":
        user = request.POST.get("username", access.USER)
        try:
            if access.sign_in(request, user, request.POST.get("password", ""), "the login form"):
                access.signed_in(request)
                return redirect(next_page or reverse("everystep:runs"))
            error, status = "Wrong user name or password.", 401
        except access.Throttled as exc:
            error, status, wait = (
                f"Too many failed sign-ins: try again in {exc.seconds:.0f} s.",
                429,
                exc.seconds,
            )
    body = render_to_string(
        "everystep/login.html",
        {"next": next_page, "error": error, "user_name": access.USER},
        request=request,
    )
    response = HttpResponse(body, status=status)
    if wait:
        response["Retry-After"] = str(max(1, round(wait)))
    return response


@csrf_protect
def logout(request):
    """POST: sign the session out."""
    if request.method == "POST" and hasattr(request, "session"):
        request.session.flush()
    return redirect(reverse("everystep:login"))
