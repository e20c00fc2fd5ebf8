"""Trust boundaries of generation: the pipeline and ``generate`` accept anything the model itself can
generate, and every bad input is refused once, at its door, by name.

The oracles: the reference loop `causalqwen.generate` (ids and values), the prompt exactly as the user wrote it,
and texts written out by hand.
"""

import copy
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from transformers import pipeline

from causalqwen import NumericTokenizer, generate
from causalqwen.app import cli, commands
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.float32 import format_number
from causalqwen.integrations.pipelines import NumericTextGenerationPipeline


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    return model.eval(), tokenizer


def _biased(model, token_id):
    """A copy of ``model`` that chooses ``token_id`` at every step (in every mode)."""
    biased = copy.deepcopy(model)
    with torch.no_grad():
        biased.action.classification_head.bias[token_id] = 1e4
    return biased


@pytest.fixture(scope="module")
def models(tiny):
    """The plain tiny model, one that writes the digit 7 at every step, and one that writes a number at every step."""
    model, tokenizer = tiny
    seven = tokenizer.hf_tokenizer.convert_tokens_to_ids("7")
    return {"plain": model, "digits": _biased(model, seven), "numbers": _biased(model, model.config.num_token_id)}


def _pipe(model, tokenizer):
    return pipeline("text-generation", model=model, tokenizer=tokenizer, pipeline_class=NumericTextGenerationPipeline)


@pytest.fixture(scope="module")
def pipes(tiny, models):
    return {name: _pipe(model, tiny[1]) for name, model in models.items()}


# ---------------------------------------------------------------------------------------------
# 1. A prompt's number as written, and what the model writes after it
# ---------------------------------------------------------------------------------------------


def test_a_digit_after_the_prompts_number_stays_a_separate_token(tiny, pipes):
    _, tokenizer = tiny
    pipe = pipes["digits"]
    assert pipe("The total is 5", max_new_tokens=2)[0]["generated_text"] == "The total is 5 77"
    assert pipe("The total is 5", max_new_tokens=2, return_full_text=False)[0]["generated_text"] == " 77"
    ids, values, texts = tokenizer.encode("The total is 5", return_number_texts=True)
    seven = tokenizer.hf_tokenizer.convert_tokens_to_ids("7")
    assert tokenizer.decode(ids + [seven, seven], values + [0.0, 0.0], number_texts=texts) == "The total is 5 77"
    assert tokenizer.decode_continuation(ids + [seven], values + [0.0], len(ids), number_texts=texts) == (
        "The total is 5",
        " 7",
    )


def test_a_generated_number_after_the_prompts_number(tiny, models, pipes):
    """Each generated number is written with one space before it; the prompt's "5" stays where it was."""
    _, tokenizer = tiny
    prompt = "The total is 5"
    record = pipes["numbers"](prompt, max_new_tokens=3, number_resolution=None)[0]  # every float32 digit
    batch = tokenizer([prompt])
    reference = generate(models["numbers"], batch["input_ids"], batch["numeric_values"], max_new_tokens=3)
    assert record["numeric_values"] == reference.numeric_values[0].tolist()
    generated = reference.numeric_values[0, -3:].tolist()
    assert record["generated_text"] == prompt + "".join(" " + format_number(value) for value in generated)


def test_a_prompt_ending_in_a_date_like_run_keeps_its_numbers_as_written(tiny):
    """2020-2021 read as two numbers; a generated "-2022" would make the three runs one identifier: the space goes
    between the prompt and what was generated, never inside the prompt."""
    _, tokenizer = tiny
    ids, values, texts = tokenizer.encode("from 2020-2021", return_number_texts=True)
    dash = tokenizer.hf_tokenizer.encode("-", add_special_tokens=False)
    tail = tokenizer.hf_tokenizer.encode("2022", add_special_tokens=False)
    whole = ids + dash + tail
    assert tokenizer.decode_continuation(
        whole, values + [0.0] * (len(dash) + len(tail)), len(ids), number_texts=texts
    ) == ("from 2020-2021", " -2022")


_PRICE = "The price is 12.50 yuan, up 3% from"  # two numbers: 12.50 and 3


