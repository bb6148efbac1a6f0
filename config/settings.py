"""A Django settings module built from the environment, for tools that want
one by name (``DJANGO_SETTINGS_MODULE=everystep_config.settings``). The
``everystep`` command line configures Django directly instead."""

import logging.config
import os

from everystep_config.django import django_settings, logging_config
from everystep_config.environment import load

_env = load(os.environ)
globals().update(django_settings(_env, workflows=_env.workflows))
logging.config.dictConfig(logging_config(_env))
