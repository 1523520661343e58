"""algorithms: the training side. Plugins that read the store, learn, and publish new resources.

Rooms: ``base``, ``session``, ``collect``, ``progress`` and ``extras`` are the plugin contract and the loop every
algorithm shares (no algorithm family, no torch); ``rl`` is LightningRL (GRPO, PPO, REINFORCE++, AIR); ``apo`` is
prompt optimization (no weights, no torch); ``training`` holds the backends a policy update runs on (in process,
DeepSpeed) and ``serving`` the policy servers (built-in transformers, vLLM); ``cli`` is ``store train``;
``local_stack`` starts the servers and runners a run needs on one machine; ``trainer`` is the Python API of the
whole loop (``from algorithms import Trainer, GRPO``), which ``store train`` is built on.

May import: the core (``lightning_store``) and ``adapters``; never ``runners`` or ``tracers`` (a run starts
runners as processes). Only this package imports torch, transformers, peft, DeepSpeed and vLLM. The rules are
import-linter contracts in ``pyproject.toml``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from algorithms.apo.algorithm import APO
    from algorithms.progress import Summary
    from algorithms.rl.builtin import GRPO, PPO, ReinforcePP
    from algorithms.trainer import Trainer

__all__ = ["APO", "GRPO", "PPO", "ReinforcePP", "Summary", "Trainer"]

_HOMES = {
    "APO": "algorithms.apo.algorithm",
    "GRPO": "algorithms.rl.builtin",
    "PPO": "algorithms.rl.builtin",
    "ReinforcePP": "algorithms.rl.builtin",
    "Summary": "algorithms.progress",
    "Trainer": "algorithms.trainer",
}


def __getattr__(name: str) -> Any:
    """The Python API's names, imported when first asked for: ``import algorithms`` loads no torch (the RL
    algorithms need it, APO and the Trainer do not)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'algorithms' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
