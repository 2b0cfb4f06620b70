"""`paritywatch` command line: serve, db, token, fingerprint, diff, demo."""
from __future__ import annotations

import argparse
import json
import os
import sys

DB_HELP = "database URL (default: $PARITYWATCH_DATABASE_URL or sqlite:///./paritywatch.db)"


def _db_url(args: argparse.Namespace) -> str:
    from backend.settings import get_settings

    return args.db or get_settings().database_url


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from backend import migrate
    from backend.auth import ensure_bootstrap_token, has_active_tokens
    from backend.db import Database
    from backend.main import is_loopback

    url = _db_url(args)
    os.environ["PARITYWATCH_DATABASE_URL"] = url
    os.environ["PARITYWATCH_HOST"] = args.host
    os.environ["PARITYWATCH_PORT"] = str(args.port)
    migrate.upgrade(url)
    bootstrap = os.environ.get("PARITYWATCH_BOOTSTRAP_TOKEN")
    if bootstrap:
        db = Database(url)
        try:
            if ensure_bootstrap_token(db, bootstrap):
                print("created the admin token given in PARITYWATCH_BOOTSTRAP_TOKEN", file=sys.stderr)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        finally:
            db.dispose()
    if not is_loopback(args.host):
        db = Database(url)
        try:
            if not has_active_tokens(db):
                print(
                    f"refusing to serve on {args.host} without API tokens: anyone who can reach it could "
                    "pause your runs.\nCreate one first (paritywatch token create --scope admin --name me) "
                    "or set PARITYWATCH_BOOTSTRAP_TOKEN.",
                    file=sys.stderr,
                )
                return 2
        finally:
            db.dispose()
    print(f"Paritywatch dashboard: http://{args.host}:{args.port}/  (database: {url})", flush=True)
    uvicorn.run(
        "backend.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        access_log=args.access_log,
        # Open control long-polls would otherwise hold a SIGTERM for up to a minute.
        timeout_graceful_shutdown=3,
    )
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from backend import migrate

    migrate.upgrade(_db_url(args), args.revision)
    print(f"schema at {migrate.current_revision(_db_url(args))}")
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    from backend import migrate

    current = migrate.current_revision(_db_url(args))
    head = migrate.head_revision()
    print(f"current: {current or '(empty database)'}\nhead:    {head}")
    return 0 if current == head else 1


def cmd_token_create(args: argparse.Namespace) -> int:
    from backend import migrate
    from backend.auth import create_token
    from backend.db import Database

    migrate.upgrade(_db_url(args))
    db = Database(_db_url(args))
    try:
        row, secret = create_token(db, args.name, args.scope)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        db.dispose()
    if args.json:
        print(json.dumps({"id": row.id, "name": row.name, "scopes": row.scopes.split(","), "token": secret}))
    else:
        print(f"token {row.id} '{row.name}' scopes={row.scopes}\n{secret}\n(shown once: store it now)")
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    from backend.auth import list_tokens
    from backend.db import Database

    db = Database(_db_url(args))
    try:
        for t in list_tokens(db):
            state = "revoked" if t.revoked else "active"
            print(f"{t.id:>4}  {t.prefix}…  {t.scopes:<20} {state:<8} {t.name}")
    finally:
        db.dispose()
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from backend.auth import revoke_token
    from backend.db import Database

    db = Database(_db_url(args))
    try:
        ok = revoke_token(db, args.id)
    finally:
        db.dispose()
    print("revoked" if ok else f"no token {args.id}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paritywatch",
        description="Catch trainer / rollout processor drift in async RL runs.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the API and dashboard", description=(
        "Run the REST API and the dashboard. Upgrades the database schema first. On a loopback "
        "address with no tokens the server runs open (every caller is admin); on any other "
        "address it refuses to start without tokens."))
    serve.add_argument("--db", help=DB_HELP)
    serve.add_argument("--host", default=os.environ.get("PARITYWATCH_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("PARITYWATCH_PORT", "8321")))
    serve.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (PostgreSQL recommended for > 1)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.set_defaults(func=cmd_serve)

    db = sub.add_parser("db", help="schema migrations", description="Manage the database schema (Alembic).")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = db_sub.add_parser("upgrade", help="upgrade the schema (default: to head)")
    up.add_argument("revision", nargs="?", default="head")
    up.add_argument("--db", help=DB_HELP)
    up.set_defaults(func=cmd_db_upgrade)
    cur = db_sub.add_parser("current", help="show the schema revision; exit 1 if not at head")
    cur.add_argument("--db", help=DB_HELP)
    cur.set_defaults(func=cmd_db_current)

    tok = sub.add_parser("token", help="API tokens", description="Create, list and revoke scoped API tokens.")
    tok_sub = tok.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = tok_sub.add_parser("create", help="create a token and print its secret once", description=(
        "Scopes: ingest (hooks: post runs, fingerprints, metrics, read control state), "
        "read (dashboard, every GET), admin (everything, incl. pause/resume/stop)."))
    create.add_argument("--scope", action="append", required=True, choices=["ingest", "read", "admin"],
                        help="repeat for several scopes")
    create.add_argument("--name", default="default", help="a label to recognise the token by")
    create.add_argument("--json", action="store_true", help="print a JSON object")
    create.add_argument("--db", help=DB_HELP)
    create.set_defaults(func=cmd_token_create)
    ls = tok_sub.add_parser("list", help="list tokens (never their secrets)")
    ls.add_argument("--db", help=DB_HELP)
    ls.set_defaults(func=cmd_token_list)
    rv = tok_sub.add_parser("revoke", help="revoke a token by id")
    rv.add_argument("id", type=int)
    rv.add_argument("--db", help=DB_HELP)
    rv.set_defaults(func=cmd_token_revoke)

    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub) -> None:  # noqa: ANN001
    from demo.run import add_demo_command
    from trainer_hooks.fingerprint.cli import add_fingerprint_commands

    add_fingerprint_commands(sub)
    add_demo_command(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
