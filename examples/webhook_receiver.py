"""A minimal receiver for Paritywatch's signed webhooks (Standard Webhooks scheme).

    PARITYWATCH_WEBHOOK_SECRET=whsec_... python examples/webhook_receiver.py --port 9000

Verifies `webhook-signature` (HMAC-SHA256 over "id.timestamp.body"), refuses stale timestamps
(replay protection) and duplicate `webhook-id`s (a retried delivery), then prints the event.
Standard library only, so it runs anywhere you want to page someone.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

TOLERANCE_S = 300


def verify(secret: str, headers, body: bytes, now: float) -> None:  # noqa: ANN001
    msg_id, ts, sigs = headers["webhook-id"], int(headers["webhook-timestamp"]), headers["webhook-signature"]
    if abs(now - ts) > TOLERANCE_S:
        raise ValueError("stale timestamp")
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = "v1," + base64.b64encode(hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()).decode()
    if not any(hmac.compare_digest(expected, s) for s in sigs.split()):
        raise ValueError("bad signature")


def make_handler(secret: str):  # noqa: ANN201
    seen: set[str] = set()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            try:
                verify(secret, self.headers, body, time.time())
            except (KeyError, ValueError) as exc:
                self.send_response(401)
                self.end_headers()
                print(f"refused: {exc}")
                return
            msg_id = self.headers["webhook-id"]
            if msg_id not in seen:  # a retry of a delivered event is acknowledged, not re-processed
                seen.add(msg_id)
                event = json.loads(body)
                alert = event.get("data", {}).get("alert", {})
                print(f"{event['type']}: {alert.get('severity', '')} {alert.get('title', '')}", flush=True)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--secret", default=os.environ.get("PARITYWATCH_WEBHOOK_SECRET"))
    args = ap.parse_args()
    if not args.secret:
        raise SystemExit("pass --secret or set PARITYWATCH_WEBHOOK_SECRET (shown once when the webhook was created)")
    print(f"listening on http://127.0.0.1:{args.port}/")
    HTTPServer(("127.0.0.1", args.port), make_handler(args.secret)).serve_forever()


if __name__ == "__main__":
    main()
