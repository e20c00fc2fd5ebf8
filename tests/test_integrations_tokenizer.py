"""A script written from transformers habit, run against `causalqwen.NumericTokenizer`.

The oracles: the texts themselves (round trips), a fresh wrapped tokenizer that never saw ``<NUM>`` (special
tokens, vocabulary, token strings), the wrapped tokenizer's own ``decode`` (which writes ``<NUM>``, its special
added token, literally), numpy's float32 rounding of the values written in the texts, and values chosen here.
"""

import math
import re

import numpy as np
import pytest
import torch
from transformers import (
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)

from causalqwen import NumericTokenizer
from causalqwen.app.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from causalqwen.files.data import collate
from causalqwen.integrations.collator import NumericDataCollator

TEXTS = ["It costs 2.5 dollars.", "Add 37 and 5."]
SPECIAL_ATTRIBUTES = [
    "eos_token",
    "eos_token_id",
    "pad_token",
    "pad_token_id",
    "bos_token",
    "bos_token_id",
    "unk_token",
    "unk_token_id",
    "vocab_size",
]


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    return model, tokenizer


def test_tokenize_run_the_model_and_decode_as_transformers_users_do(tiny):
    model, tok = tiny
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    assert isinstance(enc["input_ids"], torch.Tensor) and enc.input_ids.shape == enc.numeric_values.shape
    with torch.no_grad():
        out = model(**enc)
    assert out.logits.shape[:2] == enc.input_ids.shape
    assert tok.batch_decode(enc.input_ids, enc.numeric_values, skip_special_tokens=True) == TEXTS
    assert tok.batch_decode(enc) == TEXTS
    # the values, float32-exact at the <NUM> positions, as numpy rounds the numbers written in the texts
    numbers = [enc.numeric_values[b][enc.input_ids[b] == tok.num_token_id].tolist() for b in range(2)]
    assert numbers == [[float(np.float32(2.5))], [float(np.float32(37)), float(np.float32(5))]]


def test_the_default_padding_is_on_the_left_for_generation(tiny):
    _, tok = tiny
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    lengths = [len(tok.encode(text)[0]) for text in TEXTS]
    width = max(lengths)
    assert tok.padding_side == "left"
    for row, length in enumerate(lengths):
        assert enc.attention_mask[row].tolist() == [0] * (width - length) + [1] * length
        assert enc.input_ids[row, : width - length].tolist() == [tok.pad_token_id] * (width - length)
    right = tok(TEXTS, padding=True, padding_side="right")
    assert right.attention_mask[0].tolist() == [1] * lengths[0] + [0] * (width - lengths[0])


def test_decoding_plain_ids_writes_the_number_token_never_a_number(tiny):
    _, tok = tiny
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    assert tok.decode(enc.input_ids[1]) == "Add <NUM> and <NUM>."
    assert tok.batch_decode(enc.input_ids, skip_special_tokens=True) == [
        "It costs <NUM> dollars.",
        "Add <NUM> and <NUM>.",
    ]
    for row in enc.input_ids:  # the wrapped tokenizer writes <NUM>, its special added token, as its text too
        expected = tok.hf_tokenizer.decode(row, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert tok.decode(row, skip_special_tokens=False) == expected
    with pytest.raises(TypeError, match="number_texts needs numeric_values"):
        tok.decode(enc.input_ids[0], number_texts=["2.5"])


def test_return_tensors_none_and_np_are_lists_and_arrays(tiny):
    _, tok = tiny
    lists = tok(TEXTS, return_tensors=None, padding=False)
    expected = [tok.encode(text) for text in TEXTS]  # rows of different lengths: nothing pads them
    assert lists["input_ids"] == [ids for ids, _ in expected]
    assert lists["numeric_values"] == [values for _, values in expected]
    assert lists["attention_mask"] == [[1] * len(ids) for ids, _ in expected]
    assert all(type(value) is float for row in lists["numeric_values"] for value in row)
    arrays = tok(TEXTS, return_tensors="np", padding="longest")
    tensors = tok(TEXTS, return_tensors="pt")
    assert arrays["input_ids"].dtype == np.int64 and arrays["numeric_values"].dtype == np.float32
    for key in tensors:
        assert arrays[key].tolist() == tensors[key].tolist()
    assert "attention_mask" not in tok(TEXTS, return_attention_mask=False)
    assert tok(TEXTS, padding="do_not_pad", return_tensors=None)["input_ids"] == lists["input_ids"]
    cut = tok(TEXTS, truncation="longest_first", max_length=3, return_tensors=None, padding=False)
    assert cut["input_ids"] == [ids[:3] for ids, _ in expected]


def test_bad_keywords_are_named(tiny):
    _, tok = tiny
    with pytest.raises(TypeError, match="return_tensor"):
        tok(TEXTS, return_tensor="pt")
    with pytest.raises(ValueError, match="return_tensors must be"):
        tok(TEXTS, return_tensors="tf")
    with pytest.raises(ValueError, match="padding=False needs texts of equal token length"):
        tok(TEXTS, padding=False)


def test_special_tokens_and_vocabulary_are_the_wrapped_tokenizers(tiny):
    _, tok = tiny
    fresh = build_tiny_tokenizer()  # never wrapped: no <NUM>
    for name in SPECIAL_ATTRIBUTES:
        assert getattr(tok, name) == getattr(fresh, name), name
    assert tok.bos_token is None and tok.bos_token_id is None  # Qwen2 has none
    assert tok.all_special_tokens == fresh.all_special_tokens + ["<NUM>"]
    assert tok.all_special_ids == fresh.all_special_ids + [tok.num_token_id]
    assert len(tok) == len(fresh) + 1 and tok.num_token_id == len(fresh)
    ids = list(range(len(fresh)))
    assert tok.convert_ids_to_tokens(ids) == fresh.convert_ids_to_tokens(ids)
    assert tok.convert_ids_to_tokens(tok.num_token_id) == "<NUM>"
    assert tok.convert_ids_to_tokens(torch.tensor([5, tok.num_token_id])) == [fresh.convert_ids_to_tokens(5), "<NUM>"]
    assert tok.convert_tokens_to_ids(fresh.convert_ids_to_tokens(ids)) == ids
    assert tok.convert_tokens_to_ids("<NUM>") == tok.num_token_id
    assert tok.get_vocab() == fresh.get_vocab() | {"<NUM>": tok.num_token_id}


def test_pad_token_can_be_set_as_transformers_users_do():
    hf = build_tiny_tokenizer()
    hf.pad_token = None
    tok = NumericTokenizer(hf)
    assert tok.pad_token is None and tok.pad_token_id is None
    with pytest.raises(ValueError, match="no pad token; set tokenizer.pad_token"):
        tok(TEXTS)
    tok.pad_token = tok.eos_token
    assert tok.pad_token_id == tok.eos_token_id == hf.eos_token_id
    assert tok.batch_decode(tok(TEXTS)) == TEXTS


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_interface_survives_a_save_and_autotokenizer(tiny, tmp_path, side):
    _, tok = tiny
    fresh = NumericTokenizer(build_tiny_tokenizer(), padding_side=side)
    fresh.save_pretrained(tmp_path)
    for loaded in (
        NumericTokenizer.from_pretrained(tmp_path),
        AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=True),
    ):
        assert isinstance(loaded, NumericTokenizer) and loaded.padding_side == side
        for name in SPECIAL_ATTRIBUTES + ["all_special_tokens", "all_special_ids"]:
            assert getattr(loaded, name) == getattr(tok, name), name
        assert loaded.num_token_id == tok.num_token_id and len(loaded) == len(tok)
        enc = loaded(TEXTS, return_tensors="pt")
        assert loaded.batch_decode(enc.input_ids, enc.numeric_values) == TEXTS
        assert torch.equal(enc.numeric_values, tok(TEXTS, padding_side=side).numeric_values)


