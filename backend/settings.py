"""One settings object for the whole service, read from PARITYWATCH_* environment variables."""
from __future__ import annotations

from functools import lru_cache

from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SQLITE_URL = "sqlite:///./paritywatch.db"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PARITYWATCH_", extra="ignore")

    database_url: str = DEFAULT_SQLITE_URL
    host: str = "127.0.0.1"
    port: int = 8321
    # Request limits: a fingerprint of a 128k-vocab tokenizer is a few MB; everything else is small.
    max_body_bytes: int = 32 * 1024 * 1024
    max_points_per_batch: int = 100_000
    max_key_length: int = 200
    # Long-poll of the control state.
    control_wait_max_s: float = 60.0
    control_poll_interval_s: float = 0.1
    # Serve the dashboard from frontend/ at "/".
    serve_dashboard: bool = True
    # Detection.
    heartbeat_timeout_s: float = 60.0
    heartbeat_check_interval_s: float = 5.0
    # Webhooks.
    allow_loopback_webhooks: bool = False
    webhook_timeout_s: float = 10.0
    webhook_backoff_base_s: float = 2.0
    webhook_backoff_cap_s: float = 300.0
    webhook_give_up_after_s: float = 6 * 3600.0
    webhook_poll_interval_s: float = 0.5
    webhook_claim_s: float = 60.0
    run_background_workers: bool = True


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
