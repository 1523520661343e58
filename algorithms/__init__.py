"""algorithms: the training side. Plugins that read the store, learn, and publish new resources.

Rooms: ``base``, ``session``, ``collect``, ``progress`` and ``extras`` are the plugin contract and the loop every
algorithm shares (no algorithm family, no torch); ``rl`` is LightningRL (GRPO, PPO, REINFORCE++, AIR); ``apo`` is
prompt optimization (no weights, no torch); ``training`` holds the backends a policy update runs on (in process,
DeepSpeed) and ``serving`` the policy servers (built-in transformers, vLLM); ``cli`` is ``store train``;
``local_stack`` starts the servers and runners a run needs on one machine.

May import: the core (``lightning_store``) and ``adapters``; never ``runners`` or ``tracers`` (a run starts
runners as processes). Only this package imports torch, transformers, peft, DeepSpeed and vLLM. The rules are
import-linter contracts in ``pyproject.toml``.
"""
