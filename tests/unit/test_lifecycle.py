"""The lifecycle rules as pure functions, over hand-written cases."""

from __future__ import annotations

import pytest

from lightning_store.lifecycle import (
    heartbeat_attempt_status,
    heartbeat_rollout_status,
    rollout_status_from_attempt,
    unhealthy_status,
    worker_fields_for_attempt,
)
from lightning_store.models import Attempt, AttemptStatus, RolloutConfig, RolloutStatus

NOW = 1_000.0
RETRYABLE: tuple[AttemptStatus, ...] = ("failed", "timeout", "unresponsive")


def attempt(
    status: AttemptStatus = "running", *, start_time: float = 0.0, last_heartbeat_time: float | None = None
) -> Attempt:
    return Attempt(
        rollout_id="ro-1",
        attempt_id="at-1",
        sequence_id=1,
        start_time=start_time,
        status=status,
        worker_id="w1",
        last_heartbeat_time=last_heartbeat_time,
    )


# rollout_status_from_attempt ------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["preparing", "running", "succeeded"])
@pytest.mark.parametrize("retry_condition", [[], ["failed", "timeout", "unresponsive"]])
@pytest.mark.parametrize(("sequence_id", "max_attempts"), [(1, 1), (1, 3), (3, 3), (5, 3)])
def test_active_and_succeeded_attempts_carry_over_to_the_rollout(
    status: AttemptStatus, retry_condition: list[AttemptStatus], sequence_id: int, max_attempts: int
) -> None:
    config = RolloutConfig(max_attempts=max_attempts, retry_condition=retry_condition)

    assert rollout_status_from_attempt(status, sequence_id, config) == status


@pytest.mark.parametrize("status", ["failed", "timeout", "unresponsive"])
@pytest.mark.parametrize(
    ("sequence_id", "max_attempts", "expected"),
    [
        (1, 1, "failed"),
        (1, 2, "requeuing"),
        (2, 2, "failed"),
        (2, 3, "requeuing"),
        (3, 3, "failed"),
        (4, 3, "failed"),
    ],
)
def test_retryable_attempt_requeues_while_attempts_remain(
    status: AttemptStatus, sequence_id: int, max_attempts: int, expected: RolloutStatus
) -> None:
    config = RolloutConfig(max_attempts=max_attempts, retry_condition=[status])

    assert rollout_status_from_attempt(status, sequence_id, config) == expected


@pytest.mark.parametrize("status", ["failed", "timeout", "unresponsive"])
@pytest.mark.parametrize("sequence_id", [1, 2, 9])
def test_attempt_not_in_retry_condition_fails_the_rollout(status: AttemptStatus, sequence_id: int) -> None:
    config = RolloutConfig(max_attempts=10, retry_condition=[s for s in RETRYABLE if s != status])

    assert rollout_status_from_attempt(status, sequence_id, config) == "failed"


@pytest.mark.parametrize("status", ["failed", "timeout", "unresponsive"])
def test_empty_retry_condition_never_retries(status: AttemptStatus) -> None:
    assert rollout_status_from_attempt(status, 1, RolloutConfig(max_attempts=5)) == "failed"


def test_default_config_never_retries() -> None:
    config = RolloutConfig()

    assert [rollout_status_from_attempt(s, 1, config) for s in RETRYABLE] == [
        "failed",
        "failed",
        "failed",
    ]


def test_succeeded_in_retry_condition_still_succeeds() -> None:
    config = RolloutConfig(max_attempts=3, retry_condition=["succeeded", "running"])

    assert rollout_status_from_attempt("succeeded", 1, config) == "succeeded"
    assert rollout_status_from_attempt("running", 1, config) == "running"


# heartbeats ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("preparing", "running"),
        ("unresponsive", "running"),
        ("running", "running"),
        ("succeeded", "succeeded"),
        ("failed", "failed"),
        ("timeout", "timeout"),
    ],
)
def test_heartbeat_attempt_status(status: AttemptStatus, expected: AttemptStatus) -> None:
    assert heartbeat_attempt_status(status) == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("queuing", "running"),
        ("preparing", "running"),
        ("requeuing", "running"),
        ("running", "running"),
        ("succeeded", "succeeded"),
        ("failed", "failed"),
        ("cancelled", "cancelled"),
    ],
)
def test_heartbeat_rollout_status(status: RolloutStatus, expected: RolloutStatus) -> None:
    assert heartbeat_rollout_status(status) == expected