AUTO_HABIT = """
import json, sys
if sys.argv[2] == "transformers first":
    from transformers import AutoModelForCausalLM
import causalqwen
loaded = sorted(m for m in ("causalqwen.configuration", "causalqwen.modeling", "torch", "transformers")
                if m in sys.modules)
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
config = AutoConfig.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)
found = [type(config).__name__, type(model).__name__, type(AutoModel.from_pretrained(path)).__name__,
         type(AutoModelForCausalLM.from_config(config)).__name__, type(AutoTokenizer.from_pretrained(path)).__name__]
tokenizer = causalqwen.NumericTokenizer.from_pretrained(path)
batch = tokenizer(["It costs 2.5 dollars."], return_tensors="pt")
print("RESULT", json.dumps([loaded, found, model(**batch).loc_Y.tolist()]))
"""


@pytest.mark.parametrize("order", ["causalqwen first", "transformers first"])
def test_import_causalqwen_lets_the_auto_classes_load_a_saved_directory(tiny, tmp_path, order):
    """The README's habit in a fresh interpreter: after ``import causalqwen`` (before or after transformers' Auto
    classes), AutoConfig, AutoModelForCausalLM and AutoModel load a saved directory without ``trust_remote_code``,
    and ``import causalqwen`` alone imported neither the model nor the configuration (nor transformers or torch).
    AutoTokenizer without consent gives transformers' own class (docs/security.md)."""
    import json
    import subprocess
    import sys

    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", AUTO_HABIT, str(tmp_path), order],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
        stdin=subprocess.DEVNULL,  # transformers asks on stdin for consent before it refuses
    )
    assert run.returncode == 0, run.stderr[-3000:]
    loaded, found, loc_Y = json.loads(run.stdout.split("RESULT ")[-1])
    assert loaded == ([] if order == "causalqwen first" else ["torch", "transformers"])
    assert found == [
        "CausalQwenConfig",
        "CausalQwenForCausalLM",
        "CausalQwenModel",
        "CausalQwenForCausalLM",
        "Qwen2Tokenizer",
    ]
    batch = tok(["It costs 2.5 dollars."], return_tensors="pt")
    with torch.no_grad():
        expected = model(**batch).loc_Y
    torch.testing.assert_close(torch.tensor(loc_Y), expected, rtol=1e-5, atol=1e-5)


def test_the_auto_registration_names_the_classes_causalqwen_defines():
    """The names `causalqwen.integrations.auto_registration` writes into transformers' tables are the model type and
    the classes of the package, and each transformers table holds them once causalqwen is imported."""
    from transformers.models.auto import configuration_auto, modeling_auto

    import causalqwen
    from causalqwen.integrations import auto_registration

    assert auto_registration.MODEL_TYPE == causalqwen.CausalQwenConfig.model_type
    assert configuration_auto.CONFIG_MAPPING_NAMES[auto_registration.MODEL_TYPE] == auto_registration.CONFIG_CLASS
    assert configuration_auto.CONFIG_MAPPING[auto_registration.MODEL_TYPE] is causalqwen.CausalQwenConfig
    for names, mapping, class_name in auto_registration.MODEL_TABLES:
        assert getattr(modeling_auto, names)[auto_registration.MODEL_TYPE] == class_name
        assert getattr(modeling_auto, mapping)[causalqwen.CausalQwenConfig] is getattr(causalqwen, class_name)


