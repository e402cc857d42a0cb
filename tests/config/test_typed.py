"""`rlhfless.typed`: a nested dict as typed dataclasses, refused by dotted key; and back as YAML."""

from dataclasses import dataclass, field
from typing import Literal

import pytest
import yaml

from rlhfless.typed import render, typed


@dataclass
class Inner:
    """The inner section."""

    rate: float = field(default=float("inf"), metadata={"help": "a limit; .inf for none"})
    names: list[str] = field(default_factory=lambda: ['a "quoted" name', "é\nnext line"])


@dataclass
class Outer:
    count: int = field(default=3, metadata={"help": "how many"})
    label: str | None = field(default=None, metadata={"help": "an optional label"})
    inner: Inner = field(default_factory=Inner)


def test_render_reads_back_to_the_same_values_with_each_key_under_its_help():
    for value in (Outer(), Outer(7, "x", Inner(-float("inf"), [])), Outer(inner=Inner(2.5))):
        text = render(value)
        assert typed(Outer, yaml.safe_load(text)) == value
        assert "# how many\ncount:" in text and "# The inner section.\ninner:" in text


def test_a_value_of_the_wrong_type_names_its_dotted_key():
    with pytest.raises(ValueError, match=r"^inner.rate: got 'fast', expected a valid number"):
        typed(Outer, {"inner": {"rate": "fast"}})
    with pytest.raises(ValueError, match=r"^count: got 2.5, expected a valid integer"):
        typed(Outer, {"count": 2.5})


@dataclass
class Unions:
    interval: int = 1  # a key whose name begins as a union tag does ("int")
    resume: bool | Literal["auto"] = False
    path: str | list[str] | None = None  # a file or a list of them (data.path)


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"resume": "maybe"}, "resume: got 'maybe', expected a valid boolean or 'auto'"),
        ({"interval": "abc"}, "interval: got 'abc', expected a valid integer"),
        ({"path": 3}, "path: got 3, expected a valid string or a valid list"),
        (
            {"path": ["a.jsonl", 3]},
            r"path: got \['a.jsonl', 3\], expected a valid string or a list whose item 1 is a valid string",
        ),
    ],
)
def test_a_value_fitting_no_member_of_a_union_names_its_key_and_every_member(tree, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        typed(Unions, tree)
