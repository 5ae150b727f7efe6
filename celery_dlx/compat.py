"""The only place celery_dlx touches private internals of Celery, Kombu, py-amqp and sentry-sdk.

Each function below names the internal it relies on and why no public API does the job.
``tests/unit/test_compat.py`` checks every one of them against the installed libraries, so an
upgrade that removes or changes one fails there, with the library and version named, instead of
in production. Internals replaced by public APIs (and no longer used): Celery's
``Queues._add`` (``Queues.add``/``add_compat`` are overridden instead), ``celery._state``
(``celery.current_task``), redis-py's ``Script.sha`` (redis-py computes it; ``script_load``
alone loads the script), and Celery's ``Backend._get_result_meta``, which celery_dlx wrapped
class-wide to add its details of a run to the stored meta (the task stores them itself beside the
result: ``celery_dlx.results``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from celery import Celery
from kombu import Queue
from kombu.message import Message

if TYPE_CHECKING:
    from sentry_sdk.types import Event, Hint

_lock = threading.Lock()

#: ``(name, type)`` pairs of kombu ``Object.attrs``: the attributes a copy keeps.
QueueAttrs = tuple[tuple[str, Any], ...]
#: A py-amqp decoder of one class's content header: ``(buf, offset) -> (properties, offset)``.
PropertyDecoder = Callable[[Any, int], tuple[dict[str, Any], int]]


# -- py-amqp: properties that are not UTF-8 ------------------------------------------------------


def _replacing(value: object) -> object:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return value


def install_tolerant_properties() -> None:
    """Make py-amqp deliver messages whose properties or header names are not UTF-8.

    AMQP short strings (``message_id``, ``content_type``, header names...) are octets, and
    producers in other languages send whatever bytes they hold. py-amqp decodes them as UTF-8
    inside the connection's frame reader and raises ``UnicodeDecodeError`` there: the delivery
    never reaches the consumer and the broker redelivers it to the next consumer, which dies the
    same way. One such dead letter would stop the DLX service for good.

    Internals: ``amqp.serialization.PROPERTY_CLASSES`` (the decoder per class id, looked up per
    header frame) and ``amqp.serialization.pstr_t`` (the short-string decoder, read at call
    time). py-amqp has no hook for either. A header frame that decodes today decodes exactly as
    before; one that raises is decoded again with every invalid short string replaced
    (``U+FFFD``). Process-wide and idempotent; called by celery_dlx's consumers, never at import.
    """
    from amqp import serialization, spec

    # celery-types declares PROPERTY_CLASSES as dict[int, type]; py-amqp stores decoder functions.
    classes: dict[int, PropertyDecoder] = serialization.PROPERTY_CLASSES  # type: ignore[assignment]
    strict = classes[spec.Basic.CLASS_ID]
    if getattr(strict, "celery_dlx_tolerant", False):
        return

    def decode(buf: Any, offset: int) -> tuple[dict[str, Any], int]:
        try:
            return strict(buf, offset)
        except UnicodeDecodeError:
            # py-amqp reads its module's `pstr_t` at call time; swap it for this one frame. Another
            # thread decoding meanwhile sees the same result for anything that decodes, and
            # replacement characters where it would have raised or kept bytes.
            with _lock:
                original = serialization.pstr_t
                # celery-types declares pstr_t as str -> bytes; it is amqp.utils.bytes_to_str.
                serialization.pstr_t = _replacing  # type: ignore[assignment]
                try:
                    return strict(buf, offset)
                finally:
                    serialization.pstr_t = original

    setattr(decode, "celery_dlx_tolerant", True)  # noqa: B010 (a marker on a function)
    classes[spec.Basic.CLASS_ID] = decode


# -- kombu -----------------------------------------------------------------------------------------


def queue_attrs(*extra: tuple[str, Any]) -> QueueAttrs:
    """kombu ``Queue.attrs`` followed by ``extra``, for a ``Queue`` subclass with more fields.

    Internal: kombu copies a queue on every bind (``Object.__copy__`` rebuilds it from
    ``as_dict()``, which lists ``attrs``); a subclass attribute not in ``attrs`` is lost by the
    copy the worker declares.
    """
    return (*Queue.attrs, *extra)


def consumer_tags(consumer: object) -> Mapping[str, str]:
    """Queue name to consumer tag of a kombu ``Consumer`` (empty when it consumes nothing).

    Internal: ``kombu.Consumer._active_tags``. AMQP deliveries name their consumer tag, not their
    queue, and kombu keeps the tag it chose per queue only there.
    """
    tags = getattr(consumer, "_active_tags", None)
    return {str(queue): str(tag) for queue, tag in tags.items()} if tags else {}


def serializer_name(content_type: str) -> str | None:
    """kombu's serializer name (``json``, ``pickle``...) for ``content_type``, if registered.

    Internal: ``kombu.serialization.registry.type_to_name``; kombu's public ``dumps`` takes a
    serializer name, and nothing public maps a message's content type back to it.
    """
    from kombu import serialization

    # celery-types omits the module-level `registry` (it is not in kombu's __all__).
    registry = serialization.registry  # type: ignore[attr-defined]
    name = registry.type_to_name.get(content_type)
    return None if name is None else str(name)


# -- celery ----------------------------------------------------------------------------------------


def app_task_or_amqp_made(app: Celery) -> bool:
    """True once ``app.Task`` (the base task class) or ``app.amqp`` (its AMQP helper) was made.

    Internal: both are cached properties of ``Celery``, stored in the instance ``__dict__`` on
    first use; Celery has no public way to ask whether they exist yet, and ``install(app)`` can
    only replace their classes (``task_cls``, ``amqp_cls``) before that.
    """
    return "Task" in app.__dict__ or "amqp" in app.__dict__


def divert_reject(message: Message, reject: Callable[..., None]) -> None:
    """Make Celery's coming ``message.reject_log_error(logger, errors)`` call ``reject`` instead.

    Internal: Celery's ``Consumer.on_unknown_message``, ``on_unknown_task`` and
    ``on_invalid_task`` reject (dead-letter) the message with ``reject_log_error`` in the middle
    of their work (logging, result state, events, signals), with no hook to decide otherwise.
    celery_dlx keeps all that work and replaces only the reject, on this one message object.
    ``reject`` is called as ``reject(logger, errors, requeue=False)``.
    """
    message.reject_log_error = reject  # type: ignore[method-assign]  # the patch itself


# -- sentry-sdk -----------------------------------------------------------------------------------


def add_sentry_event_processor_once(processor: Callable[[Event, Hint], Event | None]) -> None:
    """Add ``processor`` to sentry-sdk's global event processors unless it is there already.

    Internal: ``sentry_sdk.scope.global_event_processors``; the public
    ``add_global_event_processor`` appends unconditionally, and installing celery_dlx into
    several apps of one process must not run the processor several times per event.
    """
    from sentry_sdk import scope

    if processor not in scope.global_event_processors:
        scope.add_global_event_processor(processor)


# -- billiard: tracebacks without a copy of every code object's positions --------------------------

_positions_shared = False


class _CodeWithoutPositions:
    """A code object seen through billiard's ``_Code``, whose ``co_positions()`` is empty."""

    __slots__ = ("_code",)

    def __init__(self, code: Any) -> None:
        self._code = code

    def __getattr__(self, name: str) -> Any:
        return getattr(self._code, name)

    def co_positions(self) -> Any:
        return iter(())


