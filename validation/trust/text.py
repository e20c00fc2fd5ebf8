r"""The tokenizer and text boundary: texts, the JSONL data files that hold them, and the tokenizer's own files.

Texts crafted to make tokenization quadratic or to make a prefix cost the whole text, a 20 MB line, numbers
float32 cannot hold as written, a generated value that underflows when written, texts with nothing to train
on; invalid UTF-8, lone surrogates, old Mac line endings, deep or huge JSON, a missing or corrupt tokenizer.
"""

from __future__ import annotations

import os

import torch

from ..cases import TrustCase, WrongResult, command_line_refusal, run_cli
from ..fixtures import fresh_dir, jsonl_file, saved_tiny_model, shared_tiny, train_tiny
from .planted import deadline

__all__ = ["CASES"]


# =============================================================================================
# security
# =============================================================================================


def _huge_line():
    from causalqwen.files.data import TextDataset

    text = "The price is 12.5 yuan. " * 850_000  # 20.4 million characters on one line
    item = TextDataset([text], shared_tiny().tokenizer, max_length=32)[0]
    if len(item["input_ids"]) != 32:
        raise WrongResult(f"expected 32 tokens, got {len(item['input_ids'])}")


def _crafted_chain(unit: str):
    def trigger():
        tokenizer = shared_tiny().tokenizer
        text = unit * (100_000 // len(unit)) + "1a"  # 100 kB; the old grammar took minutes
        deadline(15.0, f"tokenizing {unit!r} * n + '1a' (100 kB)", lambda: tokenizer([text]))

    return trigger


def _blob_prefix():
    import base64
    import random

    tokenizer = shared_tiny().tokenizer
    blob = base64.b64encode(random.Random(0).randbytes(3_000_000)).decode()  # 4 MB without a space
    result = []
    deadline(5.0, "8 tokens of a 4 MB spaceless blob", lambda: result.append(tokenizer.encode(blob, max_length=8)))
    ids, _ = result[0]
    whole_prefix, _ = tokenizer.encode(blob[:4096])
    if ids != whole_prefix[:8]:
        raise WrongResult(f"the 8 tokens {ids} differ from the text's first 8 tokens {whole_prefix[:8]}")


# =============================================================================================
# silent
# =============================================================================================


def _subnormal_text():
    tokenizer = shared_tiny().tokenizer
    text = "a tolerance of 8e-46 units"
    encoding = tokenizer([text])
    if encoding.number_texts != [[]] or tokenizer.batch_decode(encoding) != [text]:
        raise WrongResult(f"8e-46 became a number or did not come back: {encoding.number_texts}")


def _empty_texts():
    from causalqwen.files.data import TextDataset

    train_tiny(None, data=TextDataset([""] * 8, shared_tiny().tokenizer))


def _subnormal_literal():
    tokenizer = shared_tiny().tokenizer
    text = "a drift of 3e-45 m"  # float32 holds it as 2.8e-45, 6.6% off
    encoding = tokenizer([text])
    if encoding.number_texts != [[]] or tokenizer.batch_decode(encoding) != [text]:
        raise WrongResult(f"3e-45 became a number (read {encoding['numeric_values'].tolist()})")


def _decode_underflow():
    tokenizer = shared_tiny().tokenizer
    ids = torch.tensor([tokenizer.num_token_id])
    tokenizer.decode(ids, torch.tensor([1e-50], dtype=torch.float64))


# =============================================================================================
# clarity
# =============================================================================================


def _invalid_utf8():
    from causalqwen.files.data import read_jsonl

    path = os.path.join(fresh_dir("utf8"), "data.jsonl")
    with open(path, "wb") as handle:
        handle.write(b'{"text": "fine"}\n{"text": "caf\xe9 12"}\n')
    read_jsonl(path)


def _lone_surrogate():
    from causalqwen.files.data import TextDataset, read_jsonl

    path = os.path.join(fresh_dir("surrogate"), "data.jsonl")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"text": "ok"}\n{"text": "ab\\ud800cd 5"}\n')
    texts, sources = read_jsonl(path)
    TextDataset(texts, shared_tiny().tokenizer, 16, sources)


def _missing_tokenizer():
    path = saved_tiny_model()
    for name in os.listdir(path):
        if name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "added_tokens")):
            os.remove(os.path.join(path, name))
    run_cli(["generate", "--model", path, "--prompt", "hi", "--max-new-tokens", "1"])


def _cr_line_endings():
    from causalqwen.files.data import read_jsonl

    path = jsonl_file("cr.jsonl", b'{"text": "a 1"}\r{"text": "b 2"}\r{"text": "c 3"}\r')
    texts, _ = read_jsonl(path)
    if texts != ["a 1", "b 2", "c 3"]:
        raise WrongResult(f"CR-only lines read as {texts!r}")


