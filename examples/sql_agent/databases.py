"""The SQL example's three SQLite databases, built from a fixed seed: ``library``, ``shop`` and ``school``, each a
few tables tied by foreign keys and a few dozen rows of invented data.

    python -m examples.sql_agent.databases     # prints where they are (built on first use)

They are not kept in the repository: :func:`database` builds one the first time it is asked for, into
``~/.cache/lightning-store/sql_agent/`` (``$XDG_CACHE_HOME`` is honoured), the same bytes on every machine for a
given :data:`VERSION`. Concurrent workers may race to build the same file; each writes its own temporary file and
renames it into place, so a reader never sees half a database.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path

VERSION = 1
"""Bump when the schemas or the data change: the cached files are named after it, and the questions' gold
answers are computed against them."""
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lightning-store" / "sql_agent"

SCHEMAS = {
    "library": """
CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL, born INTEGER NOT NULL);
CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL, author_id INTEGER NOT NULL REFERENCES authors(id),
  year INTEGER NOT NULL, genre TEXT NOT NULL, pages INTEGER NOT NULL);
CREATE TABLE loans (id INTEGER PRIMARY KEY, book_id INTEGER NOT NULL REFERENCES books(id), member TEXT NOT NULL,
  returned INTEGER NOT NULL);
""",
    "shop": """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price INTEGER NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
  product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL);
""",
    "school": """
CREATE TABLE teachers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, subject TEXT NOT NULL);
CREATE TABLE students (id INTEGER PRIMARY KEY, name TEXT NOT NULL, grade INTEGER NOT NULL);
CREATE TABLE classes (id INTEGER PRIMARY KEY, teacher_id INTEGER NOT NULL REFERENCES teachers(id), room TEXT NOT NULL);
CREATE TABLE enrollments (student_id INTEGER NOT NULL REFERENCES students(id),
  class_id INTEGER NOT NULL REFERENCES classes(id), score INTEGER NOT NULL, PRIMARY KEY (student_id, class_id));
