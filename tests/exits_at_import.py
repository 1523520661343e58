"""A module whose import ends the process (as a native crash in an agent's import would): a worker that loads it
dies before it can say why, which only the runner's crash-loop rule can catch."""

import os

os._exit(3)
