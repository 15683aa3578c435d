"""The prompt set that drafter training continues with the base model's own greedy text.

Everything here is written by the project (no third-party data): chat requests built from templates and
topics, and code prompts cut from the CPython standard library on the machine (function signatures with
their docstrings). The prompts used to *measure* a drafter (``specframe/bench/data/chat.jsonl``) are written
separately and share no template with these.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

TEMPLATES = (
    "What is {topic}?",
    "Explain {topic} in simple terms.",
    "Give me three facts about {topic}.",
    "Write a short paragraph about {topic}.",
    "Why is {topic} important?",
    "How would you describe {topic} to a child?",
    "List the main ideas behind {topic}.",
    "What are the pros and cons of {topic}?",
    "Write a haiku about {topic}.",
    "Summarize the history of {topic} in a few sentences.",
    "What should a beginner know about {topic}?",
    "Tell me a fun fact about {topic}.",
    "Compare {topic} with {other}.",
    "What is the difference between {topic} and {other}?",
    "Write an email to a friend about {topic}.",
    "Give me a step-by-step guide to learning {topic}.",
    "What are common misconceptions about {topic}?",
    "Write a short story that involves {topic}.",
)
TOPICS = (
    "photosynthesis",
    "the moon",
    "volcanoes",
    "the water cycle",
    "gravity",
    "the internet",
    "electricity",
    "democracy",
    "the Roman Empire",
    "machine learning",
    "climate change",
    "the human heart",
    "bees",
    "the ocean",
    "coffee",
    "chess",
    "the piano",
    "recycling",
    "solar energy",
    "the immune system",
    "mountains",
    "the French Revolution",
    "black holes",
    "bread baking",
    "rainbows",
    "dinosaurs",
    "the stock market",
    "vaccines",
    "the printing press",
    "football",
    "meditation",
    "sleep",
    "friendship",
    "honey",
    "trains",
    "the desert",
    "earthquakes",
    "the alphabet",
    "music theory",
    "gardening",
    "cats",
    "dogs",
    "the brain",
    "vitamins",
    "the Olympic Games",
    "bicycles",
    "glaciers",
    "ancient Egypt",
    "the periodic table",
    "bridges",
    "the speed of light",
    "tides",
    "forests",
    "tea",
    "budgeting",
    "public speaking",
    "time management",
    "the solar system",
    "the Great Wall of China",
    "penguins",
    "airplanes",
    "rivers",
    "the Renaissance",
    "cloud computing",
    "databases",
    "Python programming",
    "prime numbers",
    "fractions",
    "the Pythagorean theorem",
    "probability",
    "the metric system",
)
CODE_TASKS = (
    "reverses a string",
    "checks whether a number is prime",
    "returns the n-th Fibonacci number",
    "counts the vowels in a string",
    "merges two sorted lists",
    "finds the largest element of a list",
    "removes duplicates from a list while keeping order",
    "computes the factorial of n",
    "checks whether a string is a palindrome",
    "flattens a nested list",
    "converts Celsius to Fahrenheit",
    "sums the digits of an integer",
    "returns the greatest common divisor of two numbers",
    "counts word frequencies in a text",
    "sorts a list of dictionaries by a key",
    "reads a file and counts its lines",
    "transposes a matrix",
    "checks whether two strings are anagrams",
    "computes the mean and median of a list",
    "finds all even numbers in a list",
    "capitalizes every word in a sentence",
    "implements binary search",
)
CODE_TEMPLATES = (
    "Write a Python function that {task}.",
    "How do I write a function in Python that {task}?",
    "Show me Python code that {task}, with a short explanation.",
)


def chat_prompts() -> list[str]:
    """Every chat request the templates make (a few thousand, in a fixed order)."""
    prompts = []
    for t, template in enumerate(TEMPLATES):
        for i, topic in enumerate(TOPICS):
            other = TOPICS[(i + 7 + t) % len(TOPICS)]
            prompts.append(template.format(topic=topic, other=other))
    prompts += [template.format(task=task) for template in CODE_TEMPLATES for task in CODE_TASKS]
    return prompts


def code_prompts(limit: int = 2000) -> list[str]:
    """Function heads with docstrings from the standard library source (``def ...:`` plus the docstring)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    prompts = []
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and ast.get_docstring(node) and node.body:
                doc = node.body[0]
                head = "\n".join(lines[node.lineno - 1 : doc.end_lineno]).strip("\n")
                if 40 <= len(head) <= 600 and not head.startswith(" "):
                    prompts.append(head + "\n")
        if len(prompts) >= limit:
            break
    return prompts[:limit]


def training_prompts(count: int, seed: int = 0, code_share: float = 0.3) -> list[tuple[str, bool]]:
    """``count`` prompts, ``(text, is_chat)``, a ``code_share`` of them raw code, shuffled reproducibly."""
    rng = random.Random(seed)
    chats, codes = chat_prompts(), code_prompts()
    rng.shuffle(chats)
    rng.shuffle(codes)
    code_count = min(len(codes), int(round(count * code_share)))
    chosen = [(p, True) for p in chats[: count - code_count]] + [(p, False) for p in codes[:code_count]]
    rng.shuffle(chosen)
    return chosen
