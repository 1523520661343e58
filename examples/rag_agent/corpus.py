"""The RAG example's knowledge: a corpus of invented facts (people, companies, cities and countries whose names no
model has seen, so the answers must be retrieved) and ~200 one- and two-hop questions about it, built from a fixed
seed.

    python -m examples.rag_agent.corpus     # rewrites corpus.jsonl and train/val/test.jsonl (the same bytes)

A document is one entity's facts, e.g. ``Velmora Quist was born in Ostrel. Velmora Quist works for Drannic
Works.``; a one-hop question needs one of them (``Where was Velmora Quist born?``), a two-hop question two
(``In which country was Velmora Quist born?``: her birthplace's document names its country). A task is
``{"task_id": "q-017", "question": "...", "answer": "...", "hops": 2}``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
SEED = 0
SPLITS = {"train": 0.7, "val": 0.15, "test": 0.15}
SYLLABLES = ["vel", "mor", "qu", "ist", "dra", "nic", "os", "trel", "bal", "zen", "kor", "ith", "lum", "ar", "pex"]


def invented(rng: random.Random, taken: set[str], parts: int = 2) -> str:
    """A capitalised word of ``parts`` syllables, not in ``taken`` (which it joins)."""
    while (word := "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()) in taken:
        pass
    taken.add(word)
    return word


def build(seed: int = SEED) -> tuple[list[dict[str, str]], list[dict[str, object]]]:
    """The documents (``{"id", "title", "text"}``) and the questions (without ids), from ``seed``."""
    rng = random.Random(seed)
    taken: set[str] = set()
    countries = {invented(rng, taken, 3): invented(rng, taken) for _ in range(6)}  # country -> currency
    cities = {invented(rng, taken): rng.choice(sorted(countries)) for _ in range(15)}  # city -> country
    companies = {
        f"{invented(rng, taken)} Works": (rng.choice(sorted(cities)), rng.randrange(1850, 2010)) for _ in range(15)
    }  # company -> (headquarters, founded)
    people = {
        f"{invented(rng, taken)} {invented(rng, taken)}": (rng.choice(sorted(cities)), rng.choice(sorted(companies)))
        for _ in range(40)
    }  # person -> (birthplace, employer)
    documents = [
        *({"title": c, "text": f"{c} is a country. The currency of {c} is the {m}."} for c, m in countries.items()),
        *({"title": c, "text": f"{c} is a city in {k}."} for c, k in cities.items()),
        *(
            {"title": c, "text": f"{c} is a company founded in {y}. {c} has its headquarters in {h}."}
            for c, (h, y) in companies.items()
        ),
        *({"title": p, "text": f"{p} was born in {b}. {p} works for {e}."} for p, (b, e) in people.items()),
    ]
    questions: list[dict[str, object]] = []
    for person, (born, employer) in people.items():
        questions += [
            {"question": f"Where was {person} born?", "answer": born, "hops": 1},
            {"question": f"Which company does {person} work for?", "answer": employer, "hops": 1},
            {"question": f"In which country was {person} born?", "answer": cities[born], "hops": 2},
            {
                "question": f"In which year was the company {person} works for founded?",
                "answer": str(companies[employer][1]),
                "hops": 2,
            },
            {
                "question": f"In which city does the company {person} works for have its headquarters?",
                "answer": companies[employer][0],
                "hops": 2,
            },
        ]
    for company, (city, year) in companies.items():
        questions += [
            {"question": f"In which year was {company} founded?", "answer": str(year), "hops": 1},
            {"question": f"Where does {company} have its headquarters?", "answer": city, "hops": 1},
        ]
    questions += [{"question": f"In which country is {c}?", "answer": k, "hops": 1} for c, k in cities.items()]
    questions += [{"question": f"What is the currency of {c}?", "answer": m, "hops": 1} for c, m in countries.items()]
    rng.shuffle(questions)
    return [{"id": f"d-{i:03d}", **d} for i, d in enumerate(documents)], questions[:204]


def main() -> None:
    documents, questions = build()
    (HERE / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in documents))
    tasks = [{"task_id": f"q-{i:03d}", **q} for i, q in enumerate(questions)]
    train, val = round(len(tasks) * SPLITS["train"]), round(len(tasks) * (SPLITS["train"] + SPLITS["val"]))
    for name, part in (("train", tasks[:train]), ("val", tasks[train:val]), ("test", tasks[val:])):
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in part))
        print(f"{name}.jsonl: {len(part)} questions")
    print(f"corpus.jsonl: {len(documents)} documents")


if __name__ == "__main__":
    main()
