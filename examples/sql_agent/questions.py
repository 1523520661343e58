"""The SQL example's questions: ~200 questions over the three databases, each with its gold SQL, split into
``train.jsonl``, ``val.jsonl`` and ``test.jsonl`` beside this file by a fixed seed.

    python -m examples.sql_agent.questions     # rewrites the three files (the same bytes every time)

Each question comes from a template filled with values read from the database, so every gold query has an answer.
The templates go from what a 135M model can learn on a CPU (count a table, list a column, filter on one value) to
what it cannot yet (a join, a group); the reward gives partial credit on the way (``reward.py``). A task is
``{"task_id": "library-007", "db_id": "library", "question": "...", "gold_sql": "..."}``.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from pathlib import Path

from examples.sql_agent.databases import SCHEMAS, connect

HERE = Path(__file__).parent
SPLITS = {"train": 0.7, "val": 0.15, "test": 0.15}

TEMPLATES: dict[str, list[tuple[str, str, str | None]]] = {
    # (question, gold SQL, the query whose rows fill {0}, {1}, … ; None: asked once as it is)
    "library": [
        ("How many {0} are there?", "SELECT COUNT(*) FROM {0}", "VALUES ('authors'), ('books'), ('loans')"),
        ("List the names of all authors.", "SELECT name FROM authors", None),
        ("List the titles of all books.", "SELECT title FROM books", None),
        (
            "How many books are in the {0} genre?",
            "SELECT COUNT(*) FROM books WHERE genre = '{0}'",
            "SELECT DISTINCT genre FROM books",
        ),
        (
            "Which authors are from {0}?",
            "SELECT name FROM authors WHERE country = '{0}'",
            "SELECT DISTINCT country FROM authors",
        ),
        (
            "Which books were published after {0}?",
            "SELECT title FROM books WHERE year > {0}",
            "VALUES (1980), (1990), (2000), (2005), (2010), (2015)",
        ),
        (
            "How many authors were born before {0}?",
            "SELECT COUNT(*) FROM authors WHERE born < {0}",
            "VALUES (1930), (1940), (1950), (1960), (1970), (1980)",
        ),
        ("What is the title of the longest book?", "SELECT title FROM books ORDER BY pages DESC LIMIT 1", None),
        (
            "In which year was the book '{0}' published?",
            "SELECT year FROM books WHERE title = '{0}'",
            "SELECT title FROM books ORDER BY id LIMIT 20",
        ),
        (
            "Who wrote '{0}'?",
            "SELECT authors.name FROM authors JOIN books ON books.author_id = authors.id WHERE books.title = '{0}'",
            "SELECT title FROM books ORDER BY id DESC LIMIT 12",
        ),
        (
            "What are the titles of the books written by {0}?",
            "SELECT books.title FROM books JOIN authors ON books.author_id = authors.id WHERE authors.name = '{0}'",
            "SELECT name FROM authors WHERE id IN (SELECT author_id FROM books)",
        ),
        (
            "How many loans has {0} made?",
            "SELECT COUNT(*) FROM loans WHERE member = '{0}'",
            "SELECT DISTINCT member FROM loans",
        ),
        ("How many books are there in each genre?", "SELECT genre, COUNT(*) FROM books GROUP BY genre", None),
    ],
    "shop": [
        ("How many {0} are there?", "SELECT COUNT(*) FROM {0}", "VALUES ('customers'), ('products'), ('orders')"),
        ("List the names of all customers.", "SELECT name FROM customers", None),
        ("List the names of all products.", "SELECT name FROM products", None),
        (
            "Which customers live in {0}?",
            "SELECT name FROM customers WHERE city = '{0}'",
            "SELECT DISTINCT city FROM customers",
        ),
        (
            "How many customers live in {0}?",
            "SELECT COUNT(*) FROM customers WHERE city = '{0}'",
            "SELECT DISTINCT city FROM customers",
        ),
        (
            "Which products are in the {0} category?",
            "SELECT name FROM products WHERE category = '{0}'",
            "SELECT DISTINCT category FROM products",
        ),
        (
            "Which products cost more than {0}?",
            "SELECT name FROM products WHERE price > {0}",
            "VALUES (50), (100), (150), (200)",
        ),
        ("What is the price of the {0}?", "SELECT price FROM products WHERE name = '{0}'", "SELECT name FROM products"),
        ("What is the most expensive product?", "SELECT name FROM products ORDER BY price DESC LIMIT 1", None),
        (
            "How many orders has {0} placed?",
            "SELECT COUNT(*) FROM orders JOIN customers ON orders.customer_id = customers.id "
            "WHERE customers.name = '{0}'",
            "SELECT name FROM customers ORDER BY id LIMIT 20",
        ),
        (
            "What is the average price of the products in the {0} category?",
            "SELECT AVG(price) FROM products WHERE category = '{0}'",
            "SELECT DISTINCT category FROM products",
        ),
    ],
    "school": [
        (
            "How many {0} are there?",
            "SELECT COUNT(*) FROM {0}",
            "VALUES ('teachers'), ('students'), ('classes'), ('enrollments')",
        ),
        ("List the names of all teachers.", "SELECT name FROM teachers", None),
        ("List the names of all students.", "SELECT name FROM students", None),
        (
            "Which students are in grade {0}?",
            "SELECT name FROM students WHERE grade = {0}",
            "SELECT DISTINCT grade FROM students",
        ),
        (
            "How many students are in grade {0}?",
            "SELECT COUNT(*) FROM students WHERE grade = {0}",
            "SELECT DISTINCT grade FROM students",
        ),
        (
            "What grade is {0} in?",
            "SELECT grade FROM students WHERE name = '{0}'",
            "SELECT name FROM students ORDER BY id LIMIT 10",
        ),
        ("Who teaches {0}?", "SELECT name FROM teachers WHERE subject = '{0}'", "SELECT subject FROM teachers"),
        (
            "What subject does {0} teach?",
            "SELECT subject FROM teachers WHERE name = '{0}'",
            "SELECT name FROM teachers",
        ),
        ("In which room is class {0}?", "SELECT room FROM classes WHERE id = {0}", "SELECT id FROM classes"),
        ("What is the highest score?", "SELECT MAX(score) FROM enrollments", None),
        (
            "What is the average score in class {0}?",
            "SELECT AVG(score) FROM enrollments WHERE class_id = {0}",
            "SELECT DISTINCT class_id FROM enrollments",
        ),
        (
            "Which students scored above {0}?",
            "SELECT DISTINCT students.name FROM students JOIN enrollments ON students.id = enrollments.student_id "
            "WHERE enrollments.score > {0}",
            "VALUES (90), (95), (98)",
        ),
        (
            "How many classes does {0} teach?",
            "SELECT COUNT(*) FROM classes JOIN teachers ON classes.teacher_id = teachers.id "
            "WHERE teachers.name = '{0}'",
            "SELECT name FROM teachers",
        ),
    ],
}


def questions() -> Iterator[dict[str, str]]:
    """Every question of every database, in template order, with its gold SQL; the values are quoted for SQL
    the way the templates use them (no value holds a quote)."""
    for db_id, templates in TEMPLATES.items():
        with contextlib.closing(connect(db_id)) as db:
            number = 0
            for question, gold, values in templates:
                rows = db.execute(values).fetchall() if values else [()]
                for row in rows:
                    number += 1
                    yield {
                        "task_id": f"{db_id}-{number:03d}",
                        "db_id": db_id,
                        "question": question.format(*row),
                        "gold_sql": gold.format(*row),
                    }


def split(seed: int = 0) -> dict[str, list[dict[str, str]]]:
    """The questions shuffled by ``seed`` and cut into :data:`SPLITS`."""
    everything = list(questions())
    random.Random(seed).shuffle(everything)
    cuts = [round(len(everything) * share) for share in SPLITS.values()]
    train, val = cuts[0], cuts[0] + cuts[1]
    return {"train": everything[:train], "val": everything[train:val], "test": everything[val:]}


def main() -> None:
    for name, tasks in split().items():
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
        print(f"{name}.jsonl: {len(tasks)} questions")


assert set(TEMPLATES) == set(SCHEMAS)
if __name__ == "__main__":
    main()
