"""The limits celery_dlx.policy.durations enforces are the real servers' limits.

RabbitMQ refuses a delay queue whose ``x-message-ttl`` or ``x-expires`` passes
:data:`~celery_dlx.policy.durations.MAX_TTL_MS`; Redis refuses an expiry of 0 ms. The validators
accept the longest ladder step and the shortest and longest duration, and those work.
"""

from __future__ import annotations

from typing import Any

import pytest
from amqp.exceptions import PreconditionFailed

from celery_dlx.broker.ladder import delay_queue_arguments
from celery_dlx.errors import ConfigurationError
from celery_dlx.message.cause import CauseRecord
from celery_dlx.policy import durations
from celery_dlx.store.causes import stash_cause


def _declare(broker: Any, name: str, arguments: dict[str, Any]) -> None:
    channel = broker.channel()
    try:
        channel.queue_declare(queue=name, arguments=arguments, auto_delete=False)
        channel.queue_delete(name)
    finally:
        channel.close()


def test_the_longest_ladder_step_declares_and_one_more_ms_is_refused(
    broker: Any, uid: str, cleanup_queues: list[str]
) -> None:
    longest = durations.ladder_ms([durations.MAX_STEP_MS / 1000])[0]
    name = f"dur-{uid}"
    cleanup_queues.append(name)
    _declare(broker, name, delay_queue_arguments(f"work-{uid}", longest))
    with pytest.raises(PreconditionFailed, match="value_too_large"):
        _declare(broker, name, delay_queue_arguments(f"work-{uid}", longest + 1))
    with pytest.raises(ConfigurationError):
        durations.ladder_ms([(durations.MAX_STEP_MS + 1) / 1000])


@pytest.mark.parametrize("seconds", [durations.MIN_DURATION, durations.MAX_SECONDS])
def test_the_shortest_and_longest_duration_are_redis_expiries(
    redis_client: Any, keys: Any, seconds: float
) -> None:
    ttl = durations.duration(seconds, "dlx_cause_ttl")
    stash_cause(redis_client, keys, "m-1", CauseRecord.from_fields(exc_type="E"), ttl)
    left = redis_client.pttl(keys.cause("m-1"))
    # -2: the 1 ms one is already gone; 0: under a millisecond left (PTTL rounds down), seen
    # on a loaded machine
    assert left == -2 or 0 <= left <= int(seconds * 1000)


def test_an_expiry_below_a_millisecond_is_refused_by_redis_and_the_validator(
    redis_client: Any, keys: Any
) -> None:
    import redis

    with pytest.raises(redis.ResponseError, match="invalid expire time"):
        stash_cause(redis_client, keys, "m-2", CauseRecord.from_fields(), 0.0004)
    with pytest.raises(ConfigurationError, match=r"at least 0\.001 s"):
        durations.duration(0.0004, "dlx_cause_ttl")
