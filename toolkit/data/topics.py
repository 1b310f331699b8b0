"""A prompt set written for the project: topics crossed with instruction templates, deterministic for a seed.

`toolkit quickstart` trains on the target's own answers to these (no data is fetched). The mix covers
explanation, how-to, lists, comparison, writing, code and arithmetic, the kinds of request chat benchmarks
such as MT-bench ask; some prompts have a follow-up turn, answered after the target's own first answer.
"""
from __future__ import annotations

import random

TOPICS = [
    "photosynthesis", "black holes", "the water cycle", "volcanoes", "climate change", "vaccines", "DNA",
    "the immune system", "plate tectonics", "rainbows", "the moon's phases", "earthquakes", "electricity",
    "magnets", "gravity", "the speed of light", "atoms", "the periodic table", "recycling", "bees",
    "coral reefs", "rainforests", "deserts", "the ocean tides", "solar panels", "wind turbines", "batteries",
    "electric cars", "airplanes", "the internet", "email", "passwords", "encryption", "databases",
    "spreadsheets", "machine learning", "search engines", "smartphones", "GPS", "3D printing", "robots",
    "the Roman Empire", "ancient Egypt", "the printing press", "the industrial revolution", "the Silk Road",
    "the Renaissance", "the first moon landing", "the Olympic Games", "chess", "football", "running",
    "yoga", "sleep", "drinking water", "breakfast", "healthy eating", "vitamins", "stress", "meditation",
    "time management", "public speaking", "job interviews", "writing a CV", "saving money", "budgeting",
    "compound interest", "inflation", "taxes", "small businesses", "marketing", "customer service",
    "teamwork", "leadership", "learning a language", "reading habits", "libraries", "museums", "travel",
    "packing a suitcase", "camping", "hiking", "gardening", "houseplants", "composting", "cooking pasta",
    "baking bread", "making coffee", "tea", "chocolate", "cheese", "rice", "pizza", "soup", "salads",
    "dogs", "cats", "birds", "horses", "dolphins", "elephants", "penguins", "owls", "butterflies", "ants",
    "music", "the piano", "the guitar", "painting", "photography", "poetry", "movies", "theatre",
    "video games", "board games", "friendship", "kindness", "birthdays", "holidays", "winter", "summer",
    "cities", "villages", "bridges", "trains", "bicycles", "rivers", "mountains", "islands", "maps",
]

TEMPLATES = [
    "Explain {t} in simple terms.",
    "What are three interesting facts about {t}?",
    "Write a short paragraph about {t} for a ten-year-old.",
    "Give me five tips related to {t}.",
    "What are the main advantages and disadvantages of {t}?",
    "Write a haiku about {t}.",
    "Write a short story (about 100 words) that involves {t}.",
    "Summarize the history of {t} in a few sentences.",
    "What is a common misconception about {t}?",
    "Describe {t} to someone who has never heard of it.",
    "Write a friendly email inviting a colleague to a talk about {t}.",
    "List the key terms someone should know about {t}, with one-line definitions.",
    "How would you teach a beginner about {t}? Give a step-by-step plan.",
    "Write a tweet-length fun fact about {t}.",
    "Compare {t} with {u}: how are they similar and how do they differ?",
    "Write a Python function related to {t}, with a docstring and an example.",
    "Create a short quiz with three questions about {t}, and give the answers.",
]

ARITHMETIC = [
    "A shop sells {a} apples a day for {b} days. How many apples does it sell? Show your steps.",
    "What is {a} times {b}? Explain how you got it.",
    "If a train travels {a} km in {b} hours, what is its average speed? Show your working.",
    "Tom has {a} marbles and gives away {b}. How many are left? Explain.",
]

FOLLOW_UPS = ["Now make it shorter.", "Can you give an example?", "Rewrite that in a more formal tone.",
              "Summarize your answer in one sentence.", "Explain the most important point in more detail."]


def topic_prompts(n: int, seed: int = 0, start: int = 0, follow_up_share: float = 0.25) -> list[dict]:
    """Conversations start..start+n-1 of the set for `seed`, each {"id", "messages": [{"role": "user", ...}]}:
    user turns only (the target answers them). Disjoint ranges give disjoint prompts (train vs held out)."""
    if n < 1:
        raise ValueError(f"asked for {n} prompts; give at least 1")
    rng = random.Random(seed)
    texts = [tpl.format(t=t, u=rng.choice(TOPICS)) for t in TOPICS for tpl in TEMPLATES]
    texts += [tpl.format(a=rng.randint(3, 99), b=rng.randint(2, 30)) for tpl in ARITHMETIC for _ in range(40)]
    rng.shuffle(texts)
    if start + n > len(texts):
        raise ValueError(f"asked for prompts {start}..{start + n - 1}; this set has {len(texts)}")
    out = []
    for i, text in enumerate(texts):
        follow = rng.choice(FOLLOW_UPS) if rng.random() < follow_up_share else None  # drawn for every i: stable
        if start <= i < start + n:
            turns = [text] + ([follow] if follow else [])
            out.append({"id": f"topic-{seed}-{i}", "messages": [{"role": "user", "content": u} for u in turns]})
    return out
