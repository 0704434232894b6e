r"""ReTool reward: the last ``\boxed{…}`` answer against the label, compared numerically.

Example:
    >>> extract_boxed(r"so \boxed{\frac{1}{2}} hmm, no: \boxed{1{,}234}")
    '1{,}234'
    >>> answers_match("1{,}234", "1234.0")
    True
    >>> score(r"The answer is \boxed{7}.", "8", format_reward=0.1).reward
    0.1
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["Score", "answers_match", "extract_boxed", "normalize_answer", "parse_number", "score"]

_BOXED = re.compile(r"\\(?:boxed|fbox)")


def extract_boxed(text: str) -> str | None:
    r"""The content of the last complete ``\boxed{...}`` (or ``\fbox{...}``) in ``text``.

    Nested braces are handled; ``\boxed 42`` (no braces) gives ``"42"``. Returns
    None when there is no complete boxed answer.
    """
    for m in reversed(list(_BOXED.finditer(text))):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j].strip()
            continue  # unbalanced: try an earlier one
        if i < len(text) and text[i] == " ":
            word = re.match(r" +([^\s$]+)", text[i:])
            if word:
                return word.group(1).rstrip(".,;")
    return None


_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textrm|mbox)\s*\{([^{}]*)\}")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")
_SPACED_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?: \d{3})+(?:\.\d*)?")


def normalize_answer(ans: str) -> str:
    r"""Strips LaTeX and formatting noise: ``$``, ``\text{}``, ``\left``, spacing, units words."""
    s = ans.strip()
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\u2212", "-").replace("\\!", "").replace("\\,", "").replace("\\;", "")
    s = s.replace("{,}", ",").replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s).replace("\\%", "").replace("%", "")
    # \text{...}: keep it if it is the whole answer, drop it when it is a unit after a number.
    s = _TEXT.sub(
        lambda m: m.group(1) if _NUMBER.fullmatch(m.group(1).strip()) else f" {m.group(1)} ", s
    )
    s = _FRAC.sub(r"(\1)/(\2)", s)
    s = _FRAC_SHORT.sub(r"(\1)/(\2)", s)
    s = s.replace("\\ ", " ").strip().rstrip(".")
    s = re.sub(r"\s+", " ", s).strip()
    # "1234 bolts", "= 1234": keep the number when words are only around it.
    m = re.fullmatch(r"(?:[A-Za-z ]*=)?\s*([^A-Za-z]+?)\s*[A-Za-z ]*", s)
    if m and re.search(r"\d", m.group(1)):
        s = m.group(1).strip()
    return s


def parse_number(ans: str) -> Fraction | None:
    r"""The exact value of a numeric answer, or None.

    Handles thousands separators (``1,234``), decimals, exponents, signs, fractions
    (``3/4``, ``\frac{3}{4}``, ``-\frac34``) and surrounding parentheses.
    """
    s = normalize_answer(ans)
    if _SPACED_THOUSANDS.fullmatch(s):
        s = s.replace(" ", "")
    elif re.search(r"\d\s+\d", s):  # "1 2" is not a number
        return None
    s = s.replace(" ", "")
    sign = 1
    while s.startswith(("-", "+")) and len(s) > 1 and not s[1].isdigit() and s[1] != ".":
        sign, s = (-sign if s[0] == "-" else sign), s[1:]
    if "/" in s:
        num, _, den = s.partition("/")
        a, b = _atom(num), _atom(den)
        if a is None or b is None or b == 0:
            return None
        return sign * a / b
    value = _atom(s)
    return None if value is None else sign * value


def _atom(s: str) -> Fraction | None:
    while s.startswith("(") and s.endswith(")"):
        s = s[1:-1]
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    if not _NUMBER.fullmatch(s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(pred: str | None, label: str) -> bool:
    """Whether ``pred`` equals ``label``: as numbers when both are, else as normalized text."""
    if pred is None:
        return False
    a, b = parse_number(pred), parse_number(label)
    if a is not None and b is not None:
        if a == b:
            return True
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    if b is not None:  # a numeric label needs a numeric answer
        return False
    return _canon(pred) == _canon(label)


def _canon(s: str) -> str:
    return re.sub(r"[\s{}]", "", normalize_answer(s)).lower()


@dataclass(frozen=True)
class Score:
    """The reward of one final answer.

    Attributes:
        reward: 1 if correct, plus ``format_reward`` for any well-formed boxed answer.
        correct: The answer matches the label.
        has_answer: The text has a complete, non-empty ``\\boxed{}`` answer.
        pred: The extracted answer (None without one).
    """

    reward: float
    correct: bool
    has_answer: bool
    pred: str | None


def score(text: str, label: str, *, format_reward: float = 0.0) -> Score:
    r"""Scores a response: ``1.0`` if its last ``\boxed{}`` matches ``label``, else ``0.0``.

    Args:
        text: The model's final response.
        label: The ground-truth answer.
        format_reward: Added for a well-formed (non-empty) boxed answer, right or
            wrong; 0 (off) by default.
    """
    pred = extract_boxed(text)
    has_answer = bool(pred)
    correct = has_answer and answers_match(pred, label)
    reward = float(correct) + (format_reward if has_answer else 0.0)
    return Score(reward=reward, correct=correct, has_answer=has_answer, pred=pred)
