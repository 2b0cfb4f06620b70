"""`paritywatch` command line: serve, db, token, fingerprint, diff, demo."""
from __future__ import annotations

import argparse
import json
import os
import sys

DB_HELP = "database URL (default: $PARITYWATCH_DATABASE_URL or sqlite:///./paritywatch.db)"


def _db_url(args: argparse.Namespace) -> str:
    from paritywatch.backend.settings import get_settings

    return args.db or get_settings().database_url


def shown_db_url(url: str) -> str:
    """The database as a person should read it: password hidden, a SQLite path absolute (a
    relative one names a different file in every directory)."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
    except Exception:
        return "(unparseable database URL)"
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        u = u.set(database=os.path.abspath(os.path.expanduser(u.database)))
    return u.render_as_string(hide_password=True)


def _say_which_db(args: argparse.Namespace) -> str:
    """Tell the user (on stderr: stdout may be JSON) which database this command opens."""
    url = _db_url(args)
    source = "--db" if args.db else ("$PARITYWATCH_DATABASE_URL" if os.environ.get("PARITYWATCH_DATABASE_URL")
                                     else "the default")
    print(f"database: {shown_db_url(url)} (from {source})", file=sys.stderr)
    return url


def _require_schema(url: str) -> bool:
    """False, after saying so, when the database has no Paritywatch schema: most likely the
    command was pointed at the wrong database."""
    from sqlalchemy.engine import make_url

    from paritywatch.backend import migrate

    u = make_url(url)
    missing_file = u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:") \
        and not os.path.exists(os.path.expanduser(u.database))
    if not missing_file and migrate.current_revision(url) is not None:  # (connecting would create the file)
        return True
    print(f"error: {shown_db_url(url)} has no Paritywatch schema: is this the database your server uses? "
          "(pass its --db; `paritywatch db upgrade --db URL` creates the schema)", file=sys.stderr)
    return False


def db_option_for(args: argparse.Namespace) -> str:
    """`--db ...` that makes another command open this command's database, for hints."""
    import shlex

    from sqlalchemy.engine import make_url

    url = _db_url(args)
    if make_url(url).password is None:
        return f"--db {shlex.quote(shown_db_url(url))}"
    if not args.db:
        return '--db "$PARITYWATCH_DATABASE_URL"'
    return f"--db {shlex.quote(shown_db_url(url))} (with the password in place of ***)"


def _open_mode_wanted(args: argparse.Namespace, loopback: bool) -> bool:
    if args.open is not None:
        return args.open
    env = os.environ.get("PARITYWATCH_OPEN_MODE")
    if env is not None:
        return env.strip().lower() in ("1", "true", "yes", "on")
    return loopback


def access_mode(open_mode: bool, *, active: int, revoked: int, db_option: str) -> str:
    """What `serve` says about who may call it, true in each case: open mode holds only while no
    token was ever created (revoking every token does not reopen it)."""
    create = f"paritywatch token create --scope admin --name me {db_option}"
    if open_mode and not active and not revoked:
        return "open: no tokens, callers on this machine are admin"
    if active:
        plural = "token" if active == 1 else "tokens"
        return f"tokens required: {active} active {plural} (paritywatch token list {db_option})"
    if revoked:
        return f"tokens required, and every token is revoked: nobody can call it until you create one ({create})"
    return f"tokens required, and none exists yet: create one ({create})"


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from paritywatch.backend import migrate
    from paritywatch.backend.auth import ensure_bootstrap_token, has_active_tokens, list_tokens
    from paritywatch.backend.db import Database
    from paritywatch.backend.middleware import is_loopback
    from paritywatch.backend.serving import HeadDeadlineProtocol
    from trainer_hooks import contract

    url = _say_which_db(args)
    loopback = is_loopback(args.host)
    open_mode = _open_mode_wanted(args, loopback)
    if open_mode and not loopback:
        print(f"error: open mode is for a loopback bind only, not {args.host}", file=sys.stderr)
        return 2
    os.environ["PARITYWATCH_DATABASE_URL"] = url
    os.environ["PARITYWATCH_HOST"] = args.host
    os.environ["PARITYWATCH_PORT"] = str(args.port)
    os.environ["PARITYWATCH_OPEN_MODE"] = "1" if open_mode else "0"
    os.environ["PARITYWATCH_FREEZE_STARTUP_HEAP"] = "1"  # this process (each worker's) is the server's own
    # The app reads these through get_settings(), which _say_which_db() already called (and
    # cached) before they were set: without this, `serve` without --db never ran open.
    from paritywatch.backend.settings import get_settings

    get_settings.cache_clear()
    migrate.upgrade(url)
    bootstrap = os.environ.get("PARITYWATCH_BOOTSTRAP_TOKEN")
    db = Database(url)
    try:
        if bootstrap:
            try:
                if ensure_bootstrap_token(db, bootstrap):
                    print("created the admin token given in PARITYWATCH_BOOTSTRAP_TOKEN", file=sys.stderr)
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        if not loopback and not has_active_tokens(db):
            print(
                f"refusing to serve on {args.host} without API tokens: anyone who can reach it could "
                "pause your runs.\nCreate one first, in this database:\n"
                f"  paritywatch token create --scope admin --name me {db_option_for(args)}\n"
                "or set PARITYWATCH_BOOTSTRAP_TOKEN.",
                file=sys.stderr,
            )
            return 2
        tokens = list_tokens(db)
    finally:
        db.dispose()
    active = sum(1 for t in tokens if not t.revoked)
    mode = access_mode(open_mode, active=active, revoked=len(tokens) - active, db_option=db_option_for(args))
    print(f"Paritywatch dashboard: http://{args.host}:{args.port}/  (database: {shown_db_url(url)}; {mode})", flush=True)
    uvicorn.run(
        "paritywatch.backend.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        access_log=args.access_log,
        # Open control long-polls would otherwise hold a SIGTERM for up to a minute.
        timeout_graceful_shutdown=3,
        timeout_keep_alive=contract.SERVER_KEEPALIVE_S,  # longer than the hooks keep theirs
        http=HeadDeadlineProtocol,  # a trickled request head is cut off (PARITYWATCH_HEADER_TIMEOUT_S)
    )
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from paritywatch.backend import migrate

    url = _say_which_db(args)
    migrate.upgrade(url, args.revision)
    print(f"schema at {migrate.current_revision(url)}")
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    from paritywatch.backend import migrate

    current = migrate.current_revision(_say_which_db(args))
    head = migrate.head_revision()
    print(f"current: {current or '(empty database)'}\nhead:    {head}")
    return 0 if current == head else 1


