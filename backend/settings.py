"""One settings object for the whole service, read from PARITYWATCH_* environment variables."""
from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainer_hooks import contract

DEFAULT_SQLITE_URL = "sqlite:///./paritywatch.db"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PARITYWATCH_", extra="ignore")

    database_url: str = DEFAULT_SQLITE_URL
    host: str = "127.0.0.1"
    port: int = 8321
    # Request limits: a fingerprint of a 128k-vocab tokenizer is a few MB; everything else is small.
    max_body_bytes: int = 32 * 1024 * 1024
    max_points_per_batch: int = contract.MAX_POINTS_PER_BATCH
    max_key_length: int = contract.MAX_KEY_LENGTH
    max_new_keys_per_batch: int = Field(default=contract.MAX_NEW_KEYS_PER_BATCH, ge=1)
    max_keys_per_run: int = Field(default=contract.MAX_KEYS_PER_RUN, ge=1)
    # Bounded reads: raw points one series read may decode (beyond: a 422 asking for fewer
    # points or a narrower range), and the JSON size of a run's config.
    max_read_raw_points: int = 2_000_000
    max_run_config_bytes: int = 64 * 1024
    # JSON size of the fingerprint diff a processor_mismatch alert stores (and every webhook and
    # list of alerts repeats); the parity endpoint always has the whole diff.
    max_alert_detail_bytes: int = 256 * 1024
    # Retention: raw points of batches received more than this many days ago are dropped (their
    # roll-ups stay, so old runs still chart at >= 16-step buckets). 0 keeps them forever.
    retention_raw_days: float = 0.0
    retention_check_interval_s: float = 3600.0
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
    # gc.freeze() of the heap built at startup (docs/design.md "Slow and hostile clients"). It is
    # process-wide: `paritywatch serve`, which owns its process, asks for it; an app embedded in
    # another program (its tests, a notebook) leaves that program's garbage collection alone.
    freeze_startup_heap: bool = False
    # --- Security (docs/design.md "Security model") ---
    # Open mode: with no API token ever created, local callers (loopback peer, loopback Host, no
    # foreign Origin) are admin. Off unless asked for: `paritywatch serve` on a loopback bind asks.
    open_mode: bool = False
    # Bodies of routes other than metric batches and fingerprints (those get max_body_bytes).
    max_small_body_bytes: int = 1024 * 1024
    # Slow clients (docs/design.md "Slow and hostile clients"): a request's head must arrive within
    # header_timeout_s of its first byte (or of the connection, for the first request), its body
    # within body_timeout_s of the head; otherwise the connection is closed (a 408 for the body).
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=60.0, gt=0)
    # A metric batch may not reach further than this past its run's last step (a typo or a
    # nanosecond clock used as a step would pin the run's last step for good).
    max_step_ahead: int = 2**30
    # Webhook targets: private, CGNAT, ULA, site-local, link-local, metadata... are refused unless
    # they fall in one of these networks (comma-separated CIDRs, e.g. "10.20.0.0/16").
    webhook_allowed_networks: str = ""
    # Bytes of a receiver's answer read (never decompressed) to measure it; the rest is dropped.
    webhook_max_answer_bytes: int = 4096
    # Deliveries sent at once per process (a slow receiver holds one slot, not the queue).
    webhook_concurrency: int = 16
    # Fernet keys (comma-separated, newest first) that encrypt webhook signing secrets at rest.
    secret_keys: str = ""
    # Live event streams: at most this many open per token, each ended after stream_max_age_s
    # (the dashboard reconnects); revoked tokens are noticed within stream_auth_check_s.
    max_streams_per_token: int = 16
    stream_max_age_s: float = 3600.0
    stream_auth_check_s: float = 2.0
    stream_poll_interval_s: float = 0.5
    # Notification grouping defaults (docs/api.md, "Grouping"); each webhook may override them.
    webhook_group_by: list[str] = ["run", "kind"]
    webhook_group_wait_s: float = 5.0
    webhook_group_interval_s: float = 60.0
    webhook_repeat_interval_s: float = 4 * 3600.0
    notify_interval_s: float = 0.5  # the notifier looks at due groups at least this often
    # Weight-sync attestation (docs/design.md): a version the trainer attested must be attested by
    # every live rollout worker that takes part within attest_grace_s, and no such worker may be
    # more than attest_max_lag trainer versions behind.
    attest_grace_s: float = 300.0
    attest_max_lag: int = 1
    # Detection jobs the request that wrote them did not finish are taken up after this long.
    detect_job_grace_s: float = 5.0
    # A sample_audit alert resolves once this many audited batches in a row are clean (one bad
    # batch does not page again per batch: the open alert is refreshed instead).
    audit_clear_batches: int = Field(default=10, ge=1, le=1000)
    # The dashboard's address as people reach it, for links in webhook payloads
    # (default: http://<host>:<port>).
    public_url: str | None = None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
