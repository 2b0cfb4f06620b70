"""Counts for Prometheus /metrics (read at scrape time)."""
from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from paritywatch.backend.models import Alert, Run, WebhookDelivery


def service_counts(s: Session) -> dict[str, dict[str, int]]:
    return {
        "runs": dict(s.execute(select(Run.control_state, func.count()).group_by(Run.control_state)).all()),
        "alerts": dict(s.execute(select(Alert.severity, func.count()).where(Alert.status != "resolved")
                                 .group_by(Alert.severity)).all()),
        "deliveries": dict(s.execute(select(WebhookDelivery.status, func.count())
                                     .group_by(WebhookDelivery.status)).all()),
    }
