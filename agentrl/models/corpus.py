"""A small synthetic text corpus for training the tiny model's tokenizer.

English prose, Python code, arithmetic and rendered chat/tool conversations, made
from word lists and templates with a seeded RNG, so the same seed always yields the
same corpus (and so the same tokenizer).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

__all__ = ["synthetic_corpus"]


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_NOUNS = _words(
    "answer number result value list table file function model agent tool code question "
    "problem step time day year city river house book letter word line program output input "
    "error test sum product difference square root price apple orange train car ship garden "
    "teacher student friend doctor market window door cat dog bird tree water light sound "
    "picture game story idea"
)
_VERBS = _words(
    "is was has had makes made takes took gives gave finds found computes returns prints "
    "reads writes calls checks counts adds multiplies divides subtracts sees saw knows knew "
    "wants needs uses used builds opens closes runs walks"
)
_ADJS = _words(
    "small large big little new old good bad first last final correct wrong simple hard easy "
    "quick slow bright dark red blue green happy short long"
)
_WORDS = _words(
    "about above across act action add after again against age ago agree air all allow almost "
    "alone along already also always among amount and animal another any appear area arm "
    "around arrive art ask away baby back ball bank base be bear beat beauty bed begin behind "
    "believe bell best better between bit black block blood board boat body bone born both "
    "bottom box boy branch bread break bring brother brown build burn busy but buy call camp "
    "can capital captain care carry case catch cause cell cent center century certain chair "
    "chance change character charge chart check chief child choose church circle class clean "
    "clear climb clock cloud coast cold collect colony color column come common company "
    "compare complete condition connect consider contain continue control cook cool copy "
    "corner cost cotton could country course cover cow create crop cross crowd cry current "
    "cut dance danger data dead deal dear decide deep degree depend describe desert design "
    "detail develop dictionary differ direct discuss distant divide does done double down "
    "draw dream dress drink drive drop dry during each early earth east eat edge effect egg "
    "eight either electric element else end enemy energy engine enough enter equal equate "
    "even evening event ever every exact example except excite exercise expect experience "
    "experiment eye face fact fair fall family famous far farm fast father favor fear feed "
    "feel few field fig fight figure fill find fine finger finish fire fish fit five flat "
    "floor flow flower fly follow food foot force forest form forward four free fresh fruit "
    "full fun gas gather general gentle get girl glad glass go gold gone govern grand grass "
    "gray great ground group grow guess guide gun hair half hand happen hat head hear heart "
    "heat heavy help here high hill history hold hole home hope horse hot hour huge human "
    "hundred hunt hurry ice if imagine inch include indicate industry insect instant "
    "instrument interest invent iron island join joy jump keep kept key kill kind king knew "
    "lady lake land language large laugh law lay lead learn least leave left leg length less "
    "let level lie life lift like line liquid listen live locate log lone look lost lot loud "
    "love low machine main major make man many map mark mass master match material matter may "
    "mean measure meat meet melody member memory method middle might mile milk million mind "
    "mine minute miss modern moment money month moon more morning most mother motion mount "
    "mountain mouth move much music must name nation natural nature near necessary neck need "
    "neighbor never night nine noise none noon north nose note nothing notice noun now object "
    "observe ocean offer office often oil once one only open operate opposite order organ "
    "original other our out own oxygen page paint pair paper paragraph parent part particular "
    "party pass past path pattern pay people perhaps period person phrase pick piece place "
    "plain plan plane planet plant play please plural poem point poor populate port pose "
    "position possible post pound power practice prepare present press pretty print probable "
    "process produce proper property protect prove provide pull push put quart quiet quite "
    "race radio rain raise range rather reach ready real reason receive record region "
    "remember repeat reply represent require rest rich ride right ring rise road rock roll "
    "room rope rose round row rule safe sail salt same sand save say scale school science "
    "score sea search season seat second section seed seem segment select self sell send "
    "sense sentence separate serve set settle seven several shape share sharp sheet shell "
    "shine shoe shop shore should shoulder shout show side sight sign silent silver similar "
    "since sing single sister sit six size skill skin sky sleep slip smell smile snow soft "
    "soil soldier solution some son song soon sort soul south space speak special speech "
    "speed spell spend spoke spot spread spring stand star start state station stay steam "
    "steel stick still stone stood stop store straight strange stream street stretch string "
    "strong study subject success such sudden suffix sugar suggest suit summer sun supply "
    "support sure surface surprise swim syllable symbol system teach team tell temperature "
    "ten term thank then there these thick thin thing think third this those though thought "
    "thousand three through throw thus tie tiny tire together tone top total touch toward "
    "town track trade travel trip trouble truck true try tube turn twenty two type under unit "
    "until upon usual valley vary verb very view village visit voice vowel wait walk wall war "
    "warm wash watch wave way wear weather week weight well west what wheel when where which "
    "while white whole whose why wide wife wild will win wind wing winter wire wish woman "
    "wonder wood work world would write yard yellow yes yet you young your zero"
)
_PREPS = _words("in on at with from to into over under after before for about")
_NAMES = _words("Alice Bob Carol Dave Emma Frank Grace Henry Ivy Jack Kate Liam Mia Noah")
_FUNCS = _words("compute solve helper total average parse check count merge build")
_VARS = _words("x y z n i j k total result value count items data acc a b")
_OPS = ("+", "-", "*", "//", "%")


def _sentence(rng: random.Random) -> str:
    subj = rng.choice([f"the {rng.choice(_ADJS)} {rng.choice(_NOUNS)}", rng.choice(_NAMES)])
    if rng.random() < 0.5:
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        subj = f"{subj} and the {words}"
    obj = f"a {rng.choice(_ADJS)} {rng.choice(_NOUNS)}"
    tail = f" {rng.choice(_PREPS)} the {rng.choice(_NOUNS)}" if rng.random() < 0.6 else ""
    num = f" {rng.randint(0, 9999)} times" if rng.random() < 0.2 else ""
    s = f"{subj} {rng.choice(_VERBS)} {obj}{tail}{num}"
    return s[0].upper() + s[1:] + rng.choice([".", ".", ".", "?", "!"])


def _prose(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(1, 5)))


def _expr(rng: random.Random) -> str:
    a, b = rng.randint(0, 99999), rng.randint(1, 9999)
    return f"{a} {rng.choice(_OPS)} {b}"


def _code(rng: random.Random) -> str:
    f, v, w = rng.choice(_FUNCS), rng.choice(_VARS), rng.choice(_VARS)
    if rng.random() < 0.5:
        f, v = f"{f}_{rng.choice(_WORDS)}", rng.choice(_WORDS + _NOUNS)
    choices = [
        f"print({_expr(rng)})",
        f"{v} = {_expr(rng)}\nprint({v})",
        f"def {f}({v}, {w}):\n    return {v} {rng.choice(_OPS)} {w}\n\n"
        f"print({f}({rng.randint(0, 999)}, {rng.randint(1, 99)}))",
        f"{v} = 0\nfor i in range({rng.randint(2, 100)}):\n"
        f"    {v} += i * {rng.randint(1, 9)}\nprint({v})",
        f"import math\nprint(math.sqrt({rng.randint(1, 99999)}))",
        f"{v} = [{', '.join(str(rng.randint(0, 99)) for _ in range(rng.randint(2, 6)))}]\n"
        f"print(sum({v}), len({v}), max({v}))",
        f"if {v} > {rng.randint(0, 99)}:\n    print('yes')\nelse:\n    print('no')",
        f"while {v} < {rng.randint(10, 999)}:\n    {v} = {v} * 2\nprint({v})",
        f"with open('{rng.choice(_NOUNS)}.txt') as fh:\n"
        f"    {v} = fh.read().split()\nprint(len({v}))",
        f'{v} = {{"{rng.choice(_NOUNS)}": {rng.randint(0, 99)}, '
        f'"{rng.choice(_NOUNS)}": None, "ok": True}}',
        f"class {rng.choice(_NOUNS).title()}:\n"
        f"    def __init__(self, {v}):\n        self.{v} = {v}",
        'Traceback (most recent call last):\n  File "<stdin>", line 1, in <module>\n'
        f"NameError: name '{v}' is not defined",
    ]
    return rng.choice(choices)


def _arith(rng: random.Random) -> str:
    a, b = rng.randint(0, 99999), rng.randint(1, 9999)
    op = rng.choice(["+", "-", "*"])
    r = {"+": a + b, "-": a - b, "*": a * b}[op]
    return rng.choice(
        [
            f"What is {a} {op} {b}? The answer is \\boxed{{{r}}}.",
            f"{a} {op} {b} = {r}",
            f"Compute {a} {op} {b}. So the result is {r}.",
            f"{rng.uniform(-1000, 1000):.3f} and {rng.randint(0, 9) / 10} "
            f"and 1e-{rng.randint(1, 9)}",
        ]
    )


def _conversation(rng: random.Random) -> str:
    a, b = rng.randint(10, 99999), rng.randint(2, 9999)
    code = f"print({a} * {b})"
    call = json.dumps({"name": "python", "arguments": {"code": code}})
    tool = json.dumps(
        {
            "type": "function",
            "function": {
                "name": "python",
                "description": "Runs Python code and returns its output.",
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string", "description": "The code."}},
                    "required": ["code"],
                },
            },
        }
    )
    return (
        "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\nCall a tool with "
        '<tool_call>{"name": ..., "arguments": {...}}</tool_call>. Tools:\n<tools>\n'
        f"{tool}\n</tools><|im_end|>\n"
        f"<|im_start|>user\nWhat is {a} * {b}?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nI will use python.\n</think>\n"
        f"<tool_call>{call}</tool_call><|im_end|>\n"
        f"<|im_start|>user\n<tool_response>\n{a * b}\n</tool_response><|im_end|>\n"
        f"<|im_start|>assistant\nThe answer is \\boxed{{{a * b}}}.<|im_end|>\n<|endoftext|>"
    )


def synthetic_corpus(seed: int = 0, size: int = 20000) -> Iterator[str]:
    """Yields ``size`` deterministic documents mixing prose, code, arithmetic and chat.

    Args:
        seed: RNG seed; the same seed gives the same documents.
        size: Number of documents.
    """
    rng = random.Random(seed)
    makers = (_prose, _prose, _code, _code, _arith, _conversation)
    for _ in range(size):
        yield rng.choice(makers)(rng)
