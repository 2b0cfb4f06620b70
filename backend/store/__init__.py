"""The only place that talks SQL. Routes call these functions; they never open sessions."""
