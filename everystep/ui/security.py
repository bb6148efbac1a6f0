"""What every answer of the operator UI carries to keep a browser safe,
and what the standalone UI adds to its cookies.

`headers` wraps each of the UI's views (`everystep.urls`), in a Django
project as in the standalone UI: a Content-Security-Policy that lets a page
load only the UI's own scripts, styles and images (it has no inline
script or style), no framing, no MIME sniffing, and no referrer sent to
other sites. `SecureCookies`, a middleware of the standalone UI, marks its
session and CSRF cookies ``Secure`` when the request came over TLS — through
a proxy that ended it, when the server trusts that proxy's
``X-Forwarded-Proto`` (``EVERYSTEP_UI_TRUSTED_PROXY``).
"""

import functools

from django.conf import settings

POLICY = "; ".join(
    (
        "default-src 'self'",
        "img-src 'self' data:",
        "style-src 'self'",
        "script-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


def headers(view):
    """`view`, its answers carrying `HEADERS` (a header the view set wins)."""

    @functools.wraps(view)
    def secured(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        for name, value in HEADERS.items():
            if name not in response:
                response[name] = value
        return response

    return secured


class SecureCookies:
    """Middleware: the session and CSRF cookies ``Secure`` over TLS."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.is_secure():
            for name in (settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME):
                if name in response.cookies:
                    response.cookies[name]["secure"] = True
        return response
