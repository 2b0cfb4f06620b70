"""One rollout worker for tests/e2e/test_weight_attestation.py: a real ParityMonitor and a tiny
random Qwen2 of its own. Each stdin line `load PATH VERSION [PERTURB_NAME]` loads the weights the
trainer saved at PATH into the model (changing the named tensor first, as a corrupted transfer
would), attests the model it now holds, flushes, and prints `attested VERSION`. `close` ends it.

    python -m tests.e2e.attest_process URL RUN WORKER_ID SPOOL_DIR
"""
from __future__ import annotations

import sys

import torch

from tests.e2e.tiny_qwen2 import tiny_qwen2
from trainer_hooks.monitor import ParityMonitor


def main() -> int:
    url, run, worker_id, spool = sys.argv[1:5]
    model = tiny_qwen2(seed=1)  # not the trainer's weights until it loads them
    with ParityMonitor(run, project="attest", side="rollout", url=url, worker_id=worker_id, spool_dir=spool,
                       flush_interval_s=0.1, heartbeat_interval_s=0.5, poll_timeout_s=2.0) as monitor:
        print("ready", flush=True)
        for line in sys.stdin:
            command = line.split()
            if not command or command[0] == "close":
                break
            path, version, perturb = command[1], int(command[2]), command[3] if len(command) > 3 else None
            state = torch.load(path)
            if perturb:
                state[perturb] = state[perturb].clone()
                state[perturb].view(-1)[0] += 1e-3
            model.load_state_dict(state)
            monitor.attest_weights(model, version=version)
            print("attested", version, monitor.flush(30), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
