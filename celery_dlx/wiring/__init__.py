"""The composition root: one :class:`~celery_dlx.wiring.runtime.Runtime` per app, built from its
validated settings, hands out celery_dlx's roles (:mod:`celery_dlx.roles`) to every part."""

from celery_dlx.wiring.runtime import Runtime, get_runtime

__all__ = ["Runtime", "get_runtime"]
