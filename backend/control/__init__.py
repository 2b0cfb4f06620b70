"""Run control's home on the server: the run state machine and the process lifecycle that drives
it (`run_state`: the only writer of a run's control state), and the long-poll that wakes waiting
hooks the moment it changes (`watch`). Around it, each in its layer's folder: the SQL
(`store/control.py`), the HTTP routes and their models (`api/routes/control.py`,
`schemas/control.py`), the states and transitions on the wire (`trainer_hooks/contract.py`) and
the client that obeys them (`trainer_hooks/control.py`)."""
