"""A minimal receiver for Paritywatch's signed webhooks (Standard Webhooks scheme).

    pip install standardwebhooks
    PARITYWATCH_WEBHOOK_SECRET=whsec_... python examples/webhook_receiver.py --port 9000

Verifies `webhook-signature` with the `standardwebhooks` reference library (HMAC-SHA256 over
"id.timestamp.body", timestamps older or newer than 5 minutes refused), then prints one line per
event: what happened, to which run, and its link (`describe`; every type, an unknown one too).
Replays are refused across restarts: the `webhook-id`s seen in the last hour are kept in a small
SQLite file (--state), so a retried delivery is acknowledged without being processed twice.

Answers: 204 processed (or a known duplicate), 400 missing/malformed webhook headers or a body
that is not JSON, 401 bad signature or stale timestamp, 411 no Content-Length, 413 body over
--max-body bytes (never read).
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TextIO

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

MAX_BODY = 1024 * 1024
REMEMBER_S = 3600  # far longer than the 5-minute timestamp tolerance: older replays fail on time
REQUIRED = ("webhook-id", "webhook-timestamp", "webhook-signature")


class SeenIds:
    """webhook-ids already processed, on disk: survives a restart of the receiver."""

    def __init__(self, path: str):
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._lock = threading.Lock()
        self._db.execute("CREATE TABLE IF NOT EXISTS seen (id TEXT PRIMARY KEY, at REAL NOT NULL)")
        self._db.commit()

    def first_time(self, msg_id: str, now: float) -> bool:
        with self._lock, self._db:
            self._db.execute("DELETE FROM seen WHERE at < ?", (now - REMEMBER_S,))
            return self._db.execute("INSERT OR IGNORE INTO seen (id, at) VALUES (?, ?)", (msg_id, now)).rowcount == 1

    def close(self) -> None:
        self._db.close()


def describe(event: dict) -> str:
    """One line per event, whatever its type: what happened, to which run, and where to look."""
    kind, data = event.get("type"), event.get("data") or {}
    run, alert = data.get("run") or {}, data.get("alert") or {}
    where = f"run {run.get('project')}/{run.get('name')}" if run else ""
    if kind == "test":
        text = f"{data.get('message') or 'test event'}: this webhook works"
    elif kind in ("run.control", "run.ended_tainted"):
        control = data.get("control") or {}
        why = f": {control['reason']}" if control.get("reason") else ""
        text = f"{where} is now {control.get('state') or run.get('state')} (by {control.get('actor') or 'paritywatch'}{why})"
        taint = data.get("taint") or {}
        if taint.get("tainted"):  # it trained on steps while a divergence was open: which, and since when
            ranges = "; ".join(r.get("summary", "") for r in (taint.get("ranges") or [])[:3])
            text += f"; trained on tainted steps from step {taint.get('first_step')}" + (f" ({ranges})" if ranges else "")
    elif kind == "alert.acknowledged":
        note = f" ({data['note']})" if data.get("note") else ""
        text = f"{data.get('actor') or 'someone'} acknowledged {alert.get('severity')} {alert.get('title')!r}{note} — {where}"
    elif kind in ("alert.firing", "alert.resolved"):
        # per group: the summary says how many alerts and which workers, the first alert what is wrong,
        # the reason why the message came now
        text = f"{alert.get('severity', '')} {alert.get('title', '')} — {where}".strip(" —")
        if data.get("summary"):
            text = data["summary"] + (f": {alert['title']}" if alert.get("title") else "")
        text += f" (why now: {data['reason']})" if data.get("reason") else ""
    else:  # a type this receiver does not know yet: show what it carries
        text = json.dumps(data, sort_keys=True)[:300]
    link = data.get("url") or run.get("url")
    return f"{kind}: {text}" + (f" {link}" if link else "")


def make_server(secret: str, state_path: str, port: int = 9000, host: str = "127.0.0.1",
                out: TextIO = sys.stdout, max_body: int = MAX_BODY) -> HTTPServer:
    webhook = Webhook(secret)
    seen = SeenIds(state_path)

    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a client that sends its request slowly does not hold the receiver

        def do_POST(self):
            length = self.headers.get("content-length")
            if length is None or not length.isdigit():
                return self._answer(411, "a Content-Length is required")
            if int(length) > max_body:
                self.close_connection = True
                return self._answer(413, f"body over {max_body} bytes")
            body = self.rfile.read(int(length))
            headers = {k.lower(): v for k, v in self.headers.items()}
            missing = [h for h in REQUIRED if not headers.get(h)]
            if missing or not headers["webhook-timestamp"].isdigit():
                return self._answer(400, f"missing or malformed header(s): {', '.join(missing) or 'webhook-timestamp'}")
            try:
                webhook.verify(body, headers, json_parse=False)
            except (WebhookVerificationError, ValueError) as exc:  # incl. malformed signatures, non-UTF-8
                return self._answer(401, f"refused: {exc}")
            try:
                event = json.loads(body)
            except ValueError:
                return self._answer(400, "body is not JSON")
            if seen.first_time(headers["webhook-id"], time.time()):  # a retry is acknowledged, not re-run
                print(describe(event), file=out, flush=True)
            self._answer(204)

        def _answer(self, status: int, reason: str = "") -> None:
            if reason:
                print(f"{status} {reason}", file=out, flush=True)
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer((host, port), Handler)
    server.seen = seen  # closed with the server by the caller
    return server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--secret", default=os.environ.get("PARITYWATCH_WEBHOOK_SECRET"))
    ap.add_argument("--state", default="webhook-receiver-seen.sqlite", help="where seen webhook-ids are kept")
    ap.add_argument("--max-body", type=int, default=MAX_BODY)
    args = ap.parse_args()
    if not args.secret:
        raise SystemExit("pass --secret or set PARITYWATCH_WEBHOOK_SECRET (shown once when the webhook was created)")
    server = make_server(args.secret, args.state, args.port, max_body=args.max_body)
    print(f"listening on http://127.0.0.1:{args.port}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.seen.close()


if __name__ == "__main__":
    main()