def test_number_texts_name_exactly_the_prompts_numbers_at_every_door(tiny, models):
    """Too few texts would write the prompt's later numbers as generated ones (12.50 as 12, 3% as 3.00%), too many
    would take a generated number for the prompt's: both are refused wherever the prompt's end is known, naming the
    row, the count given and the count needed; the streamer refuses them as the prompt arrives, before any step."""
    _, tokenizer = tiny
    model = models["numbers"]
    from causalqwen import NumericTextStreamer

    enc = tokenizer([_PRICE], return_tensors="pt")
    width = enc["input_ids"].shape[1]
    out = model.generate(**enc, max_new_tokens=3, return_dict_in_generate=True)
    loop = generate(model, enc["input_ids"], enc["numeric_values"], enc["attention_mask"], max_new_tokens=3)
    first_generated = format_number(float(out.numeric_values[0, width]))  # reads as the first generated value
    assert tokenizer.batch_decode(out, number_texts=enc.number_texts, number_resolution="prompt")[0].startswith(
        "The price is 12.50 yuan, up 3% from "
    )
    steps = []
    hook = model.register_forward_hook(lambda *_: steps.append(1))
    for texts in ([], ["12.50"], ["12.50", "3", first_generated]):
        needed = rf"holds {len(texts)} texts but the prompt \(its first {width} ids\) holds 2 <NUM>"
        for output in (out, loop):
            with pytest.raises(ValueError, match="row 0: number_texts " + needed):
                tokenizer.batch_decode(output, number_texts=[texts], number_resolution="prompt")
        with pytest.raises(ValueError, match="number_texts " + needed):
            tokenizer.decode_continuation(
                out.sequences[0], out.numeric_values[0], width, number_texts=texts, number_resolution="prompt"
            )
        with pytest.raises(ValueError, match="row 0: number_texts " + needed):
            model.generate(**enc, number_texts=[texts], max_new_tokens=1)
        for skip_prompt in (False, True):
            with pytest.raises(ValueError, match="row 0: number_texts " + needed):
                model.generate(**enc, streamer=NumericTextStreamer(tokenizer, skip_prompt, number_texts=texts))
    hook.remove()
    assert steps == []  # every refusal came before the model's first step


@pytest.mark.parametrize(
    "texts, error, pattern",
    [
        (["abc", "3"], ValueError, r"number_texts\[0\] = 'abc' is not a number text"),
        (["12.50", "3 4"], ValueError, r"number_texts\[1\] = '3 4' is not a number text"),
        (["12.50", "12345678901"], ValueError, r"number_texts\[1\] = '12345678901' is not a number text"),
        (["12.50", 3], TypeError, r"number_texts\[1\] must be a str, got int 3"),
        ("12.50", TypeError, r"number_texts must be a list of str.*got '12.50'"),
    ],
)
def test_a_number_text_is_one_number_of_the_grammar_at_every_door(tiny, texts, error, pattern):
    """One check wherever number_texts enter: the streamer when it is built, generate before it starts, decode."""
    model, tokenizer = tiny
    from causalqwen import NumericTextStreamer

    enc = tokenizer([_PRICE], return_tensors="pt")
    with pytest.raises(error, match=pattern):
        NumericTextStreamer(tokenizer, number_texts=texts)
    with pytest.raises(error, match=pattern.replace("number_texts", r"number_texts\[0\]", 1)):
        model.generate(**enc, number_texts=[texts], max_new_tokens=1)
    with pytest.raises(error, match=pattern):
        tokenizer.decode(enc["input_ids"][0], enc["numeric_values"][0], number_texts=texts)


