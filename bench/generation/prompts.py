"""The fixed requests every side of the generation benchmark answers.

Chat prompts of mixed short lengths (a few words to a paragraph) with mixed
``max_tokens`` (16-128): what a chat front end sends a small instruct model.
The list is fixed, not sampled, so every side and every run sees the same
requests in the same order; request ``k`` of a level is ``PROMPTS[k % len]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_PARAGRAPH = (
    "The Rhine rises in the Swiss Alps, forms part of the border between Switzerland, "
    "Liechtenstein, Austria, Germany and France, and flows through Germany and the "
    "Netherlands into the North Sea. For centuries it has been one of the most important "
    "waterways of Europe, carrying coal, grain and containers between the ports of the "
    "delta and the industrial cities upstream."
)
_RECIPE = (
    "Preheat the oven to 200 degrees. Peel four potatoes, cut them into thin slices and "
    "layer them in a buttered dish with grated cheese, salt and pepper. Pour cream over "
    "the layers until they are almost covered and bake for about fifty minutes, until "
    "the top is golden."
)
_EMAIL = (
    "Hi team, the release planned for Thursday moves to Monday because the database "
    "migration failed on the staging cluster and we need two more days to test the "
    "rollback. Please keep merging bug fixes, but hold new features until the release "
    "is out. Thanks, Maria"
)


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.text}]


PROMPTS: tuple[Prompt, ...] = (
    Prompt("What is the capital of France?", 16),
    Prompt(f"Summarize in one sentence: {_PARAGRAPH}", 64),
    Prompt("Write a haiku about autumn leaves.", 32),
    Prompt(f"List the steps of this recipe as bullet points: {_RECIPE}", 128),
    Prompt("Explain what a hash table is to a beginner.", 128),
    Prompt(f"Write a short reply to this email: {_EMAIL}", 64),
    Prompt("Name three planets of the solar system.", 16),
    Prompt("Give me a tip for learning a new language.", 32),
    Prompt(f"Which countries does the Rhine flow through? {_PARAGRAPH}", 32),
    Prompt("Translate 'good morning, how are you?' into German.", 16),
    Prompt("Why is the sky blue? Answer briefly.", 64),
    Prompt(f"What should the team do until Monday? {_EMAIL}", 64),
    Prompt("Write a Python function that reverses a string.", 128),
    Prompt("What is 12 times 7?", 16),
    Prompt(f"How long does the dish bake, and at what temperature? {_RECIPE}", 32),
    Prompt("Describe a cat in two sentences.", 64),
)


def body(prompt: Prompt, model: str) -> dict[str, Any]:
    """The request every side gets: greedy, streamed, with the usage chunk at the end."""
    return {
        "model": model,
        "messages": prompt.messages(),
        "max_tokens": prompt.max_tokens,
        "temperature": 0.0,
        "seed": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
