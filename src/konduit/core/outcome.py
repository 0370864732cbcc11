"""The outcome policy: how an attempt ended, plus its step's settings, becomes "retry at T" or a
final outcome.

One pure function that the executor (a handler returned or raised), the reclaimer (a worker
died) and the deadline sweep (a worker hung) all ask, so a reclaimed task gets the same backoff
and fallback as one that failed in place. The deadline is the task's, not the attempt's: a
retry whose backoff would end past it is not waited for (no "retry amplification").
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from konduit.core.model import AttemptOutcome, Outcome
from konduit.core.policies import Retry

if TYPE_CHECKING:
    from konduit.core.workflow import StepSpec


class Ending(enum.Enum):
    """How one attempt ended."""

    RETURNED = "returned"  # the handler returned a payload that validated
    RAISED = "raised"  # the handler raised (anything, BaseException included)
    NON_RETRYABLE = "non_retryable"  # it raised an error marked non-retryable
    INVALID_OUTPUT = "invalid_output"  # it returned something unstorable or of the wrong type
    LEASE_LOST = "lease_lost"  # its worker died or hung: the reclaimer ends the attempt
    DEADLINE_PASSED = "deadline_passed"  # the task's budget ran out


@dataclass(frozen=True)
class RetryAt:
    """Run the task again after ``delay`` seconds; the attempt is recorded as ``attempt_outcome``."""

    delay: float
    attempt_outcome: AttemptOutcome  # RETRY, or LOST for a reclaimed attempt


@dataclass(frozen=True)
class Final:
    """End the task. When ``use_fallback`` is set the step's fallback runs first: its payload
    makes the task ``degraded``; without a payload (or no fallback) it ends ``outcome``."""

    outcome: Outcome  # succeeded, failed or timed_out
    attempt_outcome: AttemptOutcome | None  # how the attempt is recorded when not `outcome`
    use_fallback: bool
    reason: str | None


Verdict = RetryAt | Final


@dataclass(frozen=True)
class StepPolicy:
    """The settings of a step that decide its outcomes."""

    retry: Retry
    has_fallback: bool = False
    fallback_on_failure: bool = False


def policy_of(step: StepSpec) -> StepPolicy:
    return StepPolicy(step.retry, step.fallback is not None, step.fallback_on_failure)


def decide(
    policy: StepPolicy,
    ending: Ending,
    *,
    attempt: int,
    max_attempts: int,
    remaining: float | None,
    error: str | None = None,
    rng: random.Random | None = None,
    fallback_tried: bool = False,
) -> Verdict:
    """What happens to a task after its attempt number ``attempt`` ended as ``ending``.

    ``remaining`` is what is left of the task's deadline at this moment (None: no deadline).
    ``fallback_tried``: the task's fallback was started before and its caller never recorded
    what it returned (it killed or hung its worker). The task was being ended: it ends
    ``timed_out`` now, and the fallback is never called a second time.
    """
    lost = ending is Ending.LEASE_LOST
    # A reclaimed attempt is recorded as lost whatever follows for its task.
    as_lost = AttemptOutcome.LOST if lost else None
    if ending is Ending.RETURNED:
        return Final(Outcome.SUCCEEDED, None, False, None)
    if fallback_tried:
        return Final(
            Outcome.TIMED_OUT,
            as_lost,
            False,
            f"the fallback started after attempt {attempt} never returned (it killed or hung "
            f"its worker); it is not called again",
        )
    if ending is Ending.DEADLINE_PASSED or (remaining is not None and remaining <= 0):
        return Final(
            Outcome.TIMED_OUT,
            as_lost,
            policy.has_fallback,
            f"deadline exceeded (attempt {attempt})",
        )
    retryable = ending in (Ending.RAISED, Ending.LEASE_LOST)
    if retryable and attempt < max_attempts:
        delay = policy.retry.delay(attempt, rng=rng)
        if remaining is not None and delay >= remaining:
            # Waiting out the backoff would end past the deadline: the task could not succeed in
            # time, so it ends now instead of holding its join until the sweep catches it.
            last = (error or "").strip().splitlines()[-1:] or [""]
            return Final(
                Outcome.TIMED_OUT,
                as_lost or AttemptOutcome.FAILED,
                policy.has_fallback,
                f"retry {attempt + 1} would start {delay:.1f} s from now, past the task's "
                f"deadline ({remaining:.1f} s left)" + (f"; attempt {attempt}: {last[0]}" if last[0] else ""),
            )
        return RetryAt(delay, as_lost or AttemptOutcome.RETRY)
    return Final(Outcome.FAILED, as_lost, policy.fallback_on_failure, error)
