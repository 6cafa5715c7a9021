"""The speculative-decoding benchmark's workloads (scripts/bench-speculative, scripts/spec-replay).

Editing: the answer rewrites a given paragraph or function with a small change, so most of it
copies the prompt (what n-gram lookup is for). Free chat: nothing to copy.
"""

from __future__ import annotations

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for more than two hundred years. Every "
    "night its keeper climbed the narrow stairs, trimmed the wick and polished the great lens, "
    "so that ships passing in the dark would see the beam and steer clear of the rocks below. "
    "When the keeper grew old, his daughter took over the work, and she kept the light burning "
    "through storms, fog and the long winters."
)
FUNCTION = (
    "def average(values):\n"
    "    if not values:\n"
    "        return 0\n"
    "    total = 0\n"
    "    for value in values:\n"
    "        total += value\n"
    "    return total / len(values)\n"
)
EDITING = (
    "Rewrite the following paragraph exactly, but replace 'lighthouse' with 'tower'. "
    "Change nothing else.\n\n" + PARAGRAPH,
    "Rename the function below from average to mean. Output the whole function and change "
    "nothing else.\n\n" + FUNCTION,
    "Repeat the following text word for word, but change 'daughter' to 'son':\n\n" + PARAGRAPH,
)
CHAT = (
    "Write a short story about a robot who learns to paint.",
    "What are some good habits for staying healthy? Explain each one.",
    "Explain how rain forms, for a ten-year-old.",
)
