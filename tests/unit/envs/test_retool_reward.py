r"""ReTool reward: \boxed{} extraction, numeric-aware matching, the format component."""

from __future__ import annotations

import pytest

from agentrl.envs.retool.reward import answers_match, extract_boxed, parse_number, score


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"The answer is \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces
        (r"first \boxed{1} then \boxed{2}", "2"),  # the last one wins
        (r"\boxed{7} and a broken \boxed{8", "7"),  # an unclosed last one is skipped
        (r"so \boxed 5.", "5"),
        (r"\fbox{x{y}}", "x{y}"),
        (r"\boxed{ 12 }", "12"),
        ("no answer here", None),
        (r"\boxed{}", ""),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("pred", "label"),
    [
        ("1,234", "1234"),
        ("1234.0", "1234"),
        ("1 234", "1234"),
        ("$1{,}234$", "1234"),
        (" 42 ", "42"),
        (r"\frac{1}{2}", "0.5"),
        (r"\dfrac{10}{4}", "5/2"),
        (r"-\frac{3}{4}", "-0.75"),
        (r"-\frac34", "-3/4"),
        ("3/4", "0.75"),
        ("\u22127", "-7"),
        (r"\text{1234}", "1234"),
        (r"1234 \text{ bolts}", "1234"),
        ("1234 bolts", "1234"),
        ("x = 12", "12"),
        ("(2)", "2"),
        ("1e3", "1000"),
        ("7.", "7"),
        ("12%", "12"),
        (r"90^\circ", "90"),
        ("A", "a"),
        ("x + 1", "x+1"),
    ],
)
def test_answers_match(pred: str, label: str) -> None:
    assert answers_match(pred, label)


@pytest.mark.parametrize(
    ("pred", "label"),
    [
        ("-5", "5"),
        ("1235", "1234"),
        ("0.3333", "1/3"),
        ("1 2", "12"),
        ("12 and 13", "12"),
        ("1/0", "1"),
        ("", "0"),
        (None, "1"),
    ],
)
def test_answers_do_not_match(pred: str | None, label: str) -> None:
    assert not answers_match(pred, label)


def test_parse_number_is_exact() -> None:
    assert parse_number("1,234,567.5") == pytest.approx(1234567.5)
    assert str(parse_number(r"-\frac{6}{4}")) == "-3/2"
    assert parse_number("abc") is None


def test_score_correct_wrong_missing() -> None:
    assert score(r"It is \boxed{53453808}.", "53453808").reward == 1.0
    wrong = score(r"It is \boxed{53453807}.", "53453808")
    assert (wrong.reward, wrong.correct, wrong.has_answer, wrong.pred) == (
        0.0,
        False,
        True,
        "53453807",
    )
    missing = score("It is 53453808.", "53453808")
    assert (missing.reward, missing.has_answer, missing.pred) == (0.0, False, None)


def test_format_component_is_off_by_default_and_additive() -> None:
    assert score(r"\boxed{1}", "2").reward == 0.0
    assert score(r"\boxed{1}", "2", format_reward=0.1).reward == pytest.approx(0.1)
    assert score(r"\boxed{2}", "2", format_reward=0.1).reward == pytest.approx(1.1)
    assert score("2", "2", format_reward=0.1).reward == 0.0
    assert score(r"\boxed{}", "2", format_reward=0.1).reward == 0.0  # empty is not well-formed
