"""Finding the final answer in a response and comparing it with a reference answer.

Answer formats (`reward.answer_format`):
- "answer_tag": the final answer between `<answer>` and `</answer>`; the last closed pair wins.
  A final `<answer>` left unclosed (the model stopped or hit the token cap) yields the rest of
  its line, so correctness still counts; the format score marks the difference.
- "boxed": the final answer inside the last `\\boxed{...}` (braces may nest).

With no answer in the format, `last_number` is the fallback (VERL's gsm8k "flexible" extraction).
"""

from __future__ import annotations

import re
from fractions import Fraction

ANSWER_FORMATS = ("answer_tag", "boxed")

_CLOSED_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OPEN_TAG = "<answer>"
_BOXED = "\\boxed{"
_NUMBER = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?$")
_NUMBERS = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _boxed_contents(text: str) -> list[tuple[str, bool]]:
    """(content, closed) for every \\boxed{...} in order, matching nested braces."""
    found = []
    start = text.find(_BOXED)
    while start != -1:
        depth, i = 1, start + len(_BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        closed = depth == 0
        found.append((text[start + len(_BOXED) : i - 1 if closed else i], closed))
        start = text.find(_BOXED, i)
    return found


def extract_answer(response: str, answer_format: str = "answer_tag") -> str | None:
    """The final answer per the format's rules above, stripped; None when there is none."""
    if answer_format == "boxed":
        boxed = _boxed_contents(response)
        return boxed[-1][0].strip() if boxed else None
    closed = _CLOSED_TAG.findall(response)
    tail = response.rsplit(_OPEN_TAG, 1)
    if len(tail) == 2 and "</answer>" not in tail[1]:
        line = tail[1].strip().split("\n", 1)[0].strip()
        return line or (closed[-1].strip() if closed else None)
    return closed[-1].strip() if closed else None


def last_number(response: str) -> str | None:
    """The last number written in the response (commas and a trailing period dropped), or None."""
    found = _NUMBERS.findall(response)
    return found[-1].rstrip(",").rstrip(".") if found else None


def format_score(response: str, answer_format: str = "answer_tag") -> float:
    """1 for a complete non-empty answer in the format, 0.5 for an opened but unfinished or empty one, else 0.

    The half credit gives a small model a gradient towards the format before it ever completes it.
    """
    if answer_format == "boxed":
        boxed = _boxed_contents(response)
        if not boxed:
            return 0.0
        content, closed = boxed[-1]
        return 1.0 if closed and content.strip() else 0.5
    if _OPEN_TAG not in response:
        return 0.0
    last = response.rsplit(_OPEN_TAG, 1)[1]
    if "</answer>" in last and last.split("</answer>", 1)[0].strip():
        return 1.0
    return 0.5


def normalize(text: str) -> str:
    """Canonical text for comparison: no \\boxed{}, $ or trailing period, single spaces, lower case."""
    boxed = _boxed_contents(text)
    if boxed and boxed[-1][1]:
        text = boxed[-1][0]
    text = text.replace("$", "").strip().rstrip(".").strip()
    return " ".join(text.split()).lower()


def parse_number(text: str) -> Fraction | None:
    """A number written as 1000, 1,000, 1000.0, -3.5 or 3/4; None when the text is not one."""
    text = text.replace(" ", "")
    if "/" in text:
        num, _, den = text.partition("/")
        a, b = parse_number(num), parse_number(den)
        return a / b if a is not None and b else None
    if not text or not _NUMBER.match(text) or not any(c.isdigit() for c in text):
        return None
    return Fraction(text.replace(",", ""))


def answers_match(answer: str | None, ground_truth: str) -> bool:
    """Exact match after normalising, or equal numbers (exact rational comparison)."""
    if answer is None:
        return False
    a, b = normalize(answer), normalize(ground_truth)
    if a == b:
        return True
    x, y = parse_number(a), parse_number(b)
    return x is not None and y is not None and x == y
