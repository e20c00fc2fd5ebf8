"""CausalQwen in EleutherAI's lm-evaluation-harness: the model ``causalqwen`` (issue 31; docs: lm_eval.md).

lm-eval hands a model strings and reads back numbers and strings. `CausalQwenLM` answers its three requests
with CausalQwen's own tokenizer, so every number of a text reaches the model as ``<NUM>`` with its value:

* ``loglikelihood(context, continuation)``: `causalqwen.likelihood.score_continuation`, the continuation's
  log-probability with each number scored as written (the probability of its resolution interval, decision
  D16), and whether greedy decoding gives it;
* ``loglikelihood_rolling(text)``: `causalqwen.likelihood.score_text`, every token of the text;
* ``generate_until(context, {until, max_gen_toks, ...})``: `causalqwen.generate` in the named ``mode``, the text
  decoded with its numbers written out (at ``number_resolution``: by default that of the context's numbers), and
  cut at the first stop string that does not fall inside a number (a ``"."`` stop leaves ``2.5`` whole).

From Python: ``lm_eval.simple_evaluate(model=CausalQwenLM.create_from_arg_string("pretrained=DIR"), tasks=...)``.
From the command line, ``python -m causalqwen.integrations.lm_eval_adapter`` takes lm-eval's own arguments,
``--model causalqwen --model_args pretrained=DIR,mode=standard ...``, and runs lm-eval's CLI with this model
registered. lm-eval is an optional extra: ``pip install -e ".[eval]"``.
"""

from __future__ import annotations

import sys

import torch

try:
    import lm_eval.models  # noqa: F401  lm-eval's own models (hf, ...) register before ours, so both stay available
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError('causalqwen.integrations.lm_eval_adapter needs lm-eval: pip install -e ".[eval]"') from error

from ..generation import generate
from ..inference import check_mode
from ..likelihood import check_token_probability, keep_last, score_continuation, score_text, split_context
from ..numbers import find_numbers
from ..writing import check_resolution

__all__ = ["CausalQwenLM", "cut_at_stop", "main"]


def cut_at_stop(text: str, until: list[str]) -> str:
    """``text`` up to the first occurrence of a stop string in ``until`` that does not start or end inside a
    number of the text (so ``"."`` cuts ``"2.5 kg. Next"`` after ``kg``, not inside ``2.5``)."""
    inside = [(number.start, number.end) for number in find_numbers(text)]
    cut = len(text)
    for stop in until:
        position = text.find(stop)
        while position != -1:
            end = position + len(stop)
            if not any(start < position < stop_end or start < end < stop_end for start, stop_end in inside):
                cut = min(cut, position)
                break
            position = text.find(stop, position + 1)
    return text[:cut]


@register_model("causalqwen")
class CausalQwenLM(LM):
    """lm-eval's ``LM`` for a CausalQwen directory (or anything `causalqwen.app.commands.load_model_and_tokenizer`
    loads: a Qwen2 directory is converted on load, ``"tiny"`` is the embedded tiny model).

    Args:
        pretrained: the directory (or hub id, read from the local cache when offline).
        mode: the inference mode of ``generate_until`` (`causalqwen.inference.MODES`).
        token_probability: ``"ovr"`` (default) or ``"softmax"``, the token term of the likelihood (decision D16).
        number_resolution: how generated numbers are written: ``"prompt"`` (default: the finest resolution of the
            context's numbers, the shortest text when it has none), None or ``"none"`` (the shortest float32 text),
            or a power of ten.
        device: ``"cpu"`` or ``"cuda"``; ``batch_size`` is accepted and requests are scored one at a time.
        seed: seeds the random draws of the ``causal``, ``shared_*`` and ``traditional`` modes.
    """

    def __init__(self, pretrained: str = "tiny", *, mode: str = "standard", token_probability: str = "ovr",
                 number_resolution="prompt", device: str = "cpu", seed: int = 0, **kwargs):
        super().__init__()
        from ..app.commands import load_model_and_tokenizer

        unknown = sorted(set(kwargs) - {"batch_size", "max_batch_size", "dtype", "trust_remote_code"})
        if unknown:
            raise ValueError(f"CausalQwenLM got unknown model_args {unknown}; it takes pretrained, mode, "
                             "token_probability, number_resolution, device and seed (and accepts batch_size, "
                             "max_batch_size, dtype and trust_remote_code, which change nothing)")
        self.mode = check_mode(mode)
        self.token_probability = check_token_probability(token_probability)
        self.number_resolution = check_resolution(None if number_resolution in (None, "none") else number_resolution)
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} was asked for (lm-eval's command line defaults to cuda) but no CUDA "
                             "device is available: pass --device cpu")
        self.model, self.tokenizer = load_model_and_tokenizer(str(pretrained))
        self.model.to(device).eval()
        self.generator = torch.Generator(device=device).manual_seed(int(seed))

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """``(log P(continuation | context), is_greedy)`` per request, numbers scored as written."""
        results = []
        for request in requests:
            context, continuation = request.args
            encoded = split_context(self.tokenizer, context, continuation)
            encoded = keep_last(*encoded, self.model.config.max_position_embeddings, self.tokenizer.num_token_id)
            score = score_continuation(self.model, *encoded, self.token_probability)
            results.append((score.log_likelihood, score.is_greedy))
            self.cache_hook.add_partial("loglikelihood", request.args, results[-1])
        return results

    def loglikelihood_rolling(self, requests) -> list[float]:
        """``log P(text)`` per request, every token scored."""
        results = []
        for request in requests:
            (text,) = request.args
            results.append(score_text(self.model, self.tokenizer, text, self.token_probability))
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, results[-1])
        return results

    def generate_until(self, requests) -> list[str]:
        """The text generated after each context, cut at its stop strings (never inside a number)."""
        results = []
        for request in requests:
            context, settings = request.args
            until = settings.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(settings.get("max_gen_toks", 256))
            ids, values, texts = self._prompt(context, max_new)
            input_ids = torch.tensor([ids], device=self.model.device)  # [1, S]
            out = generate(self.model, input_ids, torch.tensor([values], device=self.model.device),
                           torch.ones_like(input_ids), mode=self.mode, max_new_tokens=max_new, generator=self.generator,
                           eos_token_id=self.tokenizer.eos_token_id, pad_token_id=self.tokenizer.pad_token_id)
            _, text = self.tokenizer.decode_continuation(out.sequences[0], out.numeric_values[0], len(ids),
                                                         out_of_vocab="mark", number_texts=texts,
                                                         number_resolution=self.number_resolution)
            results.append(cut_at_stop(text, until))
            self.cache_hook.add_partial("generate_until", request.args, results[-1])
        return results


    def _prompt(self, context: str, max_new: int) -> tuple[list[int], list[float], list[str]]:
        """The context's ids, values and number texts, its first tokens cut so that ``max_new`` more fit the model's
        positions; an empty context is the end-of-text token."""
        ids, values, texts = self.tokenizer.encode(context, return_number_texts=True)
        if not ids:
            ids, values = [self.tokenizer.eos_token_id], [0.0]
        room = self.model.config.max_position_embeddings - max_new
        if room < 1:
            raise ValueError(f"max_gen_toks={max_new} leaves no room for a context in the model's "
                             f"{self.model.config.max_position_embeddings} positions")
        ids, values, texts, _ = keep_last(ids, values, texts, len(ids), room, self.tokenizer.num_token_id)
        return ids, values, texts

def main(argv: list[str] | None = None) -> int:
    """lm-eval's command line with the ``causalqwen`` model registered: the arguments are lm-eval's own."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