class SparsePositions:
    """What a pickled billiard ``_Code`` keeps of its code object's positions: how many there
    are and the ones its traceback points at (the instruction of each frame and traceback
    entry). Iterated, it is the full list with ``(None, None, None, None)`` elsewhere, which
    is how ``traceback`` finds a position (the entry at ``lasti // 2``)."""

    __slots__ = ("known", "length")

    def __init__(self, length: int, known: dict[int, Any]) -> None:
        self.length = length
        self.known = known

    def __iter__(self) -> Iterator[Any]:
        blank, get = (None, None, None, None), self.known.get
        return (get(i, blank) for i in range(self.length))

    def __reduce__(self) -> tuple[Any, ...]:
        return SparsePositions, (self.length, self.known)


#: Set on a billiard ``_Code``: the position indexes its traceback copy needs.
_NEEDED_ATTR = "_celery_dlx_needed"


def _need(code: Any, lasti: int) -> None:
    if lasti >= 0:
        code.__dict__.setdefault(_NEEDED_ATTR, set()).add(lasti // 2)


def share_code_positions() -> None:
    """Make billiard's ``ExceptionInfo`` share one positions list per code object, and pickle
    only the positions its traceback needs.

    Internal: ``billiard.einfo._Code.__init__``, which on Python >= 3.11 stores
    ``list(code.co_positions())`` for every frame of every traceback it copies (thousands of
    tuples for Celery's large ``trace_task``). Celery's tracer builds such a copy for every failed,
    retried or ignored run, and a handled failure costs two or three of them: most of its time.
    Code objects do not change, so the list is computed once per code object (held weakly) and
    shared. A prefork pool process also pickles the copy to its parent with the result of every
    failed, retried or ignored run: about 32 KB, most of it ``trace_task``'s positions. Pickled,
    a ``_Code`` now keeps only the positions its frame and traceback entry point at
    (:class:`SparsePositions`, about 1 KB in all); the copy formats as before, carets included.
    Process-wide and idempotent.
    """
    global _positions_shared
    if _positions_shared or sys.version_info < (3, 11):
        return
    import weakref

    from billiard import einfo

    with _lock:
        if _positions_shared:
            return
        cache: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
        original = einfo._Code.__init__

        def __init__(self: Any, code: Any) -> None:
            original(self, _CodeWithoutPositions(code))
            try:
                positions = cache.get(code)
                if positions is None:
                    positions = cache[code] = list(code.co_positions())
            except TypeError:  # not weak-referenceable (not a real code object): no sharing
                positions = list(code.co_positions())
            self._co_positions = positions

        def __reduce__(self: Any) -> tuple[Any, ...]:
            state = self.__dict__
            needed = state.get(_NEEDED_ATTR)
            if needed is not None:
                state = {k: v for k, v in state.items() if k != _NEEDED_ATTR}
                positions = state.get("_co_positions")
                if isinstance(positions, list):
                    known = {i: positions[i] for i in needed if i < len(positions)}
                    state["_co_positions"] = SparsePositions(len(positions), known)
            return einfo._Code.__new__, (einfo._Code,), state

        frame_init = einfo._Frame.__init__
        traceback_init = einfo.Traceback.__init__

        def _frame_init(self: Any, frame: Any) -> None:
            frame_init(self, frame)
            _need(self.f_code, frame.f_lasti)

        def _traceback_init(self: Any, tb: Any, *args: Any, **kwargs: Any) -> None:
            traceback_init(self, tb, *args, **kwargs)
            _need(self.tb_frame.f_code, tb.tb_lasti)

        einfo._Code.__init__ = __init__  # type: ignore[method-assign]  # the patch itself
        einfo._Code.__reduce__ = __reduce__  # type: ignore[method-assign]
        einfo._Frame.__init__ = _frame_init  # type: ignore[method-assign]
        einfo.Traceback.__init__ = _traceback_init  # type: ignore[method-assign]
        _positions_shared = True


# -- CPython's traceback module: positions and carets computed once --------------------------------

_traceback_cached = False
#: Most code positions (and caret anchors) remembered; the cache starts over when full.
TRACEBACK_CACHE_SIZE = 4096


def cache_traceback_positions() -> None:
    """Make the ``traceback`` module compute a frame's position and carets once, not per format.

    Internal: CPython 3.11-3.12's ``traceback._get_code_position(code, instruction_index)``,
    which walks ``code.co_positions()`` from the start to the frame's instruction on every
    format (Celery's ``trace_task`` is thousands of instructions long, and its frame is in every
    traceback of a task run), and ``traceback._extract_caret_anchors_from_line_segment(segment)``,
    which parses the source segment with ``ast`` for the ``~~~^^^`` markers. Both are pure: the
    same arguments always give the same answer, so formatting is unchanged. Celery's tracer
    formats two or three tracebacks per handled failure; this was the largest part of their cost.
    Missing functions (another Python version) are left alone. Process-wide and idempotent.
    """
    global _traceback_cached
    if _traceback_cached:
        return
    import functools
    import traceback

    with _lock:
        if _traceback_cached:
            return
        original = getattr(traceback, "_get_code_position", None)
        if original is not None:
            positions: dict[tuple[int, int], tuple[object, Any]] = {}

            def _get_code_position(code: Any, instruction_index: int) -> Any:
                key = (id(code), instruction_index)
                hit = positions.get(key)
                if hit is not None and hit[0] is code:
                    return hit[1]
                position = original(code, instruction_index)
                if len(positions) >= TRACEBACK_CACHE_SIZE:
                    positions.clear()
                positions[key] = (code, position)  # the code is kept: its id is not reused
                return position

            traceback._get_code_position = _get_code_position  # type: ignore[attr-defined]
        anchors = getattr(traceback, "_extract_caret_anchors_from_line_segment", None)
        if anchors is not None:
            traceback._extract_caret_anchors_from_line_segment = functools.lru_cache(  # type: ignore[attr-defined]
                TRACEBACK_CACHE_SIZE
            )(anchors)
        _traceback_cached = True
