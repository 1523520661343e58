"""Runners: pull rollouts from a store and run agents on them in parallel, surviving crashes and hangs.

``@rollout`` marks an agent; ``Runner(agent_spec, store_url, workers=N).run()`` (or ``store run``) runs it in N
supervised worker processes; ``Worker`` runs attempts in the current process (async agents, tests, training).
"""

from runners.agent import RolloutAgent, load_agent, rollout
from runners.attempts import release
from runners.supervisor import Runner, RunSummary
from runners.worker import Worker

__all__ = ["RolloutAgent", "RunSummary", "Runner", "Worker", "load_agent", "release", "rollout"]
