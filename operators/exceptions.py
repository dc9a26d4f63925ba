"""The one exception type of the ``operators`` package.

Every failure an operator, hook or trigger reports is an :class:`ArealAirflowError` (an
``AirflowException``, so Airflow fails the task and applies its retries); the message says what was
wrong and how to fix it. Errors of ``areal_tasks`` and ``storage`` are wrapped with ``raise ... from``
so their traceback stays attached. :class:`ArealConfigError` (a subclass, also an
``AirflowFailException``) marks failures that retrying cannot fix, so Airflow skips the retries.
"""

from __future__ import annotations

from airflow.sdk.exceptions import AirflowException, AirflowFailException

__all__ = ["ArealAirflowError", "ArealConfigError"]


class ArealAirflowError(AirflowException):
    """A task of the areal-tasks pipeline failed; the message names the cause and the fix."""


class ArealConfigError(ArealAirflowError, AirflowFailException):
    """A failure that a retry cannot fix (a bad config path or value): the task fails without retrying."""