# Token ids the model can produce: ordinary text, digits, special tokens, <NUM> with any float32 value, and the
# reserved rows of the head beyond the tokenizer.
_FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def generated_rows(draw, tokenizer, vocab_size):
    num = tokenizer.num_token_id
    digits = [tokenizer.hf_tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    specials = list(tokenizer.hf_tokenizer.all_special_ids)
    kinds = st.sampled_from(["text", "digit", "number", "special", "reserved"])
    ids, values = [], []
    for kind in draw(st.lists(kinds, min_size=1, max_size=10)):
        if kind == "number":
            ids.append(num)
            values.append(draw(_FLOAT32))
            continue
        if kind == "text":
            token = draw(st.integers(0, len(tokenizer) - 1).filter(lambda i: i != num and i not in specials))
        elif kind == "digit":
            token = draw(st.sampled_from(digits))
        elif kind == "special":
            token = draw(st.sampled_from(specials))
        else:
            token = draw(st.integers(len(tokenizer), vocab_size - 1))
        ids.append(token)
        values.append(0.0)
    return ids, values


def _is_subsequence(needles, haystack):
    it = iter(haystack)
    return all(any(value == other for other in it) for value in needles)


@given(data=st.data())
def test_whatever_the_model_generates_decodes_and_works_as_a_prompt(tiny, models, pipes, data):
    """Random output of the model -- words, digits right after numbers, special tokens, <NUM> with any float32 value,
    reserved rows -- decodes (every generated number reads back as its value), works as a prompt of the pipeline
    (kept exactly as given, the continuation that of the reference loop) and, as ids, of model.generate."""
    model, tokenizer = tiny
    ids, values = data.draw(generated_rows(tokenizer, model.config.vocab_size))
    chooser = data.draw(st.sampled_from(sorted(models)))
    text = tokenizer.decode(ids, values, out_of_vocab="mark")
    written = [float(np.float32(v)) for i, v in zip(ids, values) if i == tokenizer.num_token_id]
    read_back = [v for i, v in zip(*tokenizer.encode(text)) if i == tokenizer.num_token_id]
    assert _is_subsequence(written, read_back)

    # as a prompt of the pipeline
    assume(text != "")
    record = pipes[chooser](text, max_new_tokens=2)[0]
    batch = tokenizer([text])
    reference = generate(models[chooser], batch["input_ids"], batch["numeric_values"], max_new_tokens=2)
    assert record["numeric_values"] == reference.numeric_values[0].tolist()
    prompt, continuation = tokenizer.decode_continuation(
        reference.sequences[0],
        reference.numeric_values[0],
        batch["input_ids"].shape[1],
        out_of_vocab="mark",
        number_texts=batch.number_texts[0],
        number_resolution="prompt",
    )  # the pipeline's default
    assert prompt == text and record["generated_text"] == text + continuation

    # as ids of model.generate
    input_ids, numeric_values = torch.tensor([ids]), torch.tensor([values])
    out = models[chooser].generate(
        input_ids, numeric_values=numeric_values, max_new_tokens=2, return_dict_in_generate=True
    )
    reference = generate(models[chooser], input_ids, numeric_values, max_new_tokens=2)
    assert torch.equal(out.sequences, reference.sequences)
    assert torch.equal(out.numeric_values, reference.numeric_values)
    head, _ = tokenizer.decode_continuation(out.sequences[0], out.numeric_values[0], len(ids), out_of_vocab="mark")
    assert head == tokenizer.decode(ids, values, out_of_vocab="mark")


# ---------------------------------------------------------------------------------------------
# 2. A tokenizer whose <NUM> is not the model's
# ---------------------------------------------------------------------------------------------


def test_the_pipeline_refuses_a_tokenizer_with_another_num_token(tiny, tmp_path):
    model, tokenizer = tiny
    other = NumericTokenizer(copy.deepcopy(tokenizer.hf_tokenizer), num_token="<QTY>")  # added beside <NUM>: id 604
    with pytest.raises(ValueError, match=r"<NUM> id \(604\) differs from the model's num_token_id \(603\)"):
        _pipe(model, other)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"num_token": "<QTY>"}))
    with pytest.raises(ValueError, match=r"differs from the model's num_token_id \(603\)"):
        pipeline("text-generation", model=str(tmp_path), trust_remote_code=True)


# ---------------------------------------------------------------------------------------------
# 3. An empty prompt, alone or in a batch, at every door
# ---------------------------------------------------------------------------------------------


