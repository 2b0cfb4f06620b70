"""What the dashboard and the API docs download: plotly.js (the partial bundle when installed,
precompressed, immutable; the full bundle from the Python package otherwise) and Swagger UI from
an installed package. Over HTTP through the real app; the browser side is in tests/browser/."""
from __future__ import annotations

import gzip
import re

import pytest
from fastapi.testclient import TestClient

import paritywatch.backend.main as main
from paritywatch.backend.main import accepts_gzip, create_app
from paritywatch.backend.settings import Settings


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}"))) as c:
        yield c


@pytest.mark.parametrize("header,ok", [
    ("gzip", True), ("gzip, deflate, br", True), ("br;q=1.0, gzip;q=0.8", True), ("*", True),
    ("gzip;q=0", False), ("GZIP;Q=0.0", False), ("identity", False), ("", False), ("deflate, br", False),
])
def test_accept_encoding_negotiation(header, ok):
    assert accepts_gzip(header) is ok


def test_the_page_preloads_the_bundle_it_serves_gzipped_and_immutable(client):
    url = client.get("/api/v1/ui-config").json()["plotly_url"]
    assert re.search(r'<link rel="preload" as="script" href="([^"]+)"', client.get("/").text).group(1) == url
    _, path, gzipped = main.plotly_bundle()
    plain = client.get(url, headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200 and "content-encoding" not in plain.headers
    assert plain.content == path.read_bytes()
    assert "immutable" in plain.headers["cache-control"] and "max-age=31536000" in plain.headers["cache-control"]
    assert plain.headers["content-type"].startswith("text/javascript")
    if gzipped is None:
        pytest.skip("no partial bundle installed (scripts/fetch_plotly_bundle.sh): the full bundle is served plain")
    assert url.startswith("/vendor/plotly-basic-")
    zipped = client.get(url, headers={"Accept-Encoding": "gzip, deflate"})
    assert zipped.headers["content-encoding"] == "gzip" and "accept-encoding" in zipped.headers["vary"].lower()
    assert int(zipped.headers["content-length"]) == gzipped.stat().st_size < path.stat().st_size / 2
    assert zipped.content == plain.content  # httpx decoded it: the same script
    assert gzip.decompress(gzipped.read_bytes()) == path.read_bytes()
    assert client.get(url, headers={"Accept-Encoding": "gzip;q=0"}).headers.get("content-encoding") is None


def test_without_the_partial_bundle_the_full_one_from_the_plotly_package_is_served(tmp_path, monkeypatch):
    import plotly

    monkeypatch.setattr(main, "FRONTEND_DIR", tmp_path)  # no vendor/ folder there
    url, path, gzipped = main.plotly_bundle()
    assert gzipped is None and path.parent.parent == __import__("pathlib").Path(plotly.__file__).parent
    assert url.startswith("/vendor/plotly-") and not url.startswith("/vendor/plotly-basic-")
    assert path.stat().st_size > 3_000_000


def test_api_docs_come_from_this_server_under_its_csp(client):
    page = client.get("/api/docs")
    assert page.status_code == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "unsafe-inline" not in page.headers["content-security-policy"].split("script-src", 1)[1].split(";")[0]
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page.text, re.S)
    assert scripts and all(body.strip() == "" for _, body in scripts), "an inline script: the CSP blocks it"
    for ref in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        assert ref.startswith("/"), f"{ref} is not on this server"
        r = client.get(ref)
        assert r.status_code == 200, ref
    bundle = next(ref for ref in re.findall(r'src="([^"]+)"', page.text) if ref.endswith("swagger-ui-bundle.js"))
    assert "immutable" in client.get(bundle).headers["cache-control"]
    assert client.get(bundle.rsplit("/", 1)[0] + "/redoc.standalone.js").status_code == 404  # only what the page uses
    # the schema is unchanged by serving the docs: none of these routes is in it
    paths = client.get("/api/v1/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith(("/api/docs", "/vendor"))]
