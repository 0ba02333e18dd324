"""Kairos: scheduled and webhook-triggered agent runs, exactly once per fire.

PostgreSQL is the single authority: every decision (what is due, who holds a run, what happened) is
a row written under a guarded statement. AWS services (EventBridge, SQS, API Gateway) only carry
wake-ups and opaque run ids. Handlers in ``functions/`` are thin; all logic lives in this package.
"""

from __future__ import annotations

__version__ = "0.1.0"