def test_an_empty_prompt_is_named_at_every_door(tiny, pipes, capsys):
    model, tokenizer = tiny
    pipe = pipes["plain"]
    with pytest.raises(ValueError, match="the prompt is empty"):
        pipe("", max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        pipe(["hi", ""], max_new_tokens=2, batch_size=2)
    alone, pair = tokenizer([""]), tokenizer(["hi", ""], padding_side="left")
    for batch, pattern in ((alone, "prompt 0 is empty"), (pair, "prompt 1 is empty")):
        with pytest.raises(ValueError, match=pattern):
            generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], max_new_tokens=2)
        with pytest.raises(ValueError, match=pattern):
            model.generate(
                batch["input_ids"],
                numeric_values=batch["numeric_values"],
                attention_mask=batch["attention_mask"],
                max_new_tokens=2,
            )
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "--prompt", "hi", "--prompt", "", "--max-new-tokens", "2"])
    assert exit_info.value.code == 2 and "prompt 1 is empty" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# 4. model.generate's door
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, error, pattern",
    [
        (
            lambda b: {"numeric_values": b["numeric_values"][:, :1]},
            ValueError,
            r"numeric_values shape \(1, 1\) must equal input_ids shape \(1, 7\)",
        ),
        (
            lambda b: {"numeric_values": b["numeric_values"].tolist()},
            TypeError,
            "numeric_values must be a torch.Tensor",
        ),
        (lambda b: {"numeric_values": b["numeric_values"].bool()}, TypeError, "numeric_values must hold real numbers"),
        (lambda b: {"labels": b["input_ids"]}, TypeError, "generate.. does not take labels"),
        (
            lambda b: {"max_new_tokens": 10**9},
            ValueError,
            r"prompt \(7 tokens\) \+ max_new_tokens \(1000000000\) exceeds max_position_embeddings=2048",
        ),
        (lambda b: {"max_new_tokens": None, "max_length": 4000}, ValueError, "exceeds max_position_embeddings=2048"),
        (
            lambda b: {"attention_mask": b["attention_mask"].tolist()},
            TypeError,
            "attention_mask must be a torch.Tensor of 0s and 1s, got list",
        ),
    ],
)
def test_model_generate_refuses_bad_arguments_by_name(tiny, change, error, pattern):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])
    arguments = {"numeric_values": batch["numeric_values"], "max_new_tokens": 2} | change(batch)
    with pytest.raises(error, match=pattern):
        model.generate(batch["input_ids"], **{k: v for k, v in arguments.items() if v is not None})


def test_the_reference_loop_refuses_a_list_mask_like_model_generate(tiny):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])
    with pytest.raises(TypeError, match="attention_mask must be a torch.Tensor of 0s and 1s, got list"):
        generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"].tolist())


