"""A yes/no question answerer whose prompt template APO optimizes (docs/how-to/optimize-a-prompt.md)."""