# unhealthy_status ----------------------------------------------------------------------------------------


def test_no_limits_means_always_healthy() -> None:
    assert unhealthy_status(attempt(start_time=0.0), RolloutConfig(), now=1e9) is None


@pytest.mark.parametrize(("elapsed", "expected"), [(9.999, None), (10.0, None), (10.001, "timeout")])
def test_timeout_is_measured_from_start_and_strictly_exceeded(elapsed: float, expected: str | None) -> None:
    config = RolloutConfig(timeout_seconds=10)

    assert unhealthy_status(attempt(start_time=NOW - elapsed), config, NOW) == expected


def test_timeout_ignores_recent_heartbeats() -> None:
    config = RolloutConfig(timeout_seconds=10)

    assert unhealthy_status(attempt(start_time=NOW - 11, last_heartbeat_time=NOW), config, NOW) == "timeout"


@pytest.mark.parametrize(("silence", "expected"), [(4.999, None), (5.0, None), (5.001, "unresponsive")])
def test_unresponsive_is_measured_from_last_heartbeat(silence: float, expected: str | None) -> None:
    config = RolloutConfig(unresponsive_seconds=5)
    subject = attempt(start_time=NOW - 100, last_heartbeat_time=NOW - silence)

    assert unhealthy_status(subject, config, NOW) == expected


@pytest.mark.parametrize(("silence", "expected"), [(5.0, None), (5.001, "unresponsive")])
def test_unresponsive_without_heartbeat_is_measured_from_start(silence: float, expected: str | None) -> None:
    config = RolloutConfig(unresponsive_seconds=5)

    assert unhealthy_status(attempt("preparing", start_time=NOW - silence), config, NOW) == expected


def test_already_unresponsive_attempt_is_left_alone() -> None:
    config = RolloutConfig(unresponsive_seconds=5)

    assert unhealthy_status(attempt("unresponsive", start_time=0.0), config, NOW) is None


def test_unresponsive_attempt_can_still_time_out() -> None:
    config = RolloutConfig(timeout_seconds=10, unresponsive_seconds=5)

    assert unhealthy_status(attempt("unresponsive", start_time=NOW - 11), config, NOW) == "timeout"


def test_timeout_wins_over_unresponsive() -> None:
    config = RolloutConfig(timeout_seconds=10, unresponsive_seconds=5)

    assert unhealthy_status(attempt(start_time=NOW - 60), config, NOW) == "timeout"


def test_healthy_when_both_limits_are_respected() -> None:
    config = RolloutConfig(timeout_seconds=10, unresponsive_seconds=5)

    assert unhealthy_status(attempt(start_time=NOW - 9, last_heartbeat_time=NOW - 4), config, NOW) is None


def test_unresponsive_but_not_timed_out() -> None:
    config = RolloutConfig(timeout_seconds=10, unresponsive_seconds=5)

    assert unhealthy_status(attempt(start_time=NOW - 9, last_heartbeat_time=NOW - 6), config, NOW) == "unresponsive"


# worker_fields_for_attempt -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["preparing", "running"])
def test_active_attempt_makes_its_worker_busy(status: AttemptStatus) -> None:
    assert worker_fields_for_attempt(attempt(status), NOW) == {
        "status": "busy",
        "last_busy_time": NOW,
        "current_rollout_id": "ro-1",
        "current_attempt_id": "at-1",
    }


@pytest.mark.parametrize(
    ("status", "worker_status"),
    [("succeeded", "idle"), ("failed", "idle"), ("timeout", "unknown"), ("unresponsive", "unknown")],
)
def test_ended_attempt_frees_its_worker(status: AttemptStatus, worker_status: str) -> None:
    assert worker_fields_for_attempt(attempt(status), NOW) == {
        "status": worker_status,
        "last_idle_time": NOW,
        "current_rollout_id": None,
        "current_attempt_id": None,
    }
