"""``self.retry()`` in a DLX task, the Celery way: a park under ``max_retries`` with Celery's
argument rules; and the one failure no retry can fix, a call its signature refuses."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from celery_dlx.fates import Park

if TYPE_CHECKING:
    from celery import Task


class RetryPark(Park):
    """``self.retry()`` in a DLX task: park the message, under Celery's ``max_retries``.

    ``countdown`` None uses the task's backoff; ``call_args``/``call_kwargs`` None keep the
    message's arguments.
    """

    #: The retry budget is Celery's max_retries, checked by DLXTask.retry, not dlx_max_parks.
    budgeted = False

    def __init__(
        self,
        countdown: float | None = None,
        message: str = "",
        call_args: Sequence[object] | None = None,
        call_kwargs: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(countdown=countdown, message=message)
        self.call_args = call_args
        self.call_kwargs = call_kwargs

    def __reduce__(self) -> tuple[type[RetryPark], tuple[object, ...]]:
        return (type(self), (self.countdown, str(self), self.call_args, self.call_kwargs))


def signature_error(
    task: Task[..., object],
    exc: BaseException,
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> bool:
    """True when ``exc`` is the TypeError of arguments the task's signature refuses."""
    if not isinstance(exc, TypeError):
        return False
    try:
        inspect.signature(task.run).bind(*args, **kwargs)
    except TypeError:
        return True
    except ValueError:  # no signature to inspect (a builtin): cannot tell
        return False
    return False


def retry_arguments(
    run: Callable[..., object],
    request_args: Sequence[object] | None,
    request_kwargs: Mapping[str, object] | None,
    args: Sequence[object] | None,
    kwargs: Mapping[str, object] | None,
) -> tuple[Sequence[object] | None, Mapping[str, object] | None]:
    """The arguments of a retried run, as Celery's ``Task.retry`` computes them.

    None keeps the request's; an explicit ``args`` (or ``kwargs``) alone keeps the inherited
    values that do not conflict with the new calling convention (Celery #6494).
    """
    if (args is not None and kwargs is None and request_kwargs) or (
        kwargs is not None and args is None and request_args
    ):
        try:
            signature = inspect.signature(run)
        except (TypeError, ValueError):
            return args, kwargs
        if args is not None:
            positional = [
                p
                for p in signature.parameters.values()
                if p.kind
                in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            ]
            inherited = dict(request_kwargs or {})  # set: the condition above says so
            for p in positional[: len(args)]:
                if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD:
                    inherited.pop(p.name, None)
            kwargs = inherited
        else:
            try:
                bound = signature.bind_partial(*(request_args or ()))  # set, as above
            except TypeError:
                return args, kwargs
            given = dict(kwargs or {})
            for name in list(given):
                if (
                    name in bound.arguments
                    and signature.parameters[name].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
                ):
                    bound.arguments[name] = given.pop(name)
            args, kwargs = bound.args, {**bound.kwargs, **given}
    return args, kwargs
