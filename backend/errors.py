"""Domain errors raised by the store; api/errors.py maps each to one HTTP status."""
from __future__ import annotations


class ParitywatchError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, details: list | None = None):
        super().__init__(message)
        self.message = message
        self.details = details


class NotFound(ParitywatchError):
    status = 404
    code = "not_found"


class FingerprintUnknown(NotFound):
    code = "fingerprint_unknown"


class Conflict(ParitywatchError):
    status = 409
    code = "conflict"


class Invalid(ParitywatchError):
    status = 422
    code = "validation_error"


class TooLarge(ParitywatchError):
    status = 413
    code = "payload_too_large"