@pytest.mark.parametrize("top_p", [1e-12, 1e-50, 5e-324])
def test_a_tiny_top_p_keeps_the_most_probable_token(tiny, top_p):
    """In a float16 model 1e-12 is 0: the nucleus must still keep its first class, so a tiny top_p is greedy."""
    model, tokenizer = tiny
    half = copy.deepcopy(model).to(torch.float16)
    batch = tokenizer(["The total is 5", "hi"], padding_side="left")
    args = (half, batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    for normalize in ("softmax", "ovr"):
        greedy = generate(*args, mode="traditional", top_k=1, normalize=normalize, max_new_tokens=4)
        nucleus = generate(
            *args,
            mode="traditional",
            top_p=top_p,
            normalize=normalize,
            max_new_tokens=4,
            generator=torch.Generator().manual_seed(0),
        )
        assert torch.equal(nucleus.sequences, greedy.sequences)
    sampled = half.generate(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        attention_mask=batch["attention_mask"],
        mode="traditional",
        do_sample=True,
        top_p=top_p,
        max_new_tokens=4,
    )
    assert torch.equal(sampled, generate(*args, mode="traditional", top_k=1, max_new_tokens=4).sequences)


# ---------------------------------------------------------------------------------------------
# 5. forward's door: ids of a narrow type, meta tensors, positions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, error, pattern",
    [
        (
            lambda b: {"input_ids": b["input_ids"].to(torch.uint8)},
            TypeError,
            r"input_ids must be an int64 or int32 tensor \(the index types of the embedding\), got torch.uint8",
        ),
        (lambda b: {"input_ids": b["input_ids"].to(torch.int16)}, TypeError, "got torch.int16"),
        (lambda b: {"input_ids": b["input_ids"].to("meta")}, ValueError, "input_ids is a meta tensor"),
        (lambda b: {"numeric_values": b["numeric_values"].to("meta")}, ValueError, "numeric_values is a meta tensor"),
        (lambda b: {"attention_mask": b["attention_mask"].to("meta")}, ValueError, "attention_mask is a meta tensor"),
        (
            lambda b: {"position_ids": torch.arange(7)[None] + 10**6},
            ValueError,
            r"position_ids must lie in \[0, max_position_embeddings=2048\); found 1000000 at position \[0, 0\]",
        ),
        (
            lambda b: {"position_ids": torch.arange(7)[None] - 2},
            ValueError,
            r"position_ids must lie in \[0, max_position_embeddings=2048\); found -2 at position \[0, 0\]",
        ),
        (
            lambda b: {"position_ids": torch.arange(7)[None] + 0.5},
            TypeError,
            "position_ids must be an integer tensor, got torch.float32",
        ),
        (lambda b: {"position_ids": torch.arange(7).to("meta")[None]}, ValueError, "position_ids is a meta tensor"),
    ],
)
def test_forward_refuses_ids_and_positions_it_cannot_use(tiny, change, error, pattern):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])
    arguments = dict(batch) | change(batch)
    with pytest.raises(error, match=pattern):
        model(**arguments)
    with pytest.raises(error, match=pattern):
        model.abduce(**arguments)


def test_forward_takes_positions_up_to_the_last_one(tiny):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])
    limit = model.config.max_position_embeddings
    last = torch.arange(limit - 7, limit)[None]
    with torch.no_grad():
        shifted = model(**batch, position_ids=last).loc_S
        as_int32 = model(batch["input_ids"].int(), batch["numeric_values"], position_ids=last.int()).loc_S
    assert torch.equal(shifted, as_int32) and not torch.equal(shifted, model(**batch).loc_S)


# ---------------------------------------------------------------------------------------------
# 6-7. A <NUM> target without a value, values that float32 turns into 0
# ---------------------------------------------------------------------------------------------


def test_a_num_label_over_a_word_needs_its_value(tiny):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])  # seven tokens of the tiny vocabulary, the last one <NUM>
    labels = batch["input_ids"].clone()
    labels[0, 2] = model.config.num_token_id  # a <NUM> target where the input is " is": no value beside it
    with pytest.raises(ValueError, match=r"labels put <NUM> at position \[0, 2\], where input_ids is not <NUM>"):
        model(**batch, labels=labels)
    numeric_labels = torch.zeros_like(batch["numeric_values"])
    numeric_labels[0, 2] = 12.5
    out = model(**batch, labels=labels, numeric_labels=numeric_labels)
    moved = model(**batch, labels=labels, numeric_labels=numeric_labels * 4)
    assert int(out.n_reg) == 2 and float(out.reg_loss) != float(moved.reg_loss)  # the value is the target, not 0
    assert float(model(**batch, labels=batch["input_ids"]).n_reg) == 1  # the <NUM> input carries its value


def test_a_numeric_label_beside_a_word_label_is_named(tiny):
    """A value in ``numeric_labels`` where the label is a word is never a target: an error naming its position, as
    the same mistake in ``numeric_values`` is (D4); where the label is ignored (a masked prompt) or padded, the
    value is not read and passes."""
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])  # the last token <NUM>
    labels = batch["input_ids"].clone()
    numeric_labels = batch["numeric_values"].clone()
    numeric_labels[0, 2] = 12.5  # beside the label " is"
    with pytest.raises(
        ValueError, match=r"numeric_labels must be 0 wherever labels is not <NUM> .*12\.5 at position \[0, 2\]"
    ):
        model(**batch, labels=labels, numeric_labels=numeric_labels)
    labels[0, 2] = model.config.ignore_index  # the same value where the label is ignored: not read
    ignored = model(**batch, labels=labels, numeric_labels=numeric_labels)
    assert float(ignored.n_reg) == 1
    padded = tokenizer(["The total is 5", "a"], padding_side="right")
    values = padded["numeric_values"].clone()
    values[1, -1] = 3.0  # a padded position: never scored
    model(**padded, labels=padded["input_ids"], numeric_labels=values)


