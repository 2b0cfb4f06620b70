"""Domain errors raised by the store; api/errors.py maps each to one HTTP status."""
from __future__ import annotations

from trainer_hooks import contract


class ParitywatchError(Exception):
    status = 400
    code = contract.ERROR_BAD_REQUEST

    def __init__(self, message: str, details: list | None = None):
        super().__init__(message)
        self.message = message
        self.details = details


class NotFound(ParitywatchError):
    status = 404
    code = contract.ERROR_NOT_FOUND


class FingerprintUnknown(NotFound):
    code = contract.ERROR_FINGERPRINT_UNKNOWN


class Conflict(ParitywatchError):
    status = 409
    code = contract.ERROR_CONFLICT


class Invalid(ParitywatchError):
    status = 422
    code = contract.ERROR_VALIDATION


class TooLarge(ParitywatchError):
    status = 413
    code = contract.ERROR_PAYLOAD_TOO_LARGE
