"""The agent-loop workers of verl 0.9's v1 trainer (TransferQueue): the default manager
``AgentLoopManagerTQ`` and its ``AgentLoopWorkerTQ`` actors, with Paritywatch (`_verl_rollout`).

A module of its own: importing it imports ``transfer_queue``, which verl's older
``AgentLoopManager`` path does not need. Imported lazily through `trainer_hooks.integrations.verl`.
"""
from __future__ import annotations

from typing import Any

import ray
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from ._verl_rollout import ParityAgentLoopWorkerMixin, close_worker_monitors


class ParityAgentLoopWorkerTQ(ParityAgentLoopWorkerMixin, AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's ``AgentLoopWorkerTQ`` (a ``@ray.remote`` class: its own class is subclassed) with Paritywatch."""


class ParityAgentLoopManagerTQ(AgentLoopManagerTQ):
    """``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` for verl's v1 trainer (the
    default the Paritywatch entry point sets): its workers are `ParityAgentLoopWorkerTQ` actors."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # AgentLoopManagerTQ sets its own worker class before its base reads it.
        self.agent_loop_workers_class = ray.remote(ParityAgentLoopWorkerTQ)

    def close_parity_monitors(self) -> list[bool]:
        return close_worker_monitors(self.agent_loop_workers)
