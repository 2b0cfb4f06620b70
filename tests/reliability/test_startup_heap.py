"""The heap the server builds at startup (frameworks, app, caches) is frozen while it serves: the
cycle collector's full collections, which stop the event loop, no longer walk it (the load bench
measured 9 full collections in 30 s, up to 163 ms each, before). Unfrozen at shutdown, so a stopped
app's own cycles can be collected in a process that goes on (an embedding program, this suite)."""
from __future__ import annotations

import gc

from paritywatch.backend.main import create_app
from paritywatch.backend.settings import Settings
from tests.support.live import local_client


def walked_by_the_collector(obj) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_the_startup_heap_is_left_out_of_collections_while_the_app_serves(db_url):
    app = create_app(Settings(database_url=db_url, host="127.0.0.1", open_mode=True), upgrade_schema=False)
    assert walked_by_the_collector(app)
    with local_client(app) as client:
        assert client.get("/healthz").status_code == 200
        assert not walked_by_the_collector(app)
        served = [["made while serving"]]
        assert walked_by_the_collector(served)  # only what existed at startup is frozen
    assert walked_by_the_collector(app)
