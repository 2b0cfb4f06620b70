"""Paritywatch backend: REST API, SQL store, detection and alerts, dashboard server."""
