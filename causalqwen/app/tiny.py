"""A tiny, self-contained Qwen2 base model and tokenizer, built without any network access.

The real CausalQwen starts from a pretrained Qwen2.5 checkpoint. For tests, examples and
walkthroughs we want something with exactly the same *structure* that is built in well under a
second and never touches the Hugging Face Hub:

* `build_tiny_tokenizer` trains a small byte-level BPE on `TINY_CORPUS` with exactly
  Qwen2's normalizer (NFC) and pre-tokenizer (the ``PRETOKENIZE_REGEX`` split followed by a
  byte-level mapping), and wraps it in a `transformers.Qwen2Tokenizer` with Qwen2's special
  tokens ``<|endoftext|>``, ``<|im_start|>`` and ``<|im_end|>``.
* `build_tiny_qwen` builds a randomly initialised `transformers.Qwen2ForCausalLM`
  whose embedding matrix has more rows (V) than the tokenizer has tokens (K), just like Qwen2.5
  (K = 151665, V = 151936). The spare rows leave room for the ``<NUM>`` token that
  `causalqwen.integrations.tokenizer.NumericTokenizer` appends with id K.
* `build_tiny_base` returns both, and `save_tiny_base` writes them to a directory
  that ``from_pretrained`` can load offline.
* `build_tiny_causal_lm` converts the tiny base to CausalQwen with its `NumericTokenizer`: the
  one recipe the CLI, demo, tests, benchmarks and experiments share.

Everything here is deterministic: the same ``seed`` gives the same weights, and the tokenizer
never changes between builds.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, NamedTuple

import torch
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import (
    PRETOKENIZE_REGEX,
    Qwen2Tokenizer,
)

if TYPE_CHECKING:  # imported inside build_tiny_causal_lm: the model modules do not need this one loaded
    from ..integrations.tokenizer import NumericTokenizer
    from ..modeling import CausalQwenForCausalLM

__all__ = [
    "TINY_CORPUS",
    "TINY_BPE_VOCAB_SIZE",
    "TINY_RESERVED_ROWS",
    "QWEN2_SPECIAL_TOKENS",
    "tiny_vocab_size",
    "build_tiny_tokenizer",
    "build_tiny_qwen",
    "build_tiny_base",
    "save_tiny_base",
    "TinyCausalLM",
    "build_tiny_causal_lm",
]

# A small bilingual corpus that mixes words with the kinds of numbers CausalQwen cares about:
# prices, temperatures, years, percentages, counts, negative values and scientific notation.
TINY_CORPUS: list[str] = [
    "The price is 99.9 yuan.",
    "In 2020-2021 sales grew by 12.5%.",
    "The temperature dropped to -3.5 degrees last night.",
    "She bought 3 apples and 12 oranges for 25.8 dollars.",
    "The company hired 1,250 new workers in 2023.",
    "Revenue was 4.2 billion, up 7% from the year before.",
    "The train leaves at 8:45 and arrives at 11:30.",
    "Water boils at 100 degrees and freezes at 0 degrees.",
    "The speed of light is about 3e8 meters per second.",
    "A small cup of coffee costs 2.5 dollars, a large one costs 3.75 dollars.",
    "The population of the city is 8,400,000 people.",
    "He ran 42.195 kilometers in 3 hours and 5 minutes.",
    "The interest rate fell from 4.5% to 3.25%.",
    "Our team won 17 games and lost 5 games this season.",
    "The stock price changed by -2.4% on Monday.",
    "The model has 7 billion parameters and was trained on 18 trillion tokens.",
    "Please read pages 10 to 25 before the next class.",
    "The average score of the class is 86.4 out of 100.",
    "The bridge is 1.6 kilometers long and 30 meters wide.",
    "In 1998 the price of rice was 1.2 yuan per kilogram.",
    "The weather today is sunny with a high of 28 degrees.",
    "Numbers such as 0.001 and 1.5e-3 are equal.",
    "价格是99.9元",
    "温度-15.5度",
    "今天的气温是25度，明天会降到18度。",
    "这本书的价格是45.5元，打八折以后是36.4元。",
    "2022年全国的粮食产量增长了1.2%。",
    "他每天早上跑步5公里，用时大约30分钟。",
    "这家公司在2019年有员工3,200人。",
    "北京冬天的最低气温可以达到-20度。",
    "我们班有42名学生，其中女生有23名。",
    "这台电脑的价格是6999元，比去年便宜了500元。",
    "今年的销售额比去年增长了12.5%，达到了1.8亿元。",
    "一杯咖啡的价格是28元，一杯茶的价格是15元。",
    "火车在上午9点出发，下午3点到达。",
    "这座山的高度是1,532米。",
    "Apple shares rose 3.1% to 189.5 dollars on the news.",
    "The recipe needs 250 grams of flour and 2 eggs.",
    "The package weighs 2.75 kilograms and costs 15 dollars to ship.",
    "A year has 365 days, and a leap year has 366 days.",
    "The lake is 4.6 meters deep at its deepest point.",
    "她的体重从60.5公斤减少到了55公斤。",
    "这个城市的人口大约是1,000,000人。",
    "汇率是1美元兑换7.25元人民币。",
    "The experiment was repeated 10 times with an error of 0.05.",
    "Between 1990 and 2000 the population grew from 5.2 million to 6.1 million.",
    "The machine used 3.5 kilowatt hours of power.",
    "Good morning! 早上好！ The meeting starts at 10.",
]

# The size the BPE trainer aims for. The small corpus may run out of merges before it gets
# there, in which case the vocabulary is simply smaller; it never changes between builds.
TINY_BPE_VOCAB_SIZE = 600

# Qwen2's special tokens, in the order in which they follow the BPE vocabulary.
QWEN2_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# The model always has at least this many embedding rows beyond the tokenizer's tokens.
TINY_RESERVED_ROWS = 64


def _qwen2_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Return Qwen2's pre-tokenizer: its regex split followed by a byte-level mapping."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def build_tiny_tokenizer() -> Qwen2Tokenizer:
    """Train a small byte-level BPE on `TINY_CORPUS` and wrap it as a ``Qwen2Tokenizer``.

    The trainer sees the corpus through exactly the normalizer (NFC) and pre-tokenizer that
    ``Qwen2Tokenizer`` uses, so the learned merges are consistent with how the tokenizer will
    split text. All 256 byte symbols are in the initial alphabet, so every string can be encoded
    and decoded without unknown tokens.

    The special tokens come right after the BPE vocabulary, as in Qwen2:
    ``<|endoftext|>`` (which is also the eos, pad and unk token; there is no bos token),
    then ``<|im_start|>`` and ``<|im_end|>``.

    Returns:
        A ``Qwen2Tokenizer`` with K = ``len(tokenizer)`` tokens. Two calls give identical
        vocabularies and merges.
    """
    trainer_backend = Tokenizer(BPE())
    trainer_backend.normalizer = normalizers.NFC()
    trainer_backend.pre_tokenizer = _qwen2_pre_tokenizer()
    trainer = BpeTrainer(
        vocab_size=TINY_BPE_VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    trainer_backend.train_from_iterator(TINY_CORPUS, trainer=trainer)

    vocab = trainer_backend.get_vocab()
    # The merges are read from the BPE model itself: ``model.save`` writes vocab.json and
    # merges.txt, but going through the JSON form keeps everything in memory.
    merges = _read_merges(trainer_backend)

    end_of_text, im_start, im_end = QWEN2_SPECIAL_TOKENS
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=end_of_text,
        eos_token=end_of_text,
        pad_token=end_of_text,
        bos_token=None,
        extra_special_tokens=[im_start, im_end],
    )

    expected_ids = {token: len(vocab) + offset for offset, token in enumerate(QWEN2_SPECIAL_TOKENS)}
    actual_ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN2_SPECIAL_TOKENS}
    if actual_ids != expected_ids:
        raise RuntimeError(
            f"the tiny tokenizer's special tokens got ids {actual_ids}, expected {expected_ids} "
            "(right after the BPE vocabulary, as in Qwen2)"
        )
    return tokenizer


def _read_merges(backend: Tokenizer) -> list[tuple[str, str]]:
    """Return the learned BPE merges of ``backend`` as a list of ``(left, right)`` pairs."""
    model_state = json.loads(backend.to_str())["model"]
    merges = []
    for merge in model_state["merges"]:
        # Recent ``tokenizers`` versions store a merge as a pair, older ones as "left right".
        if isinstance(merge, str):
            left, right = merge.split(" ")
        else:
            left, right = merge
        merges.append((left, right))
    return merges


def tiny_vocab_size(num_tokens: int, reserved_rows: int = TINY_RESERVED_ROWS) -> int:
    """Return the embedding size V for a tokenizer with ``num_tokens`` tokens.

    V is ``num_tokens + reserved_rows`` rounded up to a multiple of 64, so there are always at
    least ``reserved_rows`` spare rows, as in Qwen2.5 (which pads 151665 tokens to 151936 rows).
    """
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens <= 0:
        raise ValueError(f"num_tokens must be a positive int, got {num_tokens!r}")
    if isinstance(reserved_rows, bool) or not isinstance(reserved_rows, int) or reserved_rows < 0:
        raise ValueError(f"reserved_rows must be a non-negative int, got {reserved_rows!r}")
    multiple = 64
    return -(-(num_tokens + reserved_rows) // multiple) * multiple


def _check_shape(seed, sizes: dict, tie_word_embeddings) -> None:
    """The argument checks of `build_tiny_qwen` (the public door); ``sizes`` holds its five size arguments by name
    (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
    ``intermediate_size``)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    hidden_size, heads, kv_heads = sizes["hidden_size"], sizes["num_attention_heads"], sizes["num_key_value_heads"]
    if hidden_size % heads != 0:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({heads})")
    if heads % kv_heads != 0:
        raise ValueError(f"num_attention_heads ({heads}) must be divisible by num_key_value_heads ({kv_heads})")
    if not isinstance(tie_word_embeddings, bool):
        raise TypeError(f"tie_word_embeddings must be a bool, got {type(tie_word_embeddings).__name__}")


