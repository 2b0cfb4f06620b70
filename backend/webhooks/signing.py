"""Standard Webhooks signatures: `webhook-signature: v1,<base64 HMAC-SHA256(id.timestamp.body)>`.

The secret is `whsec_<base64 key>`; receivers verify with the same key and refuse timestamps
outside a tolerance (replay protection).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_S = 300


class SignatureError(ValueError):
    pass


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    mac = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers_for(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
        "content-type": "application/json",
    }


def verify(secret: str, headers: dict[str, str], body: bytes, now: float, tolerance_s: int = DEFAULT_TOLERANCE_S) -> None:
    """Raise SignatureError unless one v1 signature matches and the timestamp is fresh."""
    h = {k.lower(): v for k, v in headers.items()}
    try:
        msg_id, ts = h["webhook-id"], int(h["webhook-timestamp"])
        signatures = h["webhook-signature"].split()
    except (KeyError, ValueError) as exc:
        raise SignatureError("missing or malformed webhook headers") from exc
    if abs(now - ts) > tolerance_s:
        raise SignatureError("timestamp outside the tolerance: possible replay")
    expected = sign(secret, msg_id, ts, body)
    if not any(hmac.compare_digest(expected, s) for s in signatures):
        raise SignatureError("no matching signature")