@pytest.mark.parametrize("name", ["numeric_values", "numeric_labels"])
@pytest.mark.parametrize(
    "value, pattern",
    [
        (1e-50, r"{name} holds 1e-50 at position \[0, 6\], which underflows to 0 in float32"),
        (-1e-46, r"{name} holds -1e-46 at position \[0, 6\], which underflows to 0 in float32"),
        (1e300, r"{name} must be representable in float32 .*found 1e\+300 at position \[0, 6\]"),
    ],
)
def test_float64_values_that_float32_cannot_hold_are_refused(tiny, name, value, pattern):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])
    values = batch["numeric_values"].double()
    values[0, 6] = value
    arguments = dict(batch, labels=batch["input_ids"]) | {name: values}
    pattern = pattern.format(name=name)
    with pytest.raises(ValueError, match=pattern):
        model(**arguments)
    if name == "numeric_values":
        with pytest.raises(ValueError, match=pattern):
            model.generate(batch["input_ids"], numeric_values=values, max_new_tokens=1)
        with pytest.raises(ValueError, match=pattern):
            generate(model, batch["input_ids"], values, max_new_tokens=1)


def test_a_subnormal_float32_value_is_kept(tiny):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])
    values = batch["numeric_values"].double()
    values[0, 6] = 1e-40  # a subnormal float32, not 0
    with torch.no_grad():
        assert torch.equal(model(batch["input_ids"], values).loc_S, model(batch["input_ids"], values.float()).loc_S)


# ---------------------------------------------------------------------------------------------
# 8. The command prints the prompt as written
# ---------------------------------------------------------------------------------------------


def test_the_command_prints_the_prompt_as_written(capsys):
    prompt = "Paid 12.50 for 1,000 items at 3.14159265358979 each"
    assert cli.main(["generate", "--prompt", prompt, "--prompt", "hi", "--max-new-tokens", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    model, tokenizer = commands.load_model_and_tokenizer("tiny", seed=0)
    batch = tokenizer([prompt, "hi"], padding_side="left")
    out = generate(
        model,
        batch["input_ids"],
        batch["numeric_values"],
        batch["attention_mask"],
        max_new_tokens=3,
        generator=torch.Generator().manual_seed(0),
    )
    expected = []
    for row, text in enumerate([prompt, "hi"]):
        keep = out.attention_mask[row].bool()
        length = int(batch["attention_mask"][row].sum())
        head, tail = tokenizer.decode_continuation(
            out.sequences[row][keep],
            out.numeric_values[row][keep],
            length,
            out_of_vocab="mark",
            number_texts=batch.number_texts[row],
        )
        assert head == text
        expected.append(text + tail)
    assert lines == expected and lines[0].startswith(prompt) and lines[0] != prompt


# ---------------------------------------------------------------------------------------------
# 9. Temperatures that float32 turns into 0, transformers' options that would lose the values,
#    a negative id to decode
# ---------------------------------------------------------------------------------------------


def test_a_temperature_float32_holds_as_0_is_greedy_at_every_door(tiny, capsys):
    """1e-46 is 0 in float32: the reference loop, model.generate and the command all give the greedy tokens
    (the maxima of the shifted scores stay 0), never a NaN inside torch's sampler."""
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])
    greedy = generate(model, batch["input_ids"], batch["numeric_values"], mode="traditional", top_k=1, max_new_tokens=2)
    cold = generate(
        model,
        batch["input_ids"],
        batch["numeric_values"],
        mode="traditional",
        temperature=1e-46,
        max_new_tokens=2,
        generator=torch.Generator().manual_seed(0),
    )
    sampled = model.generate(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        mode="traditional",
        do_sample=True,
        temperature=1e-46,
        max_new_tokens=2,
        return_dict_in_generate=True,
    )
    assert torch.equal(cold.sequences, greedy.sequences) and torch.equal(sampled.sequences, greedy.sequences)
    assert (
        cli.main(
            ["generate", "--prompt", "a 1", "--mode", "traditional", "--temperature", "1e-46", "--max-new-tokens", "2"]
        )
        == 0
    )
    assert "a 1" in capsys.readouterr().out


