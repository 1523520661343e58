"""The calculator example's tasks: ~200 arithmetic word problems whose numbers (three and four digits) make mental
arithmetic fail, so the answer comes from the calculator, built from a fixed seed.

    python -m examples.calc_agent.problems     # rewrites train/val/test.jsonl beside this file (the same bytes)

Each problem is one operation on two numbers (an addition, a subtraction, a multiplication or an exact
division), worded by one of a few templates per operation. A task is
``{"task_id": "p-017", "question": "...", "answer": 7433}``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
SEED = 0
COUNT = 204
SPLITS = {"train": 0.7, "val": 0.15, "test": 0.15}

TEMPLATES: dict[str, list[str]] = {
    "+": [
        "A warehouse holds {a} boxes and receives {b} more. How many boxes does it hold now?",
        "A library has {a} books and buys {b} new ones. How many books does it have?",
        "On Monday {a} people visited the museum and on Tuesday {b}. How many visited on both days together?",
    ],
    "-": [
        "A farmer had {a} eggs and sold {b} of them. How many eggs are left?",
        "A tank held {a} litres of water and {b} litres leaked out. How many litres remain?",
        "A town had {a} trees and {b} were cut down. How many trees are still standing?",
    ],
    "*": [
        "Each of {a} crates holds {b} apples. How many apples are there in all?",
        "A printer prints {b} pages a day for {a} days. How many pages does it print?",
        "A hall has {a} rows of {b} seats. How many seats are there?",
    ],
    "/": [
        "{a} marbles are shared equally among {b} children. How many marbles does each child get?",
        "A rope {a} centimetres long is cut into {b} equal pieces. How long is each piece in centimetres?",
        "{a} litres of juice fill {b} equal barrels. How many litres are in each barrel?",
    ],
}


def numbers(operation: str, rng: random.Random) -> tuple[int, int, int]:
    """The two numbers of a problem and its answer: sums and differences of four-digit numbers, products of a
    two-digit and a three-digit number, and divisions that come out exact."""
    if operation == "+":
        a, b = rng.randrange(1000, 9999), rng.randrange(1000, 9999)
        return a, b, a + b
    if operation == "-":
        a = rng.randrange(5000, 9999)
        b = rng.randrange(1000, a - 100)
        return a, b, a - b
    if operation == "*":
        a, b = rng.randrange(12, 99), rng.randrange(101, 999)
        return a, b, a * b
    quotient, b = rng.randrange(101, 999), rng.randrange(12, 99)
    return quotient * b, b, quotient


def problems(seed: int = SEED) -> list[dict[str, object]]:
    rng = random.Random(seed)
    tasks: list[dict[str, object]] = []
    for number in range(COUNT):
        operation = "+-*/"[number % 4]
        a, b, answer = numbers(operation, rng)
        question = rng.choice(TEMPLATES[operation]).format(a=a, b=b)
        tasks.append({"question": question, "answer": answer})
    rng.shuffle(tasks)
    return [{"task_id": f"p-{i:03d}", **task} for i, task in enumerate(tasks)]


def main() -> None:
    tasks = problems()
    train, val = round(len(tasks) * SPLITS["train"]), round(len(tasks) * (SPLITS["train"] + SPLITS["val"]))
    for name, part in (("train", tasks[:train]), ("val", tasks[train:val]), ("test", tasks[val:])):
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in part))
        print(f"{name}.jsonl: {len(part)} problems")


if __name__ == "__main__":
    main()
