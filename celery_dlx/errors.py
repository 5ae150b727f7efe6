"""Errors raised by celery_dlx.

Every error derives from :class:`DLXError`; messages name the setting or option to fix.
"""

from __future__ import annotations


class DLXError(Exception):
    """Root of every error celery_dlx raises."""


class ConfigurationError(DLXError, ValueError):
    """A ``dlx_*`` setting or task option is unknown or has a bad value."""


class TopologyError(DLXError):
    """A queue or exchange cannot be declared as celery_dlx needs it."""


class MalformedHeader(DLXError, ValueError):
    """A header (``x-death`` or a celery_dlx header) cannot be parsed.

    Never fatal for a consumer: callers turn it into a quarantine reason.
    """


class StoreError(DLXError):
    """The Redis store refused or lost an operation."""


class PublishError(DLXError):
    """The broker did not confirm a publish (nack or timeout)."""
