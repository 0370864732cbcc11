"""The outcome policy (pure): how an attempt ended + the step's settings -> retry at T or final."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

import konduit
from konduit.core.outcome import Ending, Final, RetryAt, StepPolicy, decide

retries = st.builds(
    konduit.Retry,
    max_attempts=st.integers(1, 8),
    backoff=st.sampled_from(["fixed", "linear", "exponential"]),
    base=st.floats(0.0, 20.0),
    cap=st.floats(0.0, 60.0),
    jitter=st.booleans(),
)
policies = st.builds(StepPolicy, retry=retries, has_fallback=st.booleans(),
                     fallback_on_failure=st.booleans())
endings = st.sampled_from(list(Ending))
remainings = st.one_of(st.none(), st.floats(-5.0, 100.0))


@settings(max_examples=500, deadline=None)
@given(policies, endings, st.integers(1, 8), remainings, st.integers(0, 2**32))
def test_every_ending_gets_one_verdict_that_respects_the_deadline_and_the_attempts(
    policy, ending, attempt, remaining, seed
):
    attempt = min(attempt, policy.retry.max_attempts)
    verdict = decide(policy, ending, attempt=attempt, max_attempts=policy.retry.max_attempts,
                     remaining=remaining, error="boom", rng=random.Random(seed))
    if ending is Ending.RETURNED:
        assert verdict == Final("succeeded", None, False, None)
        return
    if isinstance(verdict, RetryAt):
        # A retry only for a retryable ending with attempts left, and never past the deadline.
        assert ending in (Ending.RAISED, Ending.LEASE_LOST)
        assert attempt < policy.retry.max_attempts
        assert remaining is None or verdict.delay < remaining
        assert 0.0 <= verdict.delay <= float(policy.retry.cap)
        assert verdict.attempt_outcome == ("lost" if ending is Ending.LEASE_LOST else "retry")
        return
    assert isinstance(verdict, Final)
    assert verdict.outcome in ("failed", "timed_out")
    if verdict.outcome == "timed_out":
        # Timed out: the deadline passed, or waiting out the backoff would cross it; the
        # fallback (when there is one) degrades it.
        assert ending is Ending.DEADLINE_PASSED or remaining is not None
        assert verdict.use_fallback == policy.has_fallback
    else:
        assert verdict.use_fallback == policy.fallback_on_failure
        assert ending in (Ending.NON_RETRYABLE, Ending.INVALID_OUTPUT) \
            or attempt >= policy.retry.max_attempts
    if ending is Ending.LEASE_LOST:
        assert verdict.attempt_outcome == "lost"


def test_a_backoff_that_would_cross_the_deadline_ends_the_task_now():
    policy = StepPolicy(konduit.Retry(max_attempts=5, backoff="fixed", base="10s", jitter=False),
                        has_fallback=True)
    verdict = decide(policy, Ending.RAISED, attempt=1, max_attempts=5, remaining=2.0,
                     error="Traceback...\nConnectionError: resize service slow")
    assert isinstance(verdict, Final)
    assert (verdict.outcome, verdict.use_fallback, verdict.attempt_outcome) == (
        "timed_out", True, "failed")
    assert "past the task's deadline" in verdict.reason and "ConnectionError" in verdict.reason
    # With room for the backoff it retries.
    assert decide(policy, Ending.RAISED, attempt=1, max_attempts=5, remaining=10.5) == RetryAt(
        10.0, "retry")


def test_a_reclaimed_attempt_gets_the_same_backoff_and_fallback_as_one_that_failed_in_place():
    policy = StepPolicy(konduit.Retry(max_attempts=2, backoff="fixed", base="3s", jitter=False),
                        has_fallback=True, fallback_on_failure=True)
    assert decide(policy, Ending.LEASE_LOST, attempt=1, max_attempts=2, remaining=None) == \
        RetryAt(3.0, "lost")
    final = decide(policy, Ending.LEASE_LOST, attempt=2, max_attempts=2, remaining=None,
                   error="lease expired")
    assert final == Final("failed", "lost", True, "lease expired")


def test_non_retryable_and_invalid_output_fail_at_once():
    policy = StepPolicy(konduit.Retry(max_attempts=9))
    for ending in (Ending.NON_RETRYABLE, Ending.INVALID_OUTPUT):
        verdict = decide(policy, ending, attempt=1, max_attempts=9, remaining=None, error="bad")
        assert verdict == Final("failed", None, False, "bad")


@settings(max_examples=300, deadline=None)
@given(policies, endings, st.integers(1, 8), remainings)
def test_a_task_whose_fallback_was_tried_ends_timed_out_without_calling_it_again(
    policy, ending, attempt, remaining
):
    """Its fallback was started and never returned (it killed or hung its worker): whatever
    ended the attempt, the task ends now, timed_out, and the fallback is not called again —
    only a handler's own result still counts."""
    attempt = min(attempt, policy.retry.max_attempts)
    verdict = decide(policy, ending, attempt=attempt, max_attempts=policy.retry.max_attempts,
                     remaining=remaining, error="boom", fallback_tried=True)
    if ending is Ending.RETURNED:
        assert verdict == Final("succeeded", None, False, None)
        return
    assert isinstance(verdict, Final)
    assert (verdict.outcome, verdict.use_fallback) == ("timed_out", False)
    assert verdict.attempt_outcome == ("lost" if ending is Ending.LEASE_LOST else None)
    assert verdict.reason is not None and "never returned" in verdict.reason
