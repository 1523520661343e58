"""Adapters: stored rollouts → training data.

``read_episodes`` reads a batch of finished rollouts (their LLM calls, rewards, tool and agent spans) with a
fixed number of store queries; ``TransitionAdapter`` turns episodes into one :class:`Transition` per LLM call,
with credit assignment (``Identical``, ``Discounted``, ``AIR``) and agent selection; ``transcripts`` gives the
same calls as chat transcripts for prompt optimization and SFT.
"""

from adapters.credit import AIR, CreditAssignment, Discounted, Identical, credit_assignment
from adapters.episodes import AgentSpan, Episode, EpisodeBatch, ToolCall, read_episodes
from adapters.messages import Transcript, transcripts
from adapters.transitions import Adapted, Transition, TransitionAdapter

__all__ = [
    "AIR",
    "Adapted",
    "AgentSpan",
    "CreditAssignment",
    "Discounted",
    "Episode",
    "EpisodeBatch",
    "Identical",
    "ToolCall",
    "Transcript",
    "Transition",
    "TransitionAdapter",
    "credit_assignment",
    "read_episodes",
    "transcripts",
]
