"""The only place that talks SQL. A store function takes the caller's `Session` and never commits,
rolls back or opens one of its own: the caller owns the transaction, one per unit of work
(docs/design.md, "The store and its transactions").

- Routes: one per answer, from `ReadSession` / `WriteSession` (backend/api/deps.py), begun at the
  first statement and committed or closed before the answer is sent; what must follow the commit
  goes through `after_commit` (backend/alerts/effects.py).
- Background workers (detection, the heartbeat sweep, notifier, dispatcher, janitor, control
  watcher, live streams), the CLI and the token service (backend/auth.py): one `Database.read()` / `write()` / `Effects.write()` per
  unit of work, passed down.
- A race with a concurrent insert is retried in a SAVEPOINT inside the caller's transaction
  (`rows.raced`).

Outside it by design, taking the `Database`: metric ingest (`metrics.MetricStore`), the heartbeat
UPDATE (`runs.touch_component`) and retention's `retention.RowRemover` write on a driver cursor
through the group-commit writer (`Database.run_raw`), where many requests share one transaction.
"""
