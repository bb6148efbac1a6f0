"""Who may see the operator UI, and who may act in it.

Two ways, chosen by the settings:

- In a Django project (no ``EVERYSTEP_UI_PASSWORD`` setting), the project's
  own users: every view needs a logged-in user; reading needs the
  ``everystep.view_workflow`` permission, acting ``everystep.change_workflow``.
- With ``EVERYSTEP_UI_PASSWORD`` set (the standalone ``everystep ui``), one
  user, `USER`, signed in by the login form (a session) or by HTTP basic
  auth; ``EVERYSTEP_UI_READ_ONLY`` takes every action away. Failed
  sign-ins are logged and throttled (`everystep.ui.throttle`).

Actions are POSTs checked against the CSRF token whatever the project's
middleware, and each is logged with the user who made it (`acted`).
"""

import base64
import binascii
import functools
import hmac
import logging
import urllib.parse

from django.conf import settings
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.csrf import csrf_protect

from everystep.ui import responses, throttle

logger = logging.getLogger("everystep.ui")

USER = "admin"
SESSION_KEY = "everystep_ui_user"
#: The password a session was signed in with, as a keyed digest: a session
#: from before the password changed is no longer signed in.
PASSWORD_KEY = "everystep_ui_password"


def password():
    """The standalone password, or None in a Django project."""
    return getattr(settings, "EVERYSTEP_UI_PASSWORD", None) or None


def read_only():
    return bool(getattr(settings, "EVERYSTEP_UI_READ_ONLY", False))


def user_of(request):
    """The name of the signed-in user the request comes from, or None."""
    if password() is None:
        user = getattr(request, "user", None)
        return user.get_username() if user is not None and user.is_authenticated else None
    session = getattr(request, "session", None)
    if (
        session is not None
        and session.get(SESSION_KEY) == USER
        and hmac.compare_digest(session.get(PASSWORD_KEY, ""), password_digest())
    ):
        return USER
    return USER if basic_auth_ok(request) else None


def signed_in(request):
    """Sign the request's session in (a new session key), for the current
    password; expired sessions are cleared on the way."""
    request.session.cycle_key()
    request.session[SESSION_KEY] = USER
    request.session[PASSWORD_KEY] = password_digest()
    request.session.clear_expired()


def password_digest():
    """The standalone password, digested with the secret key."""
    key = settings.SECRET_KEY.encode()
    return hmac.new(key, (password() or "").encode(), "sha256").hexdigest()


class Throttled(Exception):
    """Too many failed sign-ins: the password is not checked for `seconds`."""

    def __init__(self, seconds):
        super().__init__(f"too many failed sign-ins: try again in {seconds:.0f} s")
        self.seconds = seconds


def basic_auth_ok(request):
    """Whether the request carries `USER` and the password by basic auth.
    Raises `Throttled` instead of checking while sign-ins are throttled."""
    scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, _, given = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        user, given = None, ""
    return sign_in(request, user, given, "basic auth")


def sign_in(request, user, given, how):
    """Whether `user` and the password `given` are the standalone UI's, for
    a sign-in by `how` (the login form, basic auth): checked in constant
    time, unless too many sign-ins failed lately (`Throttled`); a failure is
    logged with the client's address."""
    client = request.META.get("REMOTE_ADDR", "?")
    wait = throttle.sign_ins.wait(client)
    if wait > 0:
        raise Throttled(wait)
    expected = password()
    ok = (
        expected is not None
        and hmac.compare_digest(given.encode(), expected.encode())
        and user == USER
    )
    if ok:
        throttle.sign_ins.succeeded(client)
        return True
    throttle.sign_ins.failed(client)
    logger.warning(
        "failed login to the operator UI from %s by %s",
        client,
        how,
        extra={"action": "ui_login_failed", "client": client, "how": how},
    )
    return False


def may_view(request):
    return password() is not None or request.user.has_perm("everystep.view_workflow")


def may_act(request):
    """Whether the request's user may act: never in read-only mode."""
    if read_only():
        return False
    return password() is not None or request.user.has_perm("everystep.change_workflow")


def viewer(view=None, *, api=False):
    """A view anyone allowed to read may see; others are sent to log in (a
    page) or answered 401 (the JSON API) or 403 (a user without the
    permission)."""
    if view is None:
        return functools.partial(viewer, api=api)

    @functools.wraps(view)
    def checked(request, *args, **kwargs):
        try:
            user = user_of(request)
        except Throttled as exc:
            response = responses.problem(request, 429, str(exc), api=api)
            response["Retry-After"] = str(max(1, round(exc.seconds)))
            return response
        if user is None:
            return _unauthenticated(request, api)
        if not may_view(request):
            return responses.problem(
                request, 403, f"{user} lacks the everystep.view_workflow permission", api=api
            )
        request.everystep_user = user
        return view(request, *args, **kwargs)

    return checked


def actor(view):
    """An action: a CSRF-checked POST by a user allowed to act."""

    @functools.wraps(view)
    def checked(request, *args, **kwargs):
        if request.method != "POST":
            return responses.problem(request, 405, "an action is a POST from its form")
        if not may_act(request):
            reason = (
                "the UI is read-only (EVERYSTEP_UI_READ_ONLY)"
                if read_only()
                else f"{request.everystep_user} lacks the everystep.change_workflow permission"
            )
            return responses.problem(request, 403, reason)
        return view(request, *args, **kwargs)

    return viewer(csrf_protect(checked))


def acted(request, action, message, **fields):
    """Log an action with the user who made it: one INFO line, with
    ``action`` and ``user`` among its extras."""
    user = request.everystep_user
    fields = {key: _one_line(value) for key, value in fields.items()}
    logger.info(
        "%s by %s",
        _one_line(message),
        user,
        extra={"action": f"ui_{action}", "user": user, **fields},
    )


def _one_line(value):
    """`value` with its line breaks and other control characters escaped:
    text typed into a form cannot forge a line of the audit log."""
    if not isinstance(value, str):
        return value
    return "".join(
        char if char.isprintable() or char == " " else char.encode("unicode_escape").decode()
        for char in value
    )


def _unauthenticated(request, api):
    if api:
        response = responses.problem(request, 401, "log in, or use HTTP basic auth", api=True)
        if password() is not None:
            response["WWW-Authenticate"] = 'Basic realm="everystep", charset="UTF-8"'
        return response
    if password() is not None:
        next_page = urllib.parse.quote(request.get_full_path(), safe="/")
        return redirect(f"{reverse('everystep:login')}?next={next_page}")
    # Imported here: a standalone UI has no django.contrib.auth installed.
    from django.contrib.auth.views import redirect_to_login

    return redirect_to_login(request.get_full_path())
