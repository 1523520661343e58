"""Runners: pull rollouts from a store and run agents on them in parallel, surviving crashes and hangs.

``@rollout`` marks an agent; ``Runner(agent_spec, store_url, workers=N).run()`` (or ``store run``) runs it in N
supervised worker processes; ``Worker`` runs attempts in the current process (async agents, tests, training).
``prompt(name, default)`` gives framework code the running attempt's prompt template (``runners.current``).
"""

from runners.agent import RolloutAgent, load_agent, rollout
from runners.attempts import release
from runners.current import current_resources, prompt
from runners.supervisor import Runner, RunSummary
from runners.worker import Worker

__all__ = [
    "RolloutAgent",
    "RunSummary",
    "Runner",
    "Worker",
    "current_resources",
    "load_agent",
    "prompt",
    "release",
    "rollout",
]