def test_numbers_survive_generate_on_the_documented_path(tiny):
    model, tok = tiny
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    plain = model.generate(**enc, max_new_tokens=3, do_sample=False)
    full = model.generate(**enc, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(plain, full.sequences)
    # plain ids: the prompt's numbers are written as <NUM>, never as a wrong number
    assert tok.decode(plain[1]).startswith("Add <NUM> and <NUM>.")
    # return_dict_in_generate=True gives the values: the prompt comes back with its numbers
    for row, text in enumerate(TEXTS):
        decoded = tok.decode(full.sequences[row], full.numeric_values[row])
        assert decoded.startswith(text)


# ---------------------------------------------------------------------------------------------
# Collating as transformers' DataCollatorWithPadding does, with the values
# ---------------------------------------------------------------------------------------------


def test_the_collator_pads_values_and_labels_as_written_by_hand(tiny):
    _, tok = tiny
    pad = tok.pad_token_id
    features = [
        {"input_ids": [5, tok.num_token_id], "numeric_values": [0.0, 2.5], "labels": [5, tok.num_token_id]},
        {"input_ids": torch.tensor([7]), "numeric_values": np.array([0.0], dtype=np.float32), "labels": [-100]},
    ]
    batch = NumericDataCollator(tok)(features)
    assert batch["input_ids"].tolist() == [[5, tok.num_token_id], [7, pad]]
    assert batch["numeric_values"].dtype == torch.float32
    assert batch["numeric_values"].tolist() == [[0.0, 2.5], [0.0, 0.0]]
    assert batch["attention_mask"].tolist() == [[1, 1], [1, 0]]
    assert batch["labels"].tolist() == [[5, tok.num_token_id], [-100, -100]]
    assert batch["numeric_labels"].tolist() == [[0.0, 2.5], [0.0, 0.0]]
    left = NumericDataCollator(tok, padding_side="left", pad_to_multiple_of=4, return_tensors="np")(features)
    assert left["input_ids"].tolist() == [[pad, pad, 5, tok.num_token_id], [pad, pad, pad, 7]]
    assert left["numeric_labels"].dtype == np.float32 and left["labels"][1].tolist() == [-100] * 4
    plain = NumericDataCollator(tok)([{key: f[key] for key in ("input_ids", "numeric_values")} for f in features])
    assert set(plain) == {"input_ids", "numeric_values", "attention_mask"}


def test_the_collator_with_add_labels_is_the_projects_collate(tiny):
    _, tok = tiny
    texts = ["It costs 2.5 dollars.", "Add 37 and 5.", "x 1e3"]
    rows = tok(texts, return_tensors=None, padding=False)
    features = [{"input_ids": rows["input_ids"][b], "numeric_values": rows["numeric_values"][b]} for b in range(3)]
    ours = NumericDataCollator(tok, add_labels=True)(features)
    theirs = collate([{key: torch.tensor(value) for key, value in f.items()} for f in features], tok.pad_token_id)
    assert set(ours) == set(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key


def test_the_collator_names_what_is_wrong(tiny):
    _, tok = tiny
    collator = NumericDataCollator(tok)
    with pytest.raises(ValueError, match="non-empty list"):
        collator([])
    with pytest.raises(ValueError, match=r"features\[1\] has no numeric_values"):
        collator([{"input_ids": [1], "numeric_values": [0.0]}, {"input_ids": [1]}])
    with pytest.raises(ValueError, match=r"features\[0\]\['numeric_values'\] has length 2 but input_ids 1"):
        collator([{"input_ids": [1], "numeric_values": [0.0, 1.0]}])
    with pytest.raises(ValueError, match="padding_side"):
        NumericDataCollator(tok, padding_side="middle")


def test_trainer_with_the_collator_reports_eval_loss(tiny, tmp_path):
    model, tok = tiny
    rows = tok(["It costs 2.5 dollars.", "Add 37 and 5."], return_tensors=None, padding=False)
    dataset = [
        {"input_ids": ids, "numeric_values": values} for ids, values in zip(rows["input_ids"], rows["numeric_values"])
    ]
    collator = NumericDataCollator(tok, add_labels=True)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to=[], use_cpu=True)
    metrics = Trainer(model=model, args=args, eval_dataset=dataset, data_collator=collator).evaluate()
    with torch.no_grad():
        expected = model(**collator(dataset)).loss.item()
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)


# ---------------------------------------------------------------------------------------------
# Chat templates: the wrapped tokenizer's template, numbers as <NUM> and values
# ---------------------------------------------------------------------------------------------

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_apply_chat_template_keeps_the_templates_special_tokens_and_the_numbers(tiny):
    _, tok = tiny
    messages = [{"role": "user", "content": "What is 2.5 plus 37?"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=CHATML)
    assert rendered == "<|im_start|>user\nWhat is 2.5 plus 37?<|im_end|>\n<|im_start|>assistant\n"
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, chat_template=CHATML)
    # oracle: the wrapped tokenizer itself, special-token matching on, the numbers written as <NUM> by hand
    by_hand = "<|im_start|>user\nWhat is <NUM> plus <NUM>?<|im_end|>\n<|im_start|>assistant\n"
    expected = tok.hf_tokenizer(by_hand, add_special_tokens=False)["input_ids"]
    assert enc.input_ids[0].tolist() == expected
    assert enc.input_ids[0, 0].item() == tok.convert_tokens_to_ids("<|im_start|>")
    numbers = enc.numeric_values[0][enc.input_ids[0] == tok.num_token_id].tolist()
    assert numbers == [float(np.float32(2.5)), 37.0] and enc.number_texts == [["2.5", "37"]]
    assert tok.batch_decode(enc, skip_special_tokens=False) == [rendered]


