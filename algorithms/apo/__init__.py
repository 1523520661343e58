"""APO: prompt optimization over the store (Pareto and beam search, reflection by an optimizer LLM). No torch."""
