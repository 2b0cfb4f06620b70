"""The monitor's background threads must import none of our modules.

Two threads importing the same not-yet-loaded package can deadlock on Python's import locks; 3.11
breaks the cycle by raising `_DeadlockError` in one of them. Seen in CI: the fingerprint thread
imported `trainer_hooks.fingerprint` while the trainer's thread imported
`trainer_hooks.fingerprint.sampling` for its sampling report; fingerprinting failed and the
trainer's processor was never posted. Checked in a fresh interpreter, where nothing is loaded yet.
"""
from __future__ import annotations

import json
import subprocess
import sys

from tests.fixtures.tokenizers import build_chatml_tokenizer
from tests.support.live import ROOT

_SCRIPT = """
import json, sys
from transformers import AutoTokenizer
import trainer_hooks.monitor as monitor_module

tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
ours = lambda: {name for name in sys.modules if name.split(".")[0] == "trainer_hooks"}
before = ours()
monitor = monitor_module.ParityMonitor("imports", side="trainer", enabled=False)
fingerprint = monitor.register_processor(tokenizer).result(timeout=120)
print(json.dumps({"late": sorted(ours() - before), "components": sorted(fingerprint["components"])}))
"""


def test_fingerprinting_on_its_thread_imports_none_of_our_modules(tmp_path):
    tokenizer_dir = build_chatml_tokenizer(tmp_path)
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(tokenizer_dir)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "chat_template" in result["components"]  # the thread really fingerprinted the processor
    assert result["late"] == [], f"imported on the fingerprint thread: {result['late']}"
