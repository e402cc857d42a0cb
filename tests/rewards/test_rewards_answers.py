"""Answer extraction, format credit and answer matching."""

import pytest

from rlhfless.rewards.answers import answers_match, extract_answer, format_score, last_number


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("so 12. <answer>12</answer>", "12"),
        ("<answer> first </answer> then <answer>second</answer>", "second"),
        ("<answer>\n  multi\nline \n</answer>", "multi\nline"),
        ("The answer is <answer>42", "42"),
        ("<answer>7</answer> and then <answer>", "7"),
        ("<answer>3\nmore text", "3"),
        ("no tags, 12", None),
        ("<answer></answer>", ""),
    ],
)
def test_extract_answer_tag(response, expected):
    assert extract_answer(response, "answer_tag") == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (r"thus \boxed{5}", "5"),
        (r"\boxed{1} or \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{unclosed", "unclosed"),
        ("<answer>5</answer>", None),
    ],
)
def test_extract_boxed(response, expected):
    assert extract_answer(response, "boxed") == expected


@pytest.mark.parametrize(
    ("response", "fmt", "score"),
    [
        ("x <answer>5</answer>", "answer_tag", 1.0),
        ("x <answer>5", "answer_tag", 0.5),
        ("x <answer> </answer>", "answer_tag", 0.5),
        ("x 5", "answer_tag", 0.0),
        (r"\boxed{5}", "boxed", 1.0),
        (r"\boxed{5", "boxed", 0.5),
        ("5", "boxed", 0.0),
    ],
)
def test_format_score_gives_partial_credit(response, fmt, score):
    assert format_score(response, fmt) == score


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("1,000", "1000"),
        ("1000.0", "1000"),
        ("  Paris. ", "paris"),
        (r"\boxed{72}", "72"),
        ("$5$", "5"),
        ("0.5", "1/2"),
        ("-3", "-3.00"),
        ("a  b\nc", "a b c"),
    ],
)
def test_equivalent_answers_match(answer, truth):
    assert answers_match(answer, truth)


@pytest.mark.parametrize(
    ("answer", "truth"),
    [("1001", "1000"), ("10,00", "1000"), ("1/0", "0"), (None, "1"), ("", "0"), ("London", "Paris")],
)
def test_different_answers_do_not_match(answer, truth):
    assert not answers_match(answer, truth)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("So the total is 6 legs.", "6"),
        ("from 3 to -4", "-4"),
        ("about 1,000.", "1,000"),
        ("pi is 3.14, roughly", "3.14"),
        ("no digits here", None),
    ],
)
def test_last_number_is_the_flexible_fallback(response, expected):
    assert last_number(response) == expected