def test_a_typed_number_token_in_a_message_stays_text(tiny):
    _, tok = tiny
    messages = [[{"role": "user", "content": "<NUM> is 4"}], [{"role": "user", "content": "hi"}]]
    enc = tok.apply_chat_template(messages, chat_template=CHATML, return_tensors=None)
    assert [row.count(tok.num_token_id) for row in enc["input_ids"]] == [1, 0]  # the 4 alone
    lengths = [sum(mask) for mask in enc["attention_mask"]]
    assert lengths[1] < lengths[0] and enc["attention_mask"][1][0] == 0  # the shorter row padded on the left
    with pytest.raises(ValueError, match="return_dict=False would give the ids without"):
        tok.apply_chat_template(messages[0], chat_template=CHATML, return_dict=False)


def test_transformers_stock_collators_pad_the_values_through_tokenizer_pad(tiny):
    _, tok = tiny
    rows = tok(TEXTS, return_tensors=None, padding=False)
    features = [{key: rows[key][b] for key in rows} for b in range(2)]
    expected = tok(TEXTS, return_tensors="pt", padding=True)  # the tokenizer's own padding, on its side (left)
    batch = DataCollatorWithPadding(tok)(features)
    assert set(batch) == set(expected)
    for key in expected:
        assert batch[key].dtype == expected[key].dtype and torch.equal(batch[key], expected[key]), key
    wide = DataCollatorWithPadding(tok, padding="max_length", max_length=12)(features)
    assert (
        wide["input_ids"].shape == (2, 12)
        and wide["numeric_values"][:, -9:].tolist() == expected["numeric_values"].tolist()
    )
    lm = DataCollatorForLanguageModeling(tok, mlm=False)(features)
    assert torch.equal(lm["numeric_values"], expected["numeric_values"])
    assert lm["labels"].tolist() == expected["input_ids"].masked_fill(expected["attention_mask"] == 0, -100).tolist()
    assert tok.batch_decode(batch) == TEXTS
    with pytest.raises(ValueError, match="pad needs padding=True"):
        tok.pad(features, padding=False)


def test_add_special_tokens_is_taken_where_it_adds_nothing(tiny):
    _, tok = tiny
    expected = tok(TEXTS)
    for flag in (True, False):  # Qwen2 adds no special token to a text: both are the plain encoding
        assert torch.equal(tok(TEXTS, add_special_tokens=flag).input_ids, expected.input_ids)
    with pytest.raises(TypeError, match="add_special_tokens must be a bool"):
        tok(TEXTS, add_special_tokens="yes")


def test_add_special_tokens_true_is_refused_where_the_wrapped_tokenizer_would_add_some():
    from tokenizers.processors import TemplateProcessing

    hf = build_tiny_tokenizer()
    start = hf.convert_tokens_to_ids("<|im_start|>")
    hf.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", start)]
    )
    assert hf("a")["input_ids"][0] == start  # the wrapped tokenizer now adds a token in front
    tok = NumericTokenizer(hf)
    with pytest.raises(ValueError, match="the wrapped tokenizer adds special tokens"):
        tok(TEXTS, add_special_tokens=True)
    enc = tok(TEXTS, add_special_tokens=False)
    assert start not in enc.input_ids.tolist()[1] and tok.batch_decode(enc, skip_special_tokens=False) == TEXTS


# ----- a TextStreamer that writes the numbers (causalqwen.integrations.streamer) -----

STREAM_PROMPT = "The price is 12.50 yuan, up 3% from"


