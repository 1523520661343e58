"""LightningRL: GRPO, REINFORCE++ and PPO on transitions (one LLM call each), over the training backends."""