def _vocab_size(num_tokens: int, vocab_size) -> int:
    """V: `tiny_vocab_size` (K) unless the caller asked for its own ``vocab_size`` (at least K)."""
    if vocab_size is None:
        return tiny_vocab_size(num_tokens)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if vocab_size < num_tokens:
        raise ValueError(f"vocab_size ({vocab_size}) must be at least the tokenizer length ({num_tokens})")
    return vocab_size


def build_tiny_qwen(
    tokenizer=None,
    seed: int = 0,
    *,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    tie_word_embeddings: bool = True,
    **config_overrides,
) -> Qwen2ForCausalLM:
    """Build a small, randomly initialised ``Qwen2ForCausalLM`` in float32.

    Args:
        tokenizer: the tokenizer the model is meant for; defaults to `build_tiny_tokenizer`.
            Its length K decides the vocabulary size V = `tiny_vocab_size` (K), so the
            model has at least 64 reserved embedding rows. Its pad and eos ids go into the
            config; the bos id is the tokenizer's bos id, or its eos id when it has no bos token
            (Qwen2.5's base config does the same with ``<|endoftext|>``).
        seed: seed for the weight initialisation. The same seed gives the same weights; the
            global torch random state is left as it was.
        hidden_size: the usual ``Qwen2Config`` field.
        num_hidden_layers: the usual ``Qwen2Config`` field.
        num_attention_heads: the usual ``Qwen2Config`` field.
        num_key_value_heads: the usual ``Qwen2Config`` field.
        intermediate_size: the usual ``Qwen2Config`` field.
        tie_word_embeddings: the usual ``Qwen2Config`` field.
        **config_overrides: any other ``Qwen2Config`` fields (for example
            ``max_position_embeddings``), including ``vocab_size`` if a caller really wants a
            different V (it must still be at least K).

    Returns:
        The model, in eval mode.
    """
    sizes = {
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "intermediate_size": intermediate_size,
    }
    _check_shape(seed, sizes, tie_word_embeddings)
    if tokenizer is None:
        tokenizer = build_tiny_tokenizer()
    vocab_size = _vocab_size(len(tokenizer), config_overrides.pop("vocab_size", None))
    eos_token_id = tokenizer.eos_token_id
    bos_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos_token_id
    config = Qwen2Config(
        **{
            "vocab_size": vocab_size,
            **sizes,
            "tie_word_embeddings": tie_word_embeddings,
            "max_position_embeddings": 2048,
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "dtype": torch.float32,
            **config_overrides,
        }
    )
    previous_dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_default_dtype(torch.float32)
        try:
            model = Qwen2ForCausalLM(config)
        finally:
            torch.set_default_dtype(previous_dtype)
    model.eval()
    return model


