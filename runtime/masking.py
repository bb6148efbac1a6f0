"""Secrets out of the output: while `masked_output(secrets)` is active,
everything written to ``sys.stdout`` and ``sys.stderr`` (and by the log
handlers writing to them) has each secret replaced by ``***``, however
short, in the forms Python and URLs print it in (as is, ``repr``-escaped,
percent-encoded). Each write is masked whole."""

import contextlib
import logging
import sys
import urllib.parse

from everystep_config.environment import mask


class MaskedStream:
    """A text stream writing through to `stream`, each write masked by `masker`."""

    def __init__(self, stream, masker):
        self._stream = stream
        self._masker = masker

    def write(self, text):
        self._stream.write(self._masker(text))
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def masker(secrets):
    """A function of a text masking every form of each of `secrets`."""
    hidden = {
        form
        for secret in secrets
        if secret
        for form in (
            secret,
            repr(secret)[1:-1],
            urllib.parse.quote(secret, safe=""),
            urllib.parse.quote_plus(secret, safe=""),
        )
    }
    return lambda text: mask(text, hidden)


@contextlib.contextmanager
def masked_output(secrets):
    """Mask `secrets` in the standard streams; yields the masking function."""
    masking = masker(secrets)
    originals = sys.stdout, sys.stderr
    masked = {id(stream): MaskedStream(stream, masking) for stream in originals}
    handlers = [
        (handler, handler.stream) for handler in _stream_handlers() if id(handler.stream) in masked
    ]
    sys.stdout, sys.stderr = (masked[id(stream)] for stream in originals)
    for handler, stream in handlers:
        handler.setStream(masked[id(stream)])
    try:
        yield masking
    finally:
        sys.stdout, sys.stderr = originals
        for handler, stream in handlers:
            handler.setStream(stream)


def _stream_handlers():
    """The stream handlers of every logger."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return {
        handler
        for logger in loggers
        for handler in getattr(logger, "handlers", ())
        if isinstance(handler, logging.StreamHandler)
    }
