"""The store's errors, as the composition root hands them to the layers above it: a store outage
told from a bug (``STORE_ERRORS``, ``is_full``), a burial refused at the graveyard's budget
(``GraveyardFull``), a retry whose copy is still on its way (``RetryPending``). Exception classes
only: ``store/errors.py`` holds no client (a unit test checks it), and nothing above the root
imports a module of ``store/``."""

from celery_dlx.store.errors import STORE_ERRORS, GraveyardFull, RetryPending, is_full

__all__ = ["STORE_ERRORS", "GraveyardFull", "RetryPending", "is_full"]
