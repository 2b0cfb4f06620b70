"""Unknown API paths and wrong methods answer in the error shape, never with dashboard files;
routes registered next to the dashboard stay reachable."""


def test_unknown_api_path_is_404_in_the_error_shape(client):
    r = client.get("/api/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_wrong_method_is_405_with_allow(client):
    r = client.request("OPTIONS", "/api/v1/runs/1/control")
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
    assert r.json()["error"]["code"] == "method_not_allowed"


def test_dashboard_routes_and_files_still_answer(client):
    cfg = client.get("/api/v1/ui-config")
    assert cfg.status_code == 200 and cfg.json()["plotly_url"].startswith("/vendor/plotly-")
    assert client.get(cfg.json()["plotly_url"]).status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    # the versioned plotly bundle is preloaded while the HTML parses
    assert f'<link rel="preload" as="script" href="{cfg.json()["plotly_url"]}">' in page.text