def _data_file_command(content: bytes):
    def trigger():
        data = jsonl_file("data.jsonl", content)
        run_cli(
            [
                "train",
                "--base",
                "tiny",
                "--data",
                data,
                "--out",
                os.path.join(fresh_dir("cli-run"), "run"),
                "--steps",
                "1",
            ]
        )

    return trigger


def _corrupt_tokenizer_json():
    path = saved_tiny_model()
    file = os.path.join(path, "tokenizer.json")
    with open(file, "rb") as handle:
        start = handle.read(300)
    with open(file, "wb") as handle:
        handle.write(start)
    run_cli(["generate", "--model", path, "--prompt", "hi", "--max-new-tokens", "1"])


CASES = [
    # ---- security
    TrustCase(
        "jsonl-20-mb-line",
        "security",
        "a 20 MB text for a 32-token training row (the Rust tokenizer aborts on 50 MB)",
        _huge_line,
        None,
    ),
    TrustCase(
        "crafted-dash-chain",
        "security",
        'tokenize "1-" * 50,000 + "1a" (100 kB; 10 kB took 3.4-5.4 s)',
        _crafted_chain("1-"),
        None,
    ),
    TrustCase("crafted-slash-chain", "security", 'tokenize "1/" * 50,000 + "1a" (100 kB)', _crafted_chain("1/"), None),
    TrustCase(
        "crafted-colon-chain", "security", 'tokenize "12:" * 33,333 + "1a" (100 kB)', _crafted_chain("12:"), None
    ),
    TrustCase(
        "spaceless-blob-prefix",
        "security",
        "8 tokens of a 4 MB base64 blob (was encoded whole: 12 s, +1 GB)",
        _blob_prefix,
        None,
    ),
    # ---- silent
    TrustCase(
        "text-subnormal-number",
        "silent",
        "the number 8e-46 in a text (became 1.4e-45; stays text now)",
        _subnormal_text,
        None,
        "",
    ),
    TrustCase(
        "train-on-empty-texts",
        "silent",
        "training on texts that are all empty (loss 0 on nothing)",
        _empty_texts,
        ValueError,
        "none of the 8 training texts has two tokens",
    ),
    TrustCase(
        "text-subnormal-3e-45",
        "silent",
        "the literal 3e-45 in a text (read 6.6% off as 2.8e-45; stays text now)",
        _subnormal_literal,
        None,
    ),
    TrustCase(
        "decode-value-underflows",
        "silent",
        "decoding a generated value of 1e-50 (wrote 0)",
        _decode_underflow,
        ValueError,
        r"1e-50.*underflows",
    ),
    # ---- clarity
    TrustCase(
        "jsonl-invalid-utf8",
        "clarity",
        "a JSONL line with a Latin-1 byte",
        _invalid_utf8,
        ValueError,
        r"data\.jsonl, line 2: invalid UTF-8 at byte 13 of the line",
    ),
    TrustCase(
        "jsonl-lone-surrogate",
        "clarity",
        'a JSONL text holding "\\ud800"',
        _lone_surrogate,
        ValueError,
        r"data\.jsonl, line 2: character 2 of the text is '\\ud800', a lone surrogate",
    ),
    command_line_refusal(
        "tokenizer-files-missing",
        "clarity",
        "generate --model on a directory without its tokenizer files",
        _missing_tokenizer,
        r".*cannot load a tokenizer from '.*model'",
    ),
    TrustCase(
        "jsonl-cr-line-endings", "clarity", "a JSONL file with old Mac line endings (CR alone)", _cr_line_endings, None
    ),
    command_line_refusal(
        "jsonl-deeply-nested",
        "clarity",
        "a JSONL line nested 100,000 deep (exit 1, RecursionError)",
        _data_file_command(b'{"text": "x"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n"),
        r".*data\.jsonl, line 2: the JSON is nested too deeply to read",
    ),
    command_line_refusal(
        "jsonl-5000-digit-integer",
        "clarity",
        "a JSONL line with a 5,000-digit integer (no line named)",
        _data_file_command(b'{"text": "x"}\n{"text": "y", "n": ' + b"9" * 5000 + b"}\n"),
        r".*data\.jsonl, line 2: an integer of 5000 digits",
    ),
    command_line_refusal(
        "corrupt-tokenizer-json",
        "clarity",
        "generate --model with a tokenizer.json cut short (file not named)",
        _corrupt_tokenizer_json,
        r".*tokenizer\.json' is not valid JSON",
    ),
]
