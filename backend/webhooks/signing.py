"""Standard Webhooks signatures (the `standardwebhooks` reference library computes them).

`webhook-signature: v1,<base64 HMAC-SHA256(key, "id.timestamp.body")>`; the secret is
`whsec_<base64 key>`. Receivers verify with the same key and refuse timestamps outside a
tolerance (replay protection). `verify` takes the clock as an argument (the library's own verify
reads the wall clock), so the tolerance is testable; the signature itself is the library's.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from datetime import datetime, timezone

from standardwebhooks.webhooks import Webhook

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_S = 300


class SignatureError(ValueError):
    pass


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    when = datetime.fromtimestamp(timestamp, tz=timezone.utc)
    return Webhook(secret).sign(msg_id=msg_id, timestamp=when, data=body.decode("utf-8"))


def headers_for(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
        "content-type": "application/json",
    }


def verify(secret: str, headers, body: bytes, now: float, tolerance_s: int = DEFAULT_TOLERANCE_S) -> None:
    """Raise SignatureError unless one v1 signature matches and the timestamp is fresh."""
    h = {k.lower(): v for k, v in headers.items()}
    try:
        msg_id, ts = h["webhook-id"], int(h["webhook-timestamp"])
        signatures = h["webhook-signature"].split()
    except (KeyError, ValueError) as exc:
        raise SignatureError("missing or malformed webhook headers") from exc
    if abs(now - ts) > tolerance_s:
        raise SignatureError("timestamp outside the tolerance: possible replay")
    try:
        expected = sign(secret, msg_id, ts, body)
    except (UnicodeDecodeError, binascii.Error, ValueError) as exc:
        raise SignatureError("body is not UTF-8 or the secret is malformed") from exc
    if not any(hmac.compare_digest(expected, s) for s in signatures):
        raise SignatureError("no matching signature")
