"""A prompt set written for the project: topics crossed with instruction templates, deterministic for a seed.

`toolkit quickstart` trains on the target's own answers to these (no data is fetched). The mix covers
explanation, how-to, lists, comparison, writing, code and arithmetic, the kinds of request chat benchmarks
such as MT-bench ask; some prompts have a follow-up turn, answered after the target's own first answer.

Version 2 is a second, disjoint set over the same topics with request kinds the first lacks (role-play,
extraction from a given text, argument and reasoning, longer writing forms, code in other languages, word
problems with percentages, areas and equations) and MT-bench-style follow-ups that rework the first answer.
A new version, not new templates in version 1: adding templates would reorder version 1 for every seed, and
the data regenerated from it is indexed by position.
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


TEMPLATES_V2 = [
    "Pretend you are {p}. Explain {t} to a group of visitors, staying in character.",
    "Imagine you are {p} who has just discovered {t}. Write a diary entry about the day.",
    "Role-play a short dialogue between a curious child and {p} about {t}.",
    "Here is a note: \"{n1} will present on {t} in {c} on {d}; {n2} brings {a} printed copies and the budget is "
    "{b}00 dollars.\" Extract the people, place, day and numbers as a JSON object.",
    "Read this sentence and put every fact in a two-column table: \"Our {t} club in {c} has {a} members, meets "
    "every {d}, and was started by {n1} {b} years ago.\"",
    "Someone says \"{t} is a waste of time.\" Give the strongest argument for and against this, then your "
    "verdict.",
    "Think step by step: what would change in everyday life if {t} suddenly disappeared?",
    "Write a persuasive blog post of about 150 words on why people should care about {t}.",
    "Write a limerick about {t}, then explain the joke in one sentence.",
    "Write the opening of a speech about {t} for a school graduation.",
    "Write a product description for a new app that helps people with {t}.",
    "Explain {t} as a university lecturer would, with one equation or number that matters.",
    "What role has {t} played in human culture or history? Give two examples.",
    "Discuss one ethical question that {t} raises, with arguments on both sides.",
    "Write a JavaScript function related to {t}, and explain how it works.",
    "Design a small SQL table for storing data about {t} and write a query that answers a useful question.",
]

PERSONAS = ["a pirate captain", "a medieval knight", "a friendly robot", "a famous detective", "a museum guide",
            "a space explorer", "a wise old teacher", "a sports commentator", "a chef", "a time traveller"]
NAMES = ["Anna", "Ben", "Chen", "Dara", "Emil", "Fatima", "Gus", "Hana", "Ivan", "Julia", "Kofi", "Lena"]
CITIES = ["Paris", "Lagos", "Toronto", "Osaka", "Lima", "Oslo", "Cairo", "Madrid", "Dublin", "Seoul"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

MATH_V2 = [
    "A coat costs {a}0 dollars and is on sale for {b}% off. What is the sale price? Show your steps.",
    "A garden is {a} m long and {b} m wide. What is its area, and how much fence goes around it?",
    "Solve for x: {b}x + {a} = {c}. Explain each step.",
    "A school has {c} students and {a} of them walk to school. What fraction and what percentage walk?",
    "{n1} reads {b} pages a day. How many days does a book of {a}0 pages take? Explain your reasoning.",
]

FOLLOW_UPS_V2 = ["Now rewrite your answer as a short poem.", "Put the main points in a table.",
                 "How would you change the answer for an audience of experts?",
                 "Now do the same for {u}.", "What is the weakest part of your answer, and how would you fix it?",
                 "Give your answer again in exactly three bullet points."]

FOLLOW_UPS_BY_VERSION = {1: FOLLOW_UPS, 2: FOLLOW_UPS_V2}


def _texts(version: int, rng: random.Random) -> list[str]:
    """The set's first turns, before shuffling (the random draws happen in a fixed order per version)."""
    if version == 1:
        texts = [tpl.format(t=t, u=rng.choice(TOPICS)) for t in TOPICS for tpl in TEMPLATES]
        return texts + [tpl.format(a=rng.randint(3, 99), b=rng.randint(2, 30)) for tpl in ARITHMETIC
                        for _ in range(40)]
    texts = [tpl.format(t=t, p=rng.choice(PERSONAS), n1=rng.choice(NAMES), n2=rng.choice(NAMES),
                        c=rng.choice(CITIES), d=rng.choice(DAYS), a=rng.randint(3, 60), b=rng.randint(2, 40))
             for t in TOPICS for tpl in TEMPLATES_V2]
    return texts + [tpl.format(a=rng.randint(3, 99), b=rng.randint(2, 40), c=rng.randint(100, 400),
                               n1=rng.choice(NAMES)) for tpl in MATH_V2 for _ in range(40)]


def topic_prompts(n: int, seed: int = 0, start: int = 0, follow_up_share: float = 0.25,
                  version: int = 1) -> list[dict]:
    """Conversations start..start+n-1 of the set for `seed` and `version`, each {"id", "messages": [{"role":
    "user", ...}]}: user turns only (the target answers them). Disjoint ranges give disjoint prompts (train vs
    held out); versions 1 and 2 share no prompt. Version 1 is fixed: its prompts and order never change."""
    if n < 1:
        raise ValueError(f"asked for {n} prompts; give at least 1")
    if version not in FOLLOW_UPS_BY_VERSION:
        raise ValueError(f"topic set version {version!r} does not exist; versions are "
                         f"{' and '.join(map(str, FOLLOW_UPS_BY_VERSION))}")
    rng = random.Random(seed)
    texts = _texts(version, rng)
    rng.shuffle(texts)
    if start + n > len(texts):
        raise ValueError(f"asked for prompts {start}..{start + n - 1}; this set has {len(texts)}")
    follow_ups = FOLLOW_UPS_BY_VERSION[version]
    prefix = "topic" if version == 1 else "topic-v2"
    out = []
    for i, text in enumerate(texts):
        follow = rng.choice(follow_ups) if rng.random() < follow_up_share else None  # drawn for every i: stable
        if follow and version == 2:
            follow = follow.format(u=rng.choice(TOPICS))
        if start <= i < start + n:
            turns = [text] + ([follow] if follow else [])
            out.append({"id": f"{prefix}-{seed}-{i}", "messages": [{"role": "user", "content": u} for u in turns]})
    return out
