"""The streamer (`causalqwen.integrations.streamer`): ``NumericTextStreamer`` writes the prompt as it was
written and the generated numbers as ``decode`` and the pipeline write them, one prompt's writing never deciding
another's; its arguments are checked when it is built.

The oracles: the tokenizer's own ``decode_continuation`` of the same generation, and the prompt's text.
"""

import math
import re

import pytest
import torch

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
