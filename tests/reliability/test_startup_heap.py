"""`paritywatch serve` freezes the heap it built at startup (frameworks, app, caches) while it
serves: the cycle collector's full collections, which stop the event loop, no longer walk it (the
load bench measured full collections of up to 228 ms before). Unfrozen at shutdown. An app embedded
in another program leaves that program's collector alone: freezing is process-wide, and an
embedding program's garbage frozen and collected later can run its finalizers at the wrong time
(the vLLM suite: an earlier engine's teardown destroyed the next one's parallel state)."""
from __future__ import annotations

import gc
import os

import pytest
import uvicorn

from paritywatch.backend import cli
from paritywatch.backend.main import create_app
from paritywatch.backend.settings import Settings, get_settings
from tests.support.live import local_client


def walked_by_the_collector(obj) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_the_server_leaves_its_startup_heap_out_of_collections_while_it_serves(db_url):
    settings = Settings(database_url=db_url, host="127.0.0.1", open_mode=True, freeze_startup_heap=True)
    app = create_app(settings, upgrade_schema=False)
    assert walked_by_the_collector(app)
    with local_client(app) as client:
        assert client.get("/healthz").status_code == 200
        assert not walked_by_the_collector(app)
        served = [["made while serving"]]
        assert walked_by_the_collector(served)  # only what existed at startup is frozen
    assert walked_by_the_collector(app)


def test_an_embedded_app_leaves_the_program_s_collector_alone(db_url):
    earlier = [["the embedding program's"]]
    app = create_app(Settings(database_url=db_url, host="127.0.0.1", open_mode=True), upgrade_schema=False)
    with local_client(app) as client:
        assert client.get("/healthz").status_code == 200
        assert walked_by_the_collector(earlier) and walked_by_the_collector(app)


def test_serve_asks_for_the_freeze(tmp_path):
    """`paritywatch serve` sets the setting for the app uvicorn builds in its own process, through
    the environment (as it does the others); the test puts that environment back after."""
    names = [f"PARITYWATCH_{n}" for n in ("DATABASE_URL", "HOST", "PORT", "OPEN_MODE", "FREEZE_STARTUP_HEAP")]
    before = {n: os.environ.get(n) for n in names}
    with pytest.MonkeyPatch.context() as m:
        for name in names:
            # set first, so the context records and restores it (a delenv of an absent name
            # records nothing: serve's PARITYWATCH_OPEN_MODE=1 leaked to a later test once)
            m.setenv(name, "")
            m.delenv(name)
        m.setattr(uvicorn, "run", lambda *a, **k: None)
        try:
            assert cli.main(["serve", "--db", f"sqlite:///{tmp_path / 's.db'}", "--port", "0"]) == 0
            assert get_settings().freeze_startup_heap is True
        finally:
            get_settings.cache_clear()
    assert {n: os.environ.get(n) for n in names} == before