""",
}

FIRST = ["Ada", "Bruno", "Chiara", "Dmitri", "Elif", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kaia", "Lior"]
LAST = ["Okafor", "Lindqvist", "Moreau", "Tanaka", "Vasquez", "Novak", "Haddad", "Brennan", "Sato", "Weiss"]
COUNTRIES = ["Norway", "Chile", "Japan", "Kenya", "Italy", "Canada"]
GENRES = ["mystery", "poetry", "history", "science", "fantasy"]
WORDS = ["River", "Glass", "Winter", "Lantern", "Orchard", "Harbor", "Silent", "Copper", "Garden", "Falcon"]
CITIES = ["Lyon", "Porto", "Ghent", "Tartu", "Bergen", "Split"]
CATEGORIES = {
    "tools": ["hammer", "wrench", "saw", "drill"],
    "kitchen": ["kettle", "pan", "whisk", "ladle"],
    "garden": ["rake", "hose", "shovel", "trowel"],
    "office": ["stapler", "lamp", "binder", "chair"],
}
SUBJECTS = ["math", "biology", "music", "history", "chemistry"]


def person(rng: random.Random, taken: set[str]) -> str:
    """A full name not in ``taken`` (which it joins)."""
    while (name := f"{rng.choice(FIRST)} {rng.choice(LAST)}") in taken:
        pass
    taken.add(name)
    return name


def fill_library(db: sqlite3.Connection, rng: random.Random) -> None:
    names: set[str] = set()
    authors = [(i, person(rng, names), rng.choice(COUNTRIES), rng.randrange(1920, 1995)) for i in range(1, 13)]
    db.executemany("INSERT INTO authors VALUES (?, ?, ?, ?)", authors)
    titles: set[str] = set()
    books = []
    for i in range(1, 41):
        while (title := "The {} {}".format(*rng.sample(WORDS, 2))) in titles:
            pass
        titles.add(title)
        books.append(
            (i, title, rng.randrange(1, 13), rng.randrange(1950, 2024), rng.choice(GENRES), rng.randrange(90, 700))
        )
    db.executemany("INSERT INTO books VALUES (?, ?, ?, ?, ?, ?)", books)
    members = [f"{rng.choice(FIRST)}" for _ in range(6)]
    loans = [(i, rng.randrange(1, 41), rng.choice(members), rng.randrange(2)) for i in range(1, 61)]
    db.executemany("INSERT INTO loans VALUES (?, ?, ?, ?)", loans)


def fill_shop(db: sqlite3.Connection, rng: random.Random) -> None:
    names: set[str] = set()
    db.executemany(
        "INSERT INTO customers VALUES (?, ?, ?)", [(i, person(rng, names), rng.choice(CITIES)) for i in range(1, 21)]
    )
    products = [(category, name) for category, items in CATEGORIES.items() for name in items]
    db.executemany(
        "INSERT INTO products VALUES (?, ?, ?, ?)",
        [(i, name, category, rng.randrange(3, 250)) for i, (category, name) in enumerate(products, 1)],
    )
    orders = [(i, rng.randrange(1, 21), rng.randrange(1, len(products) + 1), rng.randrange(1, 6)) for i in range(1, 81)]
    db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", orders)


def fill_school(db: sqlite3.Connection, rng: random.Random) -> None:
    names: set[str] = set()
    db.executemany(
        "INSERT INTO teachers VALUES (?, ?, ?)",
        [(i, person(rng, names), subject) for i, subject in enumerate(SUBJECTS, 1)],
    )
    db.executemany(
        "INSERT INTO students VALUES (?, ?, ?)", [(i, person(rng, names), rng.randrange(9, 13)) for i in range(1, 31)]
    )
    db.executemany(
        "INSERT INTO classes VALUES (?, ?, ?)",
        [(i, rng.randrange(1, len(SUBJECTS) + 1), f"R{100 + i}") for i in range(1, 9)],
    )
    pairs = sorted(rng.sample([(s, c) for s in range(1, 31) for c in range(1, 9)], 70))
    db.executemany("INSERT INTO enrollments VALUES (?, ?, ?)", [(s, c, rng.randrange(40, 101)) for s, c in pairs])


FILLERS: dict[str, Callable[[sqlite3.Connection, random.Random], None]] = {
    "library": fill_library,
    "shop": fill_shop,
    "school": fill_school,
}


def build(db_id: str, path: Path) -> None:
    """Write database ``db_id`` to ``path`` (which must not exist), from seed ``db_id`` + :data:`VERSION`."""
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMAS[db_id])
        FILLERS[db_id](db, random.Random(f"{db_id}-{VERSION}"))
    db.close()


def database(db_id: str) -> Path:
    """The path of database ``db_id``, built on first use (see the module's docstring)."""
    if db_id not in SCHEMAS:
        raise KeyError(f"unknown database {db_id!r}: the example has {', '.join(SCHEMAS)}")
    path = CACHE / f"{db_id}-v{VERSION}.sqlite"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
            built = Path(scratch) / path.name
            build(db_id, built)
            os.replace(built, path)
    return path


def schema(db_id: str) -> str:
    """The ``CREATE TABLE`` statements of ``db_id``, as the agent shows them to the model."""
    return SCHEMAS[db_id].strip()


def connect(db_id: str) -> sqlite3.Connection:
    """A read-only connection to ``db_id``: what the agent's query tool runs on (a query cannot change the data)."""
    return sqlite3.connect(f"file:{database(db_id)}?mode=ro", uri=True)


MAX_ROWS = 100
MAX_STEPS = 2_000_000
"""A query's budget: SQLite virtual-machine steps (a cross join of every table is stopped in well under a second)."""


def run_query(db_id: str, query: str) -> list[tuple[object, ...]]:
    """The first :data:`MAX_ROWS` rows of ``query`` on ``db_id``, read-only; ``sqlite3.Error`` when it does not
    run (a syntax error, a write, a query past :data:`MAX_STEPS`)."""
    steps = 0

    def over_budget() -> int:
        nonlocal steps
        steps += 1000
        return int(steps > MAX_STEPS)

    with contextlib.closing(connect(db_id)) as db:
        db.set_progress_handler(over_budget, 1000)
        return db.execute(query).fetchmany(MAX_ROWS)


if __name__ == "__main__":
    for name in SCHEMAS:
        print(database(name))
