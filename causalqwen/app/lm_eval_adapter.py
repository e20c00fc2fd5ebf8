"""CausalQwen in EleutherAI's lm-evaluation-harness: the model ``causalqwen`` (docs: lm_eval.md).

lm-eval hands a model strings and reads back numbers and strings. `CausalQwenLM` answers its three requests
with CausalQwen's own tokenizer, so every number of a text reaches the model as ``<NUM>`` with its value:

* ``loglikelihood(context, continuation)``: `causalqwen.likelihood.score_continuation`, the continuation's
  log-probability with each number scored as written (the probability of its resolution interval, decision
  D16), and whether greedy decoding gives it;
* ``loglikelihood_rolling(text)``: `causalqwen.likelihood.score_text`, every token of the text; an empty text is
  0.0, as lm-eval's ``hf`` model scores it;
* ``generate_until(context, generation_kwargs)``: the kwargs read through lm-eval's own
  ``normalize_gen_kwargs`` (``max_gen_toks`` or its aliases ``max_new_tokens``, ``max_tokens``,
  ``max_completion_tokens``; ``do_sample``), then `causalqwen.generate` in the named ``mode``, the text decoded
  with its numbers written out at ``number_resolution`` (`causalqwen.writing`), and cut at the first non-empty
  stop string that does not fall inside a number (a ``"."`` stop leaves ``2.5`` whole).

Each request type runs under a progress bar, as in lm-eval's ``hf`` model. Every ``model_args`` value is checked
before the model loads; an error raised by a request names it (``request 3 (loglikelihood): ...``).

From Python: ``lm_eval.simple_evaluate(model=CausalQwenLM.create_from_arg_string("pretrained=DIR"), tasks=...)``.
From the command line, ``python -m causalqwen.app.lm_eval_adapter`` takes lm-eval's own arguments,
``--model causalqwen --model_args pretrained=DIR,mode=standard ...``, and runs lm-eval's CLI with this model
registered. lm-eval is an optional extra: ``pip install -e ".[eval]"``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

import torch
from tqdm import tqdm

try:
    import lm_eval.models  # noqa: F401  lm-eval's own models (hf, ...) register before ours, so both stay available
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import normalize_gen_kwargs
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError('causalqwen.app.lm_eval_adapter needs lm-eval: pip install -e ".[eval]"') from error

from ..generation import generate
from ..inference import MODES, check_mode
from ..likelihood import (
    check_token_probability,
    keep_last,
    score_continuation,
    score_text,
    split_context,
)
from ..numbers import find_numbers
from ..writing import check_resolution

__all__ = ["CausalQwenLM", "cut_at_stop", "main"]

SEED_END = 2**32  # a seed is 0 to 2**32 - 1, as the command line's --seed
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default generation budget (its hf model's max_gen_toks)
# The keys `normalize_gen_kwargs` returns that the adapter reads; until and max_gen_toks always, do_sample and
# temperature always (normalised), top_k and top_p by the traditional mode when sampling.
GENERATION_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p")
SAMPLING_MODES = tuple(mode for mode in MODES if mode != "standard")
NO_OP_ARGS = ("batch_size", "max_batch_size", "dtype", "trust_remote_code")


def cut_at_stop(text: str, until: list[str]) -> str:
    """``text`` up to the first occurrence of a stop string in ``until`` that does not start or end inside a
    number of the text (so ``"."`` cuts ``"2.5 kg. Next"`` after ``kg``, not inside ``2.5``). An empty stop string
    stops nothing (as in lm-eval's own post-processing)."""
    inside = [(number.start, number.end) for number in find_numbers(text)]
    cut = len(text)
    for stop in until:
        if stop == "":
            continue
        position = text.find(stop)
        while position != -1:
            end = position + len(stop)
            if not any(start < position < stop_end or start < end < stop_end for start, stop_end in inside):
                cut = min(cut, position)
                break
            position = text.find(stop, position + 1)
    return text[:cut]


def _model_arg_error(name: str, value, must: str) -> ValueError:
    return ValueError(f"model_args {name} must be {must}, got {value!r}")


def _checked_library_arg(name: str, value, check):
    """``check(value)``, its ValueError or TypeError raised again as a ValueError naming the model_arg."""
    try:
        return check(value)
    except (ValueError, TypeError) as error:
        raise ValueError(f"model_args {name}={value!r}: {error}") from error


def _check_pretrained(pretrained) -> str:
    if isinstance(pretrained, os.PathLike):
        pretrained = os.fspath(pretrained)
    if not isinstance(pretrained, str) or not pretrained:
        raise _model_arg_error(
            "pretrained",
            pretrained,
            "a directory, a hub id or tiny (quote a name lm-eval would read as a number: pretrained='123')",
        )
    return pretrained


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_END:
        raise _model_arg_error("seed", seed, "an integer from 0 to 2**32 - 1")
    return seed


def _check_device(device) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` of a CUDA device that is there."""
    must = "cpu, cuda or cuda:N"
    if not isinstance(device, (str, torch.device)):
        raise _model_arg_error("device", device, must)
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise _model_arg_error("device", device, must) from error
    if parsed.type == "cpu":
        return parsed
    if parsed.type != "cuda":
        raise _model_arg_error("device", device, must)
    if not torch.cuda.is_available():
        raise ValueError(
            f"model_args device {device!r} was asked for (lm-eval's command line defaults to cuda) but "
            "no CUDA device is available: pass --device cpu"
        )
    if parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ValueError(
            f"model_args device {device!r} names a CUDA device that is not there ({torch.cuda.device_count()} visible)"
        )
    return parsed


def _check_no_op_arg(name: str, value) -> None:
    """The arguments accepted so that command lines written for lm-eval's ``hf`` model run; they change nothing,
    and a value that would ask for something the adapter does not do is refused."""
    positive = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if name == "batch_size":
        auto = isinstance(value, str) and (
            value == "auto" or (value.startswith("auto:") and value[5:].isdigit() and int(value[5:]) >= 1)
        )
        count = isinstance(value, str) and value.isdigit() and int(value) >= 1
        if not (auto or count or positive):
            raise _model_arg_error(name, value, "a positive integer, auto or auto:N")
    elif name == "max_batch_size" and not positive:
        raise _model_arg_error(name, value, "a positive integer")
    elif name == "dtype" and value not in ("auto", "float32", torch.float32):
        raise _model_arg_error(name, value, "float32 or auto (requests are scored in float32)")
    elif name == "trust_remote_code" and not isinstance(value, bool):
        raise _model_arg_error(name, value, "True or False")


@contextlib.contextmanager
def _naming(kind: str, index: int, request):
    """Raise an error of the request again with the request named: its position in the call, its type, and
    lm-eval's task and document when the request carries them."""
    try:
        yield
    except (ValueError, TypeError, ArithmeticError) as error:
        where = [kind]
        if getattr(request, "task_name", None) is not None:
            where.append(f"task {request.task_name}")
        if getattr(request, "doc_id", None) is not None:
            where.append(f"doc {request.doc_id}")
        message = f"request {index} ({', '.join(where)}): {error}"
        try:
            named = type(error)(message)
        except Exception:  # noqa: BLE001 -- an error type that takes other arguments: its base type says the same
            named = next(base for base in (ValueError, TypeError, ArithmeticError) if isinstance(error, base))(message)
        raise named from error


def _arguments(kind: str, request, types: tuple[type, ...], names: tuple[str, ...]) -> tuple:
    """``request.args``, checked to be ``len(names)`` values of ``types``."""
    if not hasattr(request, "args"):
        raise TypeError(f"{kind} takes lm-eval Instances (with .args), got {type(request).__name__}")
    arguments = request.args
    if len(arguments) != len(names):
        raise ValueError(f"{kind} takes ({', '.join(names)}), got {len(arguments)} arguments")
    for name, kind_of, value in zip(names, types, arguments):
        if not isinstance(value, kind_of):
            raise TypeError(f"{name} must be a {kind_of.__name__}, got {type(value).__name__}")
    return arguments


@register_model("causalqwen")
class CausalQwenLM(LM):
    """lm-eval's ``LM`` for a CausalQwen directory (or anything `causalqwen.app.commands.load_model_and_tokenizer`
    loads: a Qwen2 directory is converted on load, ``"tiny"`` is the embedded tiny model).

    Args:
        pretrained: the directory (or hub id, read from the local cache when offline).
        mode: the inference mode of ``generate_until`` (`causalqwen.inference.MODES`); it decides how tokens
            are chosen (see `generate_until` for ``do_sample``).
        token_probability: ``"ovr"`` (default) or ``"softmax"``, the token term of the likelihood (decision D16).
        number_resolution: how generated numbers are written (`causalqwen.writing`): ``"prompt"`` (default: at
            the resolution the writing rule derives from the context's numbers), None or ``"none"`` (the shortest
            float32 text), or a power of ten.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        seed: 0 to 2**32 - 1; seeds the random draws of the ``causal``, ``shared_*`` and ``traditional`` modes
            and the new parameters of a Qwen2 base converted on load.
        **kwargs: ``batch_size``, ``max_batch_size``, ``dtype`` and ``trust_remote_code``, accepted so that
            lm-eval's command lines run, checked, and change nothing: requests are scored one at a time, in float32.

    Every value is checked before anything loads; a bad one is a ``ValueError`` naming the argument and the value.
    """

    def __init__(
        self,
        pretrained: str = "tiny",
        *,
        mode: str = "standard",
        token_probability: str = "ovr",
        number_resolution="prompt",
        device: str = "cpu",
        seed: int = 0,
        **kwargs,
    ):
        super().__init__()
        from .commands import load_model_and_tokenizer

        unknown = sorted(set(kwargs) - set(NO_OP_ARGS))
        if unknown:
            raise ValueError(
                f"CausalQwenLM got unknown model_args {unknown}; it takes pretrained, mode, "
                "token_probability, number_resolution, device and seed (and accepts batch_size, "
                "max_batch_size, dtype and trust_remote_code, which change nothing)"
            )
        for name, value in kwargs.items():
            _check_no_op_arg(name, value)
        pretrained = _check_pretrained(pretrained)
        self.mode = _checked_library_arg("mode", mode, check_mode)
        self.token_probability = _checked_library_arg("token_probability", token_probability, check_token_probability)
        self.number_resolution = _checked_library_arg(
            "number_resolution",
            number_resolution,
            lambda value: check_resolution(None if value in (None, "none") else value),
        )
        self.seed = _check_seed(seed)
        self._device = _check_device(device)
        # scored in float32 whatever the checkpoint holds (a bf16 Qwen2.5 too), as the docs promise
        self.model, self.tokenizer = load_model_and_tokenizer(pretrained, seed=self.seed, dtype="float32")
        self.model.to(self.device).eval()
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)
        self._warned_standard_sampling = False  # do_sample=True under the standard mode warns once per model

    def _progress(self, requests, kind: str, disable_tqdm: bool):
        return tqdm(requests, desc=f"Running {kind} requests", disable=(disable_tqdm or self.rank != 0))

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``(log P(continuation | context), is_greedy)`` per request, numbers scored as written."""
        results = []
        for index, request in enumerate(self._progress(requests, "loglikelihood", disable_tqdm)):
            with _naming("loglikelihood", index, request):
                context, continuation = _arguments("loglikelihood", request, (str, str), ("context", "continuation"))
                encoded = split_context(self.tokenizer, context, continuation)
                encoded = keep_last(*encoded, self.model.config.max_position_embeddings, self.tokenizer.num_token_id)
                score = score_continuation(self.model, *encoded, self.token_probability)
            results.append((score.log_likelihood, score.is_greedy))
            self.cache_hook.add_partial("loglikelihood", request.args, results[-1])
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """``log P(text)`` per request, every token scored; an empty text has no token and scores 0.0 (as in
        lm-eval's ``hf`` model)."""
        results = []
        for index, request in enumerate(self._progress(requests, "loglikelihood_rolling", disable_tqdm)):
            with _naming("loglikelihood_rolling", index, request):
                (text,) = _arguments("loglikelihood_rolling", request, (str,), ("text",))
                score = 0.0 if text == "" else score_text(self.model, self.tokenizer, text, self.token_probability)
            results.append(score)
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, results[-1])
        return results

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """The text generated after each context, cut at its non-empty stop strings (never inside a number).

        The generation kwargs are read through lm-eval's ``normalize_gen_kwargs``: ``max_gen_toks`` (or its
        aliases; default 256), ``until``, and ``do_sample`` (absent, it is True exactly when ``temperature > 0``).
        The ``mode`` chooses the tokens; ``do_sample`` says whether the output may vary:

        * ``do_sample=False`` (greedy): deterministic. ``standard`` decides without a draw; ``traditional`` takes
          the most probable class (top-k 1); ``causal`` and ``shared_*`` draw from a generator seeded with
          ``seed`` anew at each request, so a request gives the same text wherever it falls in any run.
        * ``do_sample=True``: the draws run on through one generator seeded once with ``seed``, so the repeats of
          a request differ; ``traditional`` samples at ``temperature`` with ``top_k`` and ``top_p``. ``standard``
          has nothing to draw: it decides as with ``do_sample=False``, and warns once (naming the sampling modes).
        """
        results = []
        for index, request in enumerate(self._progress(requests, "generate_until", disable_tqdm)):
            with _naming("generate_until", index, request):
                context, settings = _arguments("generate_until", request, (str, dict), ("context", "gen_kwargs"))
                text = self._generate(context, settings)
            results.append(text)
            self.cache_hook.add_partial("generate_until", request.args, results[-1])
        return results

    def _generate(self, context: str, settings: dict) -> str:
        """One ``generate_until`` request."""
        kwargs = _generation_settings(settings)
        generator, sampling = self._draws(kwargs)
        until, max_new = kwargs["until"], kwargs["max_gen_toks"]
        ids, values, texts = self._prompt(context, max_new)
        input_ids = torch.tensor([ids], device=self.device)  # [1, S]
        out = generate(
            self.model,
            input_ids,
            torch.tensor([values], device=self.device),
            torch.ones_like(input_ids),
            mode=self.mode,
            max_new_tokens=max_new,
            generator=generator,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            **sampling,
        )
        _, text = self.tokenizer.decode_continuation(
            out.sequences[0],
            out.numeric_values[0],
            len(ids),
            out_of_vocab="mark",
            number_texts=texts,
            number_resolution=self.number_resolution,
        )
        return cut_at_stop(text, until)

    def _draws(self, kwargs: dict) -> tuple[torch.Generator, dict]:
        """The generator of a request's draws and ``traditional``'s sampling settings, by ``do_sample`` (see
        `generate_until`)."""
        do_sample = kwargs["do_sample"]
        sampling = {}
        if not do_sample:
            generator = torch.Generator(device=self.device).manual_seed(self.seed)
            if self.mode == "traditional":
                sampling = {"top_k": 1}
        elif self.mode == "standard":
            generator = self.generator  # unused: the standard mode decides without a draw
            if not self._warned_standard_sampling:
                warnings.warn(
                    "generation_kwargs do_sample=True asks for samples, but mode='standard' decides without "
                    "a draw, so every repeat of a request is the same text; for samples pass model_args "
                    f"mode= one of {', '.join(SAMPLING_MODES)}",
                    UserWarning,
                    stacklevel=2,
                )
                self._warned_standard_sampling = True
        else:
            generator = self.generator
            if self.mode == "traditional":
                sampling = {
                    "temperature": kwargs["temperature"],
                    "top_k": kwargs.get("top_k", 0),
                    "top_p": kwargs.get("top_p", 1.0),
                }
        return generator, sampling

    def _prompt(self, context: str, max_new: int) -> tuple[list[int], list[float], list[str]]:
        """The context's ids, values and number texts, its first tokens cut so that ``max_new`` more fit the model's
        positions; an empty context is the end-of-text token."""
        ids, values, texts = self.tokenizer.encode(context, return_number_texts=True)
        if not ids:
            ids, values = [self.tokenizer.eos_token_id], [0.0]
        room = self.model.config.max_position_embeddings - max_new
        if room < 1:
            raise ValueError(
                f"max_gen_toks={max_new} leaves no room for a context in the model's "
                f"{self.model.config.max_position_embeddings} positions"
            )
        ids, values, texts, _ = keep_last(ids, values, texts, len(ids), room, self.tokenizer.num_token_id)
        return ids, values, texts


def _generation_settings(settings: dict) -> dict:
    """A ``generate_until`` request's generation kwargs, read through lm-eval's ``normalize_gen_kwargs`` and checked:
    only those the model reads, ``until`` a list of str, ``max_gen_toks`` at least 1, ``do_sample`` a bool."""
    try:
        kwargs = normalize_gen_kwargs(settings, DEFAULT_MAX_GEN_TOKS)
    except (ValueError, TypeError) as error:
        raise ValueError(f"generation_kwargs {settings!r}: {error}") from error
    unread = sorted(set(kwargs) - set(GENERATION_KWARGS))
    if unread:
        raise ValueError(
            f"generation_kwargs {unread} are not read by the causalqwen model; it reads until, "
            "max_gen_toks (or max_new_tokens, max_tokens, max_completion_tokens), do_sample, "
            "temperature, top_k and top_p"
        )
    until = kwargs["until"]
    if not all(isinstance(stop, str) for stop in until):
        raise TypeError(f"generation_kwargs until must be a str or a list of str, got {settings.get('until')!r}")
    if kwargs["max_gen_toks"] < 1:
        raise ValueError(f"max_gen_toks must be at least 1, got {kwargs['max_gen_toks']}")
    if not isinstance(kwargs["do_sample"], bool):
        raise TypeError(f"generation_kwargs do_sample must be True or False, got {kwargs['do_sample']!r}")
    return kwargs


def main(argv: list[str] | None = None) -> int:
    """lm-eval's command line with the ``causalqwen`` model registered: the arguments are lm-eval's own."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