def build_tiny_base(seed: int = 0) -> tuple[Qwen2ForCausalLM, Qwen2Tokenizer]:
    """Return ``(model, tokenizer)``: the tiny tokenizer and a tiny Qwen2 model built for it."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_qwen(tokenizer, seed=seed)
    return model, tokenizer


class TinyCausalLM(NamedTuple):
    """What `build_tiny_causal_lm` returns."""

    model: "CausalQwenForCausalLM"  # the converted model, in eval mode
    tokenizer: "NumericTokenizer"  # the tiny tokenizer with <NUM> appended
    qwen: Qwen2ForCausalLM  # the base it was converted from (its weights are copied, not shared)


def build_tiny_causal_lm(seed: int = 0, init_seed: int | None = None, **config_overrides) -> TinyCausalLM:
    """The tiny base converted to CausalQwen: ``(model, tokenizer, qwen)``.

    One recipe for every test, benchmark, experiment and CLI command that needs a small model:
    `build_tiny_base` (``seed`` fixes the Qwen2 weights), `NumericTokenizer` around its
    tokenizer, and `CausalQwenForCausalLM.from_qwen` with the tokenizer's ``<NUM>`` id and the
    given `CausalQwenConfig` overrides.

    ``from_qwen`` draws the new random parameters (w_num, w_reg) from torch's generator. With
    ``init_seed=None`` that is the global generator, as ``from_qwen`` alone does; with an int it is
    a generator seeded with ``init_seed``, and the global random state is left as it was.
    """
    from ..integrations.tokenizer import NumericTokenizer
    from ..modeling import CausalQwenForCausalLM

    if init_seed is not None and (isinstance(init_seed, bool) or not isinstance(init_seed, int)):
        raise TypeError(f"init_seed must be an int or None, got {type(init_seed).__name__}")
    qwen, hf_tokenizer = build_tiny_base(seed=seed)
    tokenizer = NumericTokenizer(hf_tokenizer)
    with torch.random.fork_rng(devices=[], enabled=init_seed is not None):
        if init_seed is not None:
            torch.manual_seed(init_seed)
        model = CausalQwenForCausalLM.from_qwen(qwen, num_token_id=tokenizer.num_token_id, **config_overrides)
    return TinyCausalLM(model.eval(), tokenizer, qwen)


def save_tiny_base(path: str | os.PathLike, seed: int = 0) -> str:
    """Build the tiny base and save model and tokenizer to the directory ``path``.

    The model is written as safetensors. Afterwards ``Qwen2ForCausalLM.from_pretrained(path)``
    and ``AutoTokenizer.from_pretrained(path)`` load both back without any network access.

    Returns:
        ``path`` as a string.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"path {path!r} exists and is not a directory")
    model, tokenizer = build_tiny_base(seed=seed)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