def test_tempered_scores_is_the_softmax_limit_at_any_temperature():
    from causalqwen.inference import tempered_scores

    scores = torch.tensor([[1.0, 3.0, 3.0, -math.inf], [0.5, -2.0, 0.25, 0.0]])
    for temperature in (1e-300, 1e-46, 1e-40):
        probs = torch.softmax(tempered_scores(scores, temperature), dim=-1)
        assert torch.equal(probs, torch.tensor([[0.0, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    for dtype in (torch.float16, torch.bfloat16):  # 1e-8 is 0 in float16
        probs = torch.softmax(tempered_scores(scores.to(dtype), 1e-8).float(), dim=-1)
        assert torch.equal(probs, torch.tensor([[0.0, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    expected = torch.softmax(torch.tensor([[1.0, 3.0, 3.0, -math.inf]], dtype=torch.float64) / 0.7, dim=-1)
    got = torch.softmax(tempered_scores(torch.tensor([[1.0, 3.0, 3.0, -math.inf]], dtype=torch.float64), 0.7), -1)
    assert torch.allclose(got, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("which", ["plain", "numbers"])
@pytest.mark.parametrize("temperature", [1e-300, 1e-40, 1.1754944e-38, 1e-37, 1e-30])
def test_a_tiny_accepted_temperature_is_greedy_on_both_paths(tiny, models, which, temperature):
    """The smallest accepted temperatures act as greedy in the reference loop and in model.generate alike: the
    scores are shifted by their row maximum before transformers divides them (unshifted, a score above
    ~4 * temperature * 1e38 overflows to inf and the softmax gives NaN)."""
    model, tokenizer = models[which], tiny[1]
    batch = tokenizer(["The total is 5", "hi"], padding_side="left")
    args = (model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    greedy = generate(*args, mode="traditional", top_k=1, max_new_tokens=4)
    cold = generate(
        *args, mode="traditional", temperature=temperature, max_new_tokens=4, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(cold.sequences, greedy.sequences)
    sampled = model.generate(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        attention_mask=batch["attention_mask"],
        mode="traditional",
        do_sample=True,
        temperature=temperature,
        max_new_tokens=4,
        return_dict_in_generate=True,
    )
    assert torch.equal(sampled.sequences, greedy.sequences)
    assert torch.equal(sampled.numeric_values, greedy.numeric_values)


def test_the_shifted_temperature_warper_keeps_the_distribution():
    """model.generate's temperature warper subtracts the row maximum first: the same softmax as transformers' own."""
    from transformers.generation.logits_process import TemperatureLogitsWarper

    from causalqwen.integrations.generation_mixin import _ShiftedTemperatureWarper

    scores = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 5
    for temperature in (0.3, 0.7, 2.5):
        shifted = _ShiftedTemperatureWarper(temperature)(None, scores)
        plain = TemperatureLogitsWarper(temperature)(None, scores)
        assert torch.allclose(shifted.softmax(-1), plain.softmax(-1), atol=1e-6)
        assert bool((shifted.amax(-1) == 0).all())


@pytest.mark.parametrize(
    "options, error, pattern",
    [
        (
            {"prompt_lookup_num_tokens": 2},
            ValueError,
            (
                "prompt_lookup_num_tokens is not supported: assisted / speculative decoding and prompt lookup run "
                "the model on candidate tokens it did not choose, which carry no <NUM> values"
            ),
        ),
        ({"assistant_model": "model"}, ValueError, "assistant_model is not supported: assisted / speculative decoding"),
        ({"assistant_early_exit": 1}, ValueError, "assistant_early_exit is not supported"),
        (
            {"stop_strings": ["x"], "tokenizer": "tokenizer"},
            TypeError,
            (
                r"stop_strings need tokenizer to be a transformers PreTrainedTokenizerBase \(transformers reads its "
                r"vocabulary\), got NumericTokenizer: pass tokenizer=tok.hf_tokenizer"
            ),
        ),
        ({"stop_strings": ["x"], "tokenizer": 3}, TypeError, "got int: pass tokenizer=a transformers tokenizer"),
        ({"mode": "causal", "generator": 123}, TypeError, "^generator must be a torch.Generator, got int$"),
        ({"mode": "shared_noise", "generator": "seed"}, TypeError, "^generator must be a torch.Generator, got str$"),
    ],
)
def test_model_generate_refuses_options_that_would_lose_the_values(tiny, options, error, pattern):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])
    named = {"model": model, "tokenizer": tokenizer}
    options = {k: named.get(v, v) if isinstance(v, str) else v for k, v in options.items()}
    with pytest.raises(error, match=pattern):
        model.generate(batch["input_ids"], numeric_values=batch["numeric_values"], max_new_tokens=2, **options)
    if "generator" in options:  # the reference loop says the same
        with pytest.raises(error, match=pattern):
            generate(model, batch["input_ids"], batch["numeric_values"], max_new_tokens=2, **options)


def test_stop_strings_work_with_the_wrapped_tokenizer(tiny, models):
    """With tokenizer=tok.hf_tokenizer transformers' stop strings match the generated tokens' text: the model that
    writes 7 at every step stops after "77", with the reference loop's first two steps."""
    model, tokenizer = models["digits"], tiny[1]
    batch = tokenizer(["The total is 5", "hi"], padding_side="left")
    out = model.generate(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        attention_mask=batch["attention_mask"],
        stop_strings=["77"],
        tokenizer=tokenizer.hf_tokenizer,
        max_new_tokens=6,
    )
    reference = generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], max_new_tokens=6)
    width = batch["input_ids"].shape[1]
    assert out.shape[1] == width + 2 and torch.equal(out, reference.sequences[:, : width + 2])


def test_decoding_a_negative_id_says_mark_does_not_apply(tiny):
    _, tokenizer = tiny
    size = len(tokenizer)
    for out_of_vocab in ("mark", "raise"):
        with pytest.raises(ValueError) as info:
            tokenizer.decode([5, -3], [0.0, 0.0], out_of_vocab=out_of_vocab)
        message = str(info.value)
        assert message.startswith(
            f"input_ids[1] = -3 is not a token id of this tokenizer (0 to {size - 1}): a "
            'negative id is never a model\'s prediction, so out_of_vocab="mark" does not apply'
        )
        assert 'pass out_of_vocab="mark"' not in message
    assert tokenizer.decode([size + 2], [0.0], out_of_vocab="mark") == f"<unk:{size + 2}>"


# ---------------------------------------------------------------------------------------------
# A generated value beyond the model's dtype
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["model.generate", "causalqwen.generate"])
def test_a_generated_value_that_overflows_is_an_error_not_the_next_steps_input(tiny, models, loop):
    """A regression head whose loc_Y overflows float32 (3e38 + 1e37-scaled weights): the value beside the generated
    <NUM> is inf, which no forward would take as input, so neither loop returns it as if it were a number."""
    _, tokenizer = tiny
    model = copy.deepcopy(models["numbers"])
    with torch.no_grad():
        model.action.regression_head.bias.fill_(3e38)
        model.action.regression_head.weight.mul_(1e37)
    prompt = tokenizer(["The population is 1,400,000 and"])
    arguments = dict(mode="causal", max_new_tokens=4, generator=torch.Generator().manual_seed(0))
    message = (
        r"generation made a value that is not finite \((-?inf|nan)\) at row 0, new token \d: loc_Y overflowed the "
        r"model's float32 \(largest finite value 3\.40282e\+38\), and the later steps read it as input"
    )
    with pytest.raises(ValueError, match=message):
        if loop == "model.generate":
            model.generate(**prompt, **arguments)
        else:
            generate(model, prompt["input_ids"], prompt["numeric_values"], prompt["attention_mask"], **arguments)
