"""Policy training backends: the trainable policy, the update, checkpoints, torch in this process or DeepSpeed."""