def cmd_token_create(args: argparse.Namespace) -> int:
    from paritywatch.backend import migrate
    from paritywatch.backend.auth import create_token
    from paritywatch.backend.db import Database

    url = _say_which_db(args)
    migrate.upgrade(url)
    db = Database(url)
    try:
        row, secret = create_token(db, args.name, args.scope, args.project)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        db.dispose()
    if args.json:
        print(json.dumps({"id": row.id, "name": row.name, "scopes": row.scopes.split(","), "project": row.project,
                          "token": secret}))
    else:
        where = f" project={row.project}" if row.project else ""
        print(f"token {row.id} '{row.name}' scopes={row.scopes}{where}\n{secret}\n(shown once: store it now)")
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    from paritywatch.backend.auth import list_tokens
    from paritywatch.backend.db import Database

    url = _say_which_db(args)
    if not _require_schema(url):
        return 2
    db = Database(url)
    try:
        for t in list_tokens(db):
            state = "revoked" if t.revoked else "active"
            project = t.project or "(all projects)"
            print(f"{t.id:>4}  {t.prefix}…  {t.scopes:<20} {state:<8} {project:<20} {t.name}")
    finally:
        db.dispose()
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from paritywatch.backend.auth import revoke_token
    from paritywatch.backend.db import Database

    url = _say_which_db(args)
    if not _require_schema(url):
        return 2
    db = Database(url)
    try:
        ok = revoke_token(db, args.id)
    finally:
        db.dispose()
    print("revoked" if ok else f"no token {args.id}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def cmd_secret_key_generate(args: argparse.Namespace) -> int:
    from paritywatch.backend.webhooks.secrets import generate_key

    print(generate_key())
    return 0


def cmd_secret_key_rotate(args: argparse.Namespace) -> int:
    from paritywatch.backend import migrate
    from paritywatch.backend.db import Database
    from paritywatch.backend.settings import Settings
    from paritywatch.backend.webhooks.secrets import SecretBox, SecretUnreadable, reseal_all

    box = SecretBox(Settings().secret_keys)
    if not box.configured:
        print("error: set PARITYWATCH_SECRET_KEYS (the new key first, then the old ones)", file=sys.stderr)
        return 2
    migrate.upgrade(_db_url(args))
    db = Database(_db_url(args))
    try:
        n = reseal_all(db, box)
    except SecretUnreadable as exc:
        print(f"error: {exc}: keep every old key in PARITYWATCH_SECRET_KEYS until the rotation is done",
              file=sys.stderr)
        return 1
    finally:
        db.dispose()
    print(f"re-encrypted {n} webhook secret(s) with the first key; the other keys may now be removed")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paritywatch",
        description="Catch trainer / rollout processor drift in async RL runs.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the API and dashboard", description=(
        "Run the REST API and the dashboard. Upgrades the database schema first. On a loopback "
        "address with no API token ever created the server runs open: callers on this machine are "
        "admin (--no-open to require tokens anyway); on any other address it refuses to start "
        "without a token."))
    serve.add_argument("--db", help=DB_HELP)
    serve.add_argument("--host", default=os.environ.get("PARITYWATCH_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("PARITYWATCH_PORT", "8321")))
    serve.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (PostgreSQL recommended for > 1)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.add_argument("--open", action=argparse.BooleanOptionalAction, default=None,
                       help="open mode while no token exists (default: on for a loopback bind; "
                            "$PARITYWATCH_OPEN_MODE overrides the default)")
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
    create.add_argument("--project", default=None,
                        help="bind an ingest token to this project: it creates and feeds only its runs")
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

    key = sub.add_parser("secret-key", help="keys that encrypt webhook secrets at rest", description=(
        "Webhook signing secrets are stored encrypted with the Fernet keys in PARITYWATCH_SECRET_KEYS "
        "(comma-separated, newest first). Rotate: put a new key first, restart, run `rotate`, drop the old key."))
    key_sub = key.add_subparsers(dest="key_command", required=True, metavar="ACTION")
    gen = key_sub.add_parser("generate", help="print a new key")
    gen.set_defaults(func=cmd_secret_key_generate)
    rot = key_sub.add_parser("rotate", help="re-encrypt every webhook secret with the first key")
    rot.add_argument("--db", help=DB_HELP)
    rot.set_defaults(func=cmd_secret_key_rotate)

    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub) -> None:
    from paritywatch.demo.command import add_demo_command
    from trainer_hooks.fingerprint.cli import add_fingerprint_commands

    add_fingerprint_commands(sub)
    add_demo_command(sub)


def main(argv: list[str] | None = None) -> int:
    """``argv`` None: the command line, and this process is the command's (the fingerprint
    commands then load tokenizers without torch: trainer_hooks/fingerprint/cli.py)."""
    args = build_parser().parse_args(argv)
    args.own_process = argv is None
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
