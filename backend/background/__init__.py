"""The background workers that drive the layers below: the detection engine and one detector per
job kind (`engine`, `detectors/`), retention's deletions (`janitor`) and the dashboard's live
streams (`live`). The control long-poll is run control's (`backend/control/watch.py`); the
notifier and the webhook dispatcher live with what they deliver (`alerts/`, `webhooks/`)."""