def written_by_the_prompt_rule(value: float, prompt_decimals: int) -> str:
    """A generated value as ``number_resolution="prompt"`` writes it (decision D17), by Python's own formatting of
    the float32 value (half to even on its exact binary value): at h = min(h_prompt, 10^(floor(log10|v|) - 1)),
    h_prompt = 10^-prompt_decimals, that is max(prompt_decimals, 1 - floor(log10|v|)) decimals."""
    decimals = prompt_decimals if value == 0 else max(prompt_decimals, 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def _forcing(model, period, offset):
    from transformers import LogitsProcessor, LogitsProcessorList

    num = model.config.num_token_id

    class NumbersEvery(LogitsProcessor):
        def __call__(self, input_ids, scores):
            if input_ids.shape[1] % period == offset:
                scores = torch.full_like(scores, -float("inf"))
                scores[:, num] = 0.0
            return scores

    return LogitsProcessorList([NumbersEvery()])


def _collecting_streamer(tok, **kwargs):
    from causalqwen.integrations.streamer import NumericTextStreamer

    class Collecting(NumericTextStreamer):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.parts = []

        def on_finalized_text(self, text, stream_end=False):
            self.parts.append(text)

    return Collecting(tok, **kwargs)


@pytest.mark.parametrize("mode", ["standard", "causal"])
@pytest.mark.parametrize("period, offset", [(2, 0), (2, 1), (3, 1)])
def test_the_streamer_writes_the_generated_numbers_as_decode_and_the_pipeline(tiny, mode, period, offset, capsys):
    """The streamed text, piece by piece, is the continuation `decode` writes from the values of the same call
    (with a space in front where its first number would run into the prompt), and what the pipeline returns: with
    ``number_resolution=None``, every float32 digit; by default, at the prompt's resolution (its "12.50": to the
    cent, as Python's own ``f"{value:.2f}"`` writes the float32 value)."""
    from transformers import pipeline

    from causalqwen.integrations.pipelines import NumericTextGenerationPipeline
    from causalqwen.integrations.streamer import NumericTextStreamer
    from causalqwen.numbers import find_numbers

    model, tok = tiny
    enc = tok([STREAM_PROMPT])
    width = enc["input_ids"].shape[1]
    kwargs = dict(mode=mode, max_new_tokens=10, logits_processor=_forcing(model, period, offset))
    streamer = _collecting_streamer(tok, skip_prompt=True, number_resolution=None)
    out = model.generate(
        **enc, streamer=streamer, return_dict_in_generate=True, generator=torch.Generator().manual_seed(1), **kwargs
    )
    new_ids, new_values = out.sequences[0, width:], out.numeric_values[0, width:]
    generated = new_values[new_ids == model.config.num_token_id].tolist()
    assert len(generated) >= 3  # numbers were generated
    streamed = "".join(streamer.parts)
    alone = tok.decode(new_ids, new_values, out_of_vocab="mark")
    assert streamed == alone or (streamed == " " + alone and new_ids[0] == model.config.num_token_id)
    assert "<NUM>" not in streamed and len(streamer.parts) >= 2  # written as it came, not all at the end
    pipe = pipeline("text-generation", model=model, tokenizer=tok, pipeline_class=NumericTextGenerationPipeline)
    record = pipe(STREAM_PROMPT, generator=torch.Generator().manual_seed(1), number_resolution=None, **kwargs)[0]
    assert record["generated_text"] == STREAM_PROMPT + streamed
    # by default: at the prompt's resolution, the same text from the streamer and the pipeline
    cents = _collecting_streamer(tok, skip_prompt=True)
    model.generate(
        **enc, number_texts=enc.number_texts, streamer=cents, generator=torch.Generator().manual_seed(1), **kwargs
    )
    record = pipe(STREAM_PROMPT, generator=torch.Generator().manual_seed(1), **kwargs)[0]
    assert record["generated_text"] == STREAM_PROMPT + "".join(cents.parts)
    marks = re.compile(r"<unk:\d+>")  # an untrained model's reserved rows, written with their ids
    written = [number.text for number in find_numbers(marks.sub(" ", "".join(cents.parts)))]
    assert written == [written_by_the_prompt_rule(value, prompt_decimals=2) for value in generated]
    # printed to stdout by default, the prompt first as it was written ("12.50"); reusable for the next call
    printing = NumericTextStreamer(tok)
    for _ in range(2):
        again = model.generate(
            **enc,
            number_texts=enc.number_texts,
            streamer=printing,
            generator=torch.Generator().manual_seed(1),
            **kwargs,
        )
        assert torch.equal(again, out.sequences)
        printed = capsys.readouterr().out
        assert printed == STREAM_PROMPT + "".join(cents.parts) + "\n"


def test_the_streamer_refuses_a_batch_and_a_foreign_caller(tiny):
    from causalqwen.integrations.streamer import NumericTextStreamer

    model, tok = tiny
    enc = tok(["hello", "on day 3 we counted 41 birds"], padding_side="left")
    with pytest.raises(ValueError, match="batch size 1 only"):
        model.generate(**enc, streamer=NumericTextStreamer(tok), max_new_tokens=2)
    with pytest.raises(RuntimeError, match="has no values to read"):
        NumericTextStreamer(tok).put(torch.tensor([[1, 2]]))
    with pytest.raises(TypeError, match="needs a NumericTokenizer"):
        NumericTextStreamer(tok.hf_tokenizer)


def test_the_streamer_reads_a_value_the_state_holds_or_has_just_chosen(tiny):
    """transformers hands a token to the streamer right after choosing it (its value is then the step's loc_Y) or,
    where it defers its stop test, one step late (the state then holds the value already): both are read."""
    from causalqwen.integrations.generation_mixin import GenerationState
    from causalqwen.integrations.streamer import NumericTextStreamer

    model, tok = tiny
    num = model.config.num_token_id
    state = GenerationState("standard", torch.tensor([[0.0, 7.25]]), {}, num)
    state.last_loc_Y = torch.tensor([3.5])
    streamer = NumericTextStreamer(tok)
    streamer.attach_generation_state(state)
    assert streamer.values_of([5, num], 0) == [0.0, 7.25]  # held: the prompt, or a token given one step late
    assert streamer.values_of([num], 2) == [3.5] and streamer.values_of([5], 2) == [0.0]  # just chosen


def test_decode_takes_one_id_as_transformers_does():
    """``decode(id)``: one id is a row of one; a ``<NUM>`` with its value writes the value, without it ``<NUM>``."""
    from causalqwen import NumericTokenizer
    from causalqwen.app.tiny import build_tiny_tokenizer

    tokenizer = NumericTokenizer(build_tiny_tokenizer())
    (token,) = tokenizer.encode("a")[0]
    assert tokenizer.decode(token) == tokenizer.decode([token]) == "a"
    assert tokenizer.decode(tokenizer.num_token_id) == "<NUM>"
    assert tokenizer.decode(tokenizer.num_token_id, 2.5) == "2.5"


# ---------------------------------------------------------------------------------------------
# One text, as transformers returns it; decode of a batch; tokenize
# ---------------------------------------------------------------------------------------------

PLAIN = ["It costs dollars.", "价格是元", "a"]  # texts without numbers: the wrapped tokenizer is the oracle


def test_one_text_gives_lists_as_transformers_gives_them(tiny):
    """``tok("one text")``: flat lists, as the wrapped transformers tokenizer returns for one text; tensors
    ``[1, S]`` where ``return_tensors`` asks for them; a list of texts keeps tensors by default."""
    _, tok = tiny
    for text in PLAIN:
        theirs = tok.hf_tokenizer(text)
        ours = tok(text)
        assert ours["input_ids"] == theirs["input_ids"] and ours["attention_mask"] == theirs["attention_mask"]
        assert ours["numeric_values"] == [0.0] * len(theirs["input_ids"]) and ours.number_texts == []
        for asked in ("pt", "np"):
            assert (
                tok(text, return_tensors=asked)["input_ids"].tolist()
                == tok.hf_tokenizer(text, return_tensors=asked)["input_ids"].tolist()
            )
    one = tok("It costs 12.50 dollars, not 3.")
    ids, values, texts = tok.encode("It costs 12.50 dollars, not 3.", return_number_texts=True)
    assert one["input_ids"] == ids and one["numeric_values"] == values and one.number_texts == texts == ["12.50", "3"]
    assert all(type(token) is int for token in one["input_ids"]) and all(
        type(v) is float for v in one["numeric_values"]
    )
    assert tok("It costs 12.50 dollars, not 3.", return_tensors=None)["input_ids"] == ids  # None said: the same
    assert (
        tok.decode(one["input_ids"], one["numeric_values"], number_texts=one.number_texts)
        == "It costs 12.50 dollars, not 3."
    )
    assert tok.batch_decode(one) == ["It costs 12.50 dollars, not 3."]  # a batch of one, as transformers'
    wide = tok("x 1", padding="max_length", max_length=6, padding_side="right", return_attention_mask=False)
    assert wide["input_ids"] == tok.encode("x 1")[0] + [tok.pad_token_id] * 3 and "attention_mask" not in wide
    assert isinstance(tok(["x 1"])["input_ids"], torch.Tensor)  # a list of texts: tensors (D15)


def test_one_text_rows_go_through_datasets_map_and_the_stock_collator(tiny):
    """``dataset.map(lambda row: tok(row["text"]))`` stores rows of lists; transformers' own
    ``DataCollatorWithPadding`` pads them, values included, as the tokenizer pads the same texts."""
    from datasets import Dataset

    _, tok = tiny
    texts = ["It costs 12.50 dollars.", "Add 37 and 5.", "no number here at all"]
    dataset = Dataset.from_dict({"text": texts}).map(lambda row: tok(row["text"]), remove_columns=["text"])
    assert dataset.column_names == ["input_ids", "numeric_values", "attention_mask"]
    assert dataset[0]["input_ids"] == tok.encode(texts[0])[0]
    batch = DataCollatorWithPadding(tok)([dataset[index] for index in range(3)])
    expected = tok(texts)
    for key in expected:
        assert torch.equal(batch[key], expected[key]), key
    assert tok.batch_decode(batch, number_texts=expected.number_texts) == texts


def test_decode_of_a_batch_gives_one_text_per_row_as_transformers(tiny):
    """transformers' ``decode`` of a 2-D input (a [1, S] tensor, a list of rows) returns one text per row: so does
    ours, with the values given in the same shape, and ``batch_decode`` of one row gives a list of one text."""
    _, tok = tiny
    plain = tok(PLAIN[:1], return_tensors="pt")
    theirs = tok.hf_tokenizer.decode(plain["input_ids"], skip_special_tokens=True)
    assert isinstance(theirs, list) and tok.decode(plain["input_ids"]) == theirs == PLAIN[:1]
    enc = tok(TEXTS, return_tensors="pt", padding=True, padding_side="right")
    rows = [tok.decode(enc["input_ids"][b], enc["numeric_values"][b]) for b in range(2)]
    assert rows == TEXTS
    assert tok.decode(enc["input_ids"], enc["numeric_values"]) == TEXTS
    assert tok.decode(enc["input_ids"].tolist(), enc["numeric_values"].tolist()) == TEXTS
    assert tok.decode(enc["input_ids"][:1], enc["numeric_values"][:1]) == TEXTS[:1]
    assert tok.decode(enc["input_ids"].numpy(), enc["numeric_values"].numpy()) == TEXTS
    assert tok.decode(enc["input_ids"]) == ["It costs <NUM> dollars.", "Add <NUM> and <NUM>."]  # plain ids
    written = tok(["It was 12.50 and"], return_tensors="pt")
    assert tok.decode(written["input_ids"], written["numeric_values"], number_texts=written.number_texts) == [
        "It was 12.50 and"
    ]
    assert tok.batch_decode(enc["input_ids"][0], enc["numeric_values"][0]) == TEXTS[:1]  # one row: a list of one
    assert tok.batch_decode(enc["input_ids"][0].tolist(), enc["numeric_values"][0].tolist()) == TEXTS[:1]
    assert tok.batch_decode([]) == [] and tok.batch_decode(torch.zeros(0, 3, dtype=torch.long)) == []
    assert tok.decode([]) == ""


@pytest.mark.parametrize(
    "ids, values, match",
    [
        (torch.tensor([[1, 2]]), [0.0, 0.0], "input_ids is a batch of 1 rows but numeric_values is not"),
        ([[1, 2], [3, 4]], torch.zeros(2), "input_ids is a batch of 2 rows but numeric_values is not"),
        (torch.tensor([1, 2]), torch.zeros(1, 2), "numeric_values must be 1-D"),
        (torch.ones(1, 1, 2, dtype=torch.long), torch.zeros(1, 1, 2), "input_ids must be 2-D"),
        ([[1, 2], [3]], [[0.0, 0.0], [0.0, 0.0]], "row 1: input_ids has length 1 but numeric_values has length 2"),
    ],
)
def test_decode_names_a_batch_whose_values_do_not_fit(tiny, ids, values, match):
    _, tok = tiny
    with pytest.raises(ValueError, match=match):
        tok.decode(ids, values)


def test_decode_of_a_batch_names_number_texts_given_for_one_row(tiny):
    _, tok = tiny
    enc = tok(["It was 12.50 and"])
    with pytest.raises(TypeError, match=r"number_texts of a batch holds one list of str per row .*'12.50'"):
        tok.decode(enc["input_ids"], enc["numeric_values"], number_texts=["12.50"])


def test_tokenize_gives_the_token_strings_with_the_number_token(tiny):
    """Text without numbers: the wrapped tokenizer's own ``tokenize``; each number: one ``<NUM>``, between the
    tokens the wrapped tokenizer gives the pieces around it."""
    _, tok = tiny
    for text in PLAIN + ["  spaces\tand\nlines ", "mixed 中文 and English"]:
        assert tok.tokenize(text) == tok.hf_tokenizer.tokenize(text)
    hf = tok.hf_tokenizer
    assert tok.tokenize("It costs 12.50 dollars") == hf.tokenize("It costs ") + ["<NUM>"] + hf.tokenize(" dollars")
    assert tok.tokenize("价格是99.9元") == hf.tokenize("价格是") + ["<NUM>"] + hf.tokenize("元")
    assert tok.tokenize("") == [] and tok.tokenize("1 2") == ["<NUM>", hf.tokenize(" ")[0], "<NUM>"]
    assert tok.convert_tokens_to_ids(tok.tokenize("It costs 12.50 dollars")) == tok.encode("It costs 12.50 dollars")[0]
    with pytest.raises(TypeError, match="must be a str"):
        tok.tokenize(["a list"])
    with pytest.raises(TypeError, match="unexpected keyword argument 'add_special_tokens'"):
        tok.tokenize("a", add_special_tokens=True)


# ---------------------------------------------------------------------------------------------
# The encoding rebuilt from a plain mapping (transformers' Trainer moves batches so)
# ---------------------------------------------------------------------------------------------


def test_the_encoding_is_rebuilt_from_a_plain_mapping_and_copied_with_its_texts(tiny):
    import copy

    from causalqwen import NumericEncoding

    _, tok = tiny
    enc = tok(["It costs 12.50 dollars.", "Add 37 and 5."])
    rebuilt = type(enc)({key: value for key, value in enc.items()})  # what Trainer._prepare_input does
    assert isinstance(rebuilt, NumericEncoding) and rebuilt.number_texts is None
    assert set(rebuilt) == set(enc) and all(torch.equal(rebuilt[key], enc[key]) for key in enc)
    assert tok.batch_decode(rebuilt) == ["It costs 12.5 dollars.", "Add 37 and 5."]  # texts not known: the values
    assert NumericEncoding().keys() == set() and NumericEncoding().number_texts is None
    for copied in (copy.copy(enc), copy.deepcopy(enc)):
        assert copied.number_texts == [["12.50"], ["37", "5"]] and torch.equal(copied["input_ids"], enc["input_ids"])
        assert tok.batch_decode(copied) == ["It costs 12.50 dollars.", "Add 37 and 5."]
    padded = tok.pad([{"input_ids": [5], "numeric_values": [0.0]}])
    assert type(padded)(dict(padded)).keys() == padded.keys()


# ---------------------------------------------------------------------------------------------
# The streamer writes the prompt as it was written
# ---------------------------------------------------------------------------------------------


def _printed_by_the_streamer(model, tok, enc, capsys, generate_texts=None, **streamer_kwargs):
    """What a `NumericTextStreamer` built with ``streamer_kwargs`` prints, ``generate_texts`` given to ``generate`` as
    its ``number_texts``."""
    from causalqwen.integrations.streamer import NumericTextStreamer

    out = model.generate(
        **enc,
        number_texts=generate_texts,
        streamer=NumericTextStreamer(tok, **streamer_kwargs),
        max_new_tokens=4,
        logits_processor=_forcing(model, 2, 0),
        return_dict_in_generate=True,
    )
    return capsys.readouterr().out, out


def test_the_streamer_writes_the_prompt_as_it_was_written(tiny, capsys):
    """Without ``skip_prompt``: the prompt exactly as given ("12.50", "1e3", "1,000"), then the continuation the
    pipeline writes; whether the prompt was encoded as a list or as one str with tensors."""
    from transformers import pipeline

    from causalqwen.integrations.pipelines import NumericTextGenerationPipeline

    model, tok = tiny
    prompt = "It was 12.50 on 1,000 days of 1e3 hours and"
    pipe = pipeline("text-generation", model=model, tokenizer=tok, pipeline_class=NumericTextGenerationPipeline)
    continuation = pipe(prompt, max_new_tokens=4, logits_processor=_forcing(model, 2, 0), return_full_text=False)[0][
        "generated_text"
    ]
    assert any(character.isdigit() for character in continuation)  # a number was generated
    for enc in (tok([prompt]), tok(prompt, return_tensors="pt")):
        printed, _ = _printed_by_the_streamer(model, tok, enc, capsys, enc.number_texts)
        assert printed == prompt + continuation + "\n"
        printed, _ = _printed_by_the_streamer(model, tok, enc, capsys, None, number_texts=enc.number_texts[0])
        assert printed == prompt + continuation + "\n"


def test_the_streamer_without_the_prompts_texts_asks_for_them_at_the_prompts_resolution(tiny, capsys):
    """A prompt whose numbers' texts are not given (ids and values alone: 12.50 and 12.5 are one value): at
    ``number_resolution="prompt"`` (the default) a ValueError naming ``number_texts``, before anything is printed;
    with ``number_resolution=None`` its numbers in their shortest text; ``number_texts`` given to the streamer or to
    ``generate``: those."""
    model, tok = tiny
    ids, values = tok.encode("It was 12.50 and")
    by_hand = {"input_ids": torch.tensor([ids]), "numeric_values": torch.tensor([values])}
    by_hand["numeric_values"][0, ids.index(tok.num_token_id)] = 7.0
    with pytest.raises(ValueError, match="pass number_texts=enc.number_texts to generate"):
        _printed_by_the_streamer(model, tok, by_hand, capsys)
    assert capsys.readouterr().out == ""
    printed, out = _printed_by_the_streamer(model, tok, by_hand, capsys, number_resolution=None)
    assert printed.startswith("It was 7 and")
    _, continuation = tok.decode_continuation(
        out.sequences[0],
        out.numeric_values[0],
        len(ids),
        out_of_vocab="mark",
        number_texts=["7.000"],
        number_resolution="prompt",
    )
    printed, _ = _printed_by_the_streamer(model, tok, by_hand, capsys, [["7.000"]])
    assert printed == "It was 7.000 and" + continuation + "\n"
    printed, _ = _printed_by_the_streamer(model, tok, by_hand, capsys, None, number_texts=["7.000"])
    assert printed == "It was 7.000 and" + continuation + "\n"


def test_one_prompts_writing_never_decides_anothers(tiny, capsys):
    """ "It was 12.50 and" and "It was 12.5 and" have the same ids and values. Each prompt is streamed as it was
    written, its generated numbers at its own resolution (0.01 after "12.50", 0.1 after "12.5"), whatever was
    encoded in between: the texts travel with the call (``generate``'s ``number_texts``), not in a memory of the
    tokenizer's recent calls."""
    model, tok = tiny
    cents, tenths = tok(["It was 12.50 and"]), tok(["It was 12.5 and"])
    assert torch.equal(cents["input_ids"], tenths["input_ids"])
    assert torch.equal(cents["numeric_values"], tenths["numeric_values"])
    from causalqwen.numbers import find_numbers

    width = cents["input_ids"].shape[1]
    printed = {}
    for enc, decimals in ((cents, 2), (tenths, 1), (cents, 2)):
        text, out = _printed_by_the_streamer(model, tok, enc, capsys, enc.number_texts)
        prompt, continuation = tok.decode_continuation(
            out.sequences[0],
            out.numeric_values[0],
            enc["input_ids"].shape[1],
            out_of_vocab="mark",
            number_texts=enc.number_texts[0],
            number_resolution="prompt",
        )
        assert text == prompt + continuation + "\n"
        printed[enc.number_texts[0][0]] = text
        assert tok.batch_decode(out, out_of_vocab="mark", number_resolution="prompt")[0] == prompt + continuation
        new_ids, new_values = out.sequences[0, width:], out.numeric_values[0, width:]
        generated = new_values[new_ids == model.config.num_token_id].tolist()
        written = [number.text for number in find_numbers(re.sub(r"<unk:\d+>", " ", continuation))]
        assert generated and written == [written_by_the_prompt_rule(v, prompt_decimals=decimals) for v in generated]
    assert printed["12.50"].startswith("It was 12.50 and") and printed["12.5"].startswith("It was 12.5 and")
    assert not hasattr(tok, "number_texts_seen")


@pytest.mark.parametrize("pair", ["b 6", ["b 6"]])
def test_a_text_pair_in_transformers_positional_form_is_named(pair):
    """``tok("a 5", "b 6")``, transformers' text_pair habit: the second positional argument is padding here, and the
    error says that text pairs are not supported."""
    tok = NumericTokenizer(build_tiny_tokenizer())
    with pytest.raises(ValueError, match=r"padding must be one of .*text pairs, transformers' text_pair, are not"):
        tok("a 5", pair)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"number_resolution": 0.5}, ValueError, "number_resolution"),
        ({"number_resolution": "prompts"}, ValueError, "number_resolution"),
        ({"out_of_vocab": "skip"}, ValueError, "out_of_vocab"),
        ({"skip_special_tokens": "yes"}, TypeError, "skip_special_tokens"),
        ({"skip_prompt": 1}, TypeError, "skip_prompt"),
        ({"number_texts": "12.50"}, TypeError, "number_texts"),
        ({"number_texts": [12.5]}, TypeError, "number_texts"),
        ({"numbers_texts": ["12.50"]}, TypeError, "numbers_texts"),
    ],
)
def test_the_streamers_arguments_are_checked_when_it_is_built(tiny, kwargs, error, match):
    """A streamer argument that could not work is named when the streamer is built, before any prompt is run."""
    from causalqwen.integrations.streamer import NumericTextStreamer

    _, tok = tiny
    with pytest.raises(error, match=match):
        NumericTextStreamer(tok, **kwargs)


def test_generate_checks_the_number_texts_it_carries(tiny):
    """``generate``'s ``number_texts``: one list of str per row, as many as the row's <NUM>; the output carries them,
    so ``batch_decode(out)`` writes the prompts as given."""
    model, tok = tiny
    enc = tok(["It was 12.50 and", "no number"], padding_side="left")
    for bad, error, match in (
        ([["12.50"]], ValueError, r"one list of str per prompt row \(2\)"),
        (["12.50", []], TypeError, r"number_texts\[0\] must be a list of str"),
        (
            [["12.50", "3"], []],
            ValueError,
            r"row 0: number_texts holds 2 texts but the prompt \(its first 7 ids\) holds 1 <NUM>",
        ),
    ):
        with pytest.raises(error, match=match):
            model.generate(**enc, number_texts=bad, max_new_tokens=1)
    out = model.generate(**enc, number_texts=enc.number_texts, max_new_tokens=2, return_dict_in_generate=True)
    assert out.number_texts == [["12.50"], []]
    assert tok.batch_decode(out, out_of_vocab="mark", number_resolution="prompt")[0].startswith("It was 12.50 and")
