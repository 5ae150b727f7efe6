"""The drain: due parked retries back to the queue that failed, shared by workers and the DLX
service (:mod:`celery_dlx.drain.core` drains; :mod:`celery_dlx.drain.drainer` runs it under the
drain lease)."""
