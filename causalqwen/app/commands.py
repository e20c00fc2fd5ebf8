"""What the ``causalqwen`` subcommands do (`causalqwen.app.cli` parses their options and calls these).

* `walkthrough` -- the whole forward pass on the embedded tiny Qwen2 base, printed stage by stage.
* `generate_text` -- text in, text out, from `load_model_and_tokenizer`'s model.
* `train_command` -- a real checkpoint and JSONL data through `causalqwen.train`; a Ctrl-C names the last
  checkpoint and the command that continues the run.
* `convert_command` -- ``from_qwen`` plus ``save_pretrained`` (model and tokenizer).
"""

from __future__ import annotations

import os
import shlex
import sys

__all__ = [
    "DEFAULT_TEXT",
    "DEFAULT_SAVE_TOTAL_LIMIT",
    "DTYPES",
    "TINY",
    "SOURCE_HELP",
    "INTERRUPTED",
    "walkthrough",
    "load_model_and_tokenizer",
    "load_base",
    "generate_text",
    "init_keywords",
    "train_command",
    "convert_command",
    "one_line",
]

DEFAULT_TEXT = "The price is 99.9 yuan; 温度-15.5度 in 2020-2021, up 1,250 units."
# The choices of --dtype: one of torch's floating dtypes for the parameters, or "auto" (the checkpoint's, as loaded).
DTYPES = ("float32", "bfloat16", "float16", "auto")


def _shape(t) -> str:
    return "[" + ", ".join(str(d) for d in t.shape) + "]"


def walkthrough(text: str = DEFAULT_TEXT, seed: int = 0) -> int:
    """Print the forward pass of CausalQwen on the tiny base for ``text``; return a process exit code."""
    import torch

    from .tiny import build_tiny_causal_lm

    torch.manual_seed(seed)
    model, tokenizer, qwen = build_tiny_causal_lm(seed=seed)
    hf_tokenizer = tokenizer.hf_tokenizer
    cfg = model.config
    print(
        f"Base: tiny random Qwen2 (hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, "
        f"{cfg.num_attention_heads} heads / {cfg.num_key_value_heads} kv heads), "
        f"tokenizer K = {len(hf_tokenizer) - 1} tokens + <NUM> (id {tokenizer.num_token_id}), V = {cfg.vocab_size} rows"
    )

    batch = tokenizer([text])
    ids, values = batch["input_ids"], batch["numeric_values"]
    print(f"\n1. Numeric-aware tokenization of {text!r}")
    pieces = []
    for token_id, value in zip(ids[0].tolist(), values[0].tolist()):
        if token_id == tokenizer.num_token_id:
            pieces.append(f"<NUM>={value:g}")
        else:
            pieces.append(repr(hf_tokenizer.decode([token_id])))
    print("   " + " ".join(pieces))
    print(f"   decoded back: {tokenizer.decode(ids[0], values[0])!r}  (numbers in shortest float32 form)")

    with torch.no_grad():
        out = model(ids, numeric_values=values, labels=ids, return_decisions=True)
        plain = model(ids, numeric_values=torch.zeros_like(values))  # the same tokens with every value set to 0
        logits = qwen(ids).logits
    print("\n2. Forward pass (shapes)")
    print(f"   e = embed(x) + sign(v) ln(1+|v|) w_num     {_shape(ids)} -> [1, {ids.shape[1]}, {cfg.hidden_size}]")
    print(f"   z = Qwen2Model(e); U ~ Cauchy(loc_U, scale_U)  loc_U, scale_U {_shape(out.loc_U)}")
    print(f"   S_k ~ Cauchy(loc_S, scale_S)                   {_shape(out.loc_S)}")
    print(f"   Y ~ Cauchy(loc_Y, scale_Y)                     {_shape(out.loc_Y)}")
    print(
        f"   scale_U at init = {out.scale_U.mean().item():.4f} (gamma = {cfg.abduction_scale_init}), "
        f"|b_noise| = {cfg.noise_init}"
    )

    eq_error = (plain.loc_S - logits).abs().max().item()
    num_positions = (ids[0] == tokenizer.num_token_id).nonzero().flatten()
    changed = (out.loc_S - logits).abs().amax(-1)[0] > 0
    first = int(num_positions[0]) if len(num_positions) else ids.shape[1]
    print("\n3. Initialization equivalence")
    print(f"   values zeroed: max |loc_S - Qwen2 logits| = {eq_error:.2e}")
    print(
        f"   with numbers: positions that changed = {changed.nonzero().flatten().tolist()} "
        f"(first <NUM> at {first}; earlier positions cannot see it)"
    )

    print("\n4. Loss (labels = input_ids, shifted inside forward)")
    print(f"   total = {out.loss.item():.4f} = cls {out.cls_loss.item():.4f} + reg {out.reg_loss.item():.4f}")
    ok = eq_error <= 1e-5 and not bool(changed[:first].any())
    print(f"\n{'OK' if ok else 'FAILED'}: the forward pass reproduces Qwen2 at initialization.")
    return 0 if ok else 1


TINY = "tiny"
SOURCE_HELP = (
    "A name with no '/' must be an existing directory (else it fails at once); a hub id has the form "
    "owner/name and is read from the local Hugging Face cache or downloaded (HF_HUB_OFFLINE=1: the cache only)"
)


def load_model_and_tokenizer(model: str = TINY, seed: int = 0, init: dict | None = None, dtype: str = "auto"):
    """``(CausalQwenForCausalLM, NumericTokenizer)`` from ``model``, in eval mode, its parameters in ``dtype``
    (one of `DTYPES`; ``"auto"``: as loaded, which is the checkpoint's dtype, and float32 for the tiny base).

    ``model`` is ``"tiny"`` (the embedded tiny Qwen2 base, converted with ``from_qwen``; random
    weights), a directory written by ``save_pretrained`` (model and tokenizer), or a Qwen2
    checkpoint path / hub id, converted with ``from_qwen`` on load. ``seed`` seeds the
    initialization of whatever is newly built; ``init`` holds ``from_qwen`` keywords for a conversion
    (`init_keywords`; a saved CausalQwen keeps its own, so ``init`` with one is a ``ValueError``).

    Before anything is loaded (`causalqwen.files.checkpoint.check_local_source`): a name without ``/`` that
    is no directory (``model_nope``) is a ``ValueError`` at once, never a hub lookup; an ``owner/name``
    that is no local directory is a hub id, read from the local Hugging Face cache or downloaded (with
    ``HF_HUB_OFFLINE=1`` from the cache only, without network retries). A corrupt JSON file of a local
    directory is named with its line and column, and a local directory must hold the tokenizer.
    """
    import torch
    from transformers import AutoConfig

    from ..files.checkpoint import check_local_source
    from ..files.loading import check_tokenizer_directory
    from ..integrations.tokenizer import NumericTokenizer
    from ..modeling import CausalQwenConfig, CausalQwenForCausalLM
    from .tiny import build_tiny_causal_lm

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    init = init or {}
    torch.manual_seed(seed)
    if model == TINY:
        tiny = build_tiny_causal_lm(seed=seed, **init)
        return _in_dtype(tiny.model, dtype), tiny.tokenizer
    try:
        check_local_source(model, "model")
    except OSError as error:
        raise ValueError(str(error)) from None
    check_tokenizer_directory(model)
    try:
        config = AutoConfig.from_pretrained(model)
    except OSError as error:
        if os.path.isdir(model):
            raise
        raise OSError(f"cannot load {model!r} from the Hugging Face hub: {one_line(error)}") from None
    except ValueError as error:  # a refused field: transformers does not tell the config class its file
        file = os.path.join(model, "config.json")
        if not os.path.isdir(model) or str(error).startswith(file):
            raise
        raise ValueError(f"{file}: {error}") from None
    tokenizer = NumericTokenizer.from_pretrained(model)
    if config.model_type == CausalQwenConfig.model_type:
        if init:
            raise ValueError(
                f"{model!r} is a saved CausalQwen, which keeps the initialization it was converted with; "
                "--init, --abduction-scale-init, --ovr-threshold, --threshold-init and "
                "--threshold-quantile apply when converting a Qwen2 base"
            )
        loaded = CausalQwenForCausalLM.from_pretrained(model)
    else:
        loaded = CausalQwenForCausalLM.from_qwen(model, **init)
    if loaded.config.num_token_id != tokenizer.num_token_id:
        raise ValueError(
            f"{model}: the model's num_token_id ({loaded.config.num_token_id}) differs from the tokenizer's <NUM> id "
            f"({tokenizer.num_token_id})"
        )
    return _in_dtype(loaded, dtype).eval(), tokenizer


def _in_dtype(model, dtype: str):
    """``model`` with its parameters cast to ``dtype`` (a name in `DTYPES`), or as it is for ``"auto"``."""
    import torch

    return model if dtype == "auto" else model.to(getattr(torch, dtype))


def generate_text(
    prompts: list[str],
    model: str = TINY,
    mode: str = "standard",
    *,
    seed: int = 0,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    normalize: str = "softmax",
    use_cache: bool = True,
    number_resolution="prompt",
) -> list[str]:
    """Generate a continuation of each prompt (one left-padded batch); return prompt + continuation as text, the
    prompt exactly as given (its numbers as written) and the continuation told apart by token counts
    (`NumericTokenizer.decode_continuation`), its numbers written at ``number_resolution`` (`causalqwen.writing`)."""
    import torch

    from ..generation import generate

    causal_qwen, tokenizer = load_model_and_tokenizer(model, seed=seed)
    batch = tokenizer(prompts, padding_side="left")
    sampling = (
        dict(temperature=temperature, top_k=top_k, top_p=top_p, normalize=normalize) if mode == "traditional" else {}
    )
    out = generate(
        causal_qwen,
        batch["input_ids"],
        batch["numeric_values"],
        batch["attention_mask"],
        mode=mode,
        max_new_tokens=max_new_tokens,
        generator=torch.Generator().manual_seed(seed),
        use_cache=use_cache,
        **sampling,
    )
    return written_texts(tokenizer, prompts, batch, out, number_resolution)


def written_texts(tokenizer, prompts: list[str], batch, out, number_resolution="prompt") -> list[str]:
    """Each prompt exactly as given, then its generated continuation (``out`` of `causalqwen.generate` on the
    left-padded encoding ``batch`` of ``prompts``), its numbers written at ``number_resolution``: the one way the
    command line writes what it generated (``causalqwen generate`` and the demo's samples)."""
    texts = []
    for row, prompt in enumerate(prompts):
        kept = out.attention_mask[row].bool()  # the prompt's padding and what follows an EOS are dropped
        _, continuation = tokenizer.decode_continuation(
            out.sequences[row][kept],
            out.numeric_values[row][kept],
            int(batch["attention_mask"][row].sum()),
            out_of_vocab="mark",
            number_texts=batch.number_texts[row],
            number_resolution=number_resolution,
        )
        texts.append(prompt + continuation)
    return texts


def init_keywords(args) -> dict:
    """The ``from_qwen`` keywords of the options of `causalqwen.app.cli.add_init_arguments`: nothing for the defaults
    (the calibrated initialization)."""
    from ..initialization import DRAFT_INIT

    init = dict(DRAFT_INIT) if args.init == "drafts" else {}  # None or "calibrated": from_qwen's defaults
    if args.threshold_init is not None:
        init.pop("ovr_threshold", None)
        init["ovr_threshold_init"] = args.threshold_init
    if args.ovr_threshold is not None:
        init["ovr_threshold"] = args.ovr_threshold
        if args.threshold_init is None:
            init["ovr_threshold_init"] = "fixed"
    if args.abduction_scale_init is not None:
        init["abduction_scale_init"] = args.abduction_scale_init
    if args.threshold_quantile is not None:
        if args.threshold_init != "top_logit_quantile":
            raise ValueError("--threshold-quantile applies to --threshold-init top_logit_quantile only")
        init["ovr_threshold_quantile"] = args.threshold_quantile
    if args.init == "calibrated" and not init:
        init = {"ovr_threshold_init": "top_two_midpoint"}  # said explicitly: refused for a saved CausalQwen too
    return init


# Checkpoints a ``train`` run keeps (--save-total-limit): a resume needs only the newest; the two before it are a
# way back from a diverged or unwanted tail, and the disk a run takes stays bounded at three checkpoints.
DEFAULT_SAVE_TOTAL_LIMIT = 3
# How the command's messages name the library's resume and overwrite keywords.
FLAG_NAMES = {"resume": "--resume", "overwrite": "--overwrite"}
INTERRUPTED = 130  # the exit status of a command ended by Ctrl-C (128 + SIGINT), as shells report it


def _report_interrupted_training(args) -> None:
    """Two lines on stderr after a Ctrl-C during ``train``: the last checkpoint (or that there is none) and
    the command that continues the run: this one, with ``--resume`` and without ``--overwrite``."""
    from .runs import latest_checkpoint

    given = getattr(args, "argv", None) or ["train", "..."]
    words = [word for word in given if not (word.startswith("--ov") and "--overwrite".startswith(word))]
    again = shlex.join(["causalqwen", *words, *([] if args.resume else ["--resume"])])
    try:
        checkpoint = latest_checkpoint(args.out)
    except OSError as error:  # a checkpoint-N that is a link: resuming would refuse it
        print(f"causalqwen train: interrupted; {one_line(error)}", file=sys.stderr)
        return
    if checkpoint is None:
        print(
            f"causalqwen train: interrupted before the first checkpoint (--save-every {args.save_every}): "
            "no step is saved",
            file=sys.stderr,
        )
        print(f"start again with: {again}", file=sys.stderr)
    else:
        step = checkpoint.rsplit("-", 1)[1]
        print(
            f"causalqwen train: interrupted; the last checkpoint is {checkpoint} (step {step} of {args.steps})",
            file=sys.stderr,
        )
        print(f"continue with: {again}", file=sys.stderr)


def train_command(args) -> int:
    """``causalqwen train``: a real checkpoint and JSONL data through the same loop as the demo; each eval prints
    one line (`causalqwen.app.runs.eval_line`), and only the newest ``--save-total-limit`` checkpoints stay.

    A Ctrl-C ends it with exit status 130 and two lines: the last checkpoint and the command that continues
    the run (``--resume``)."""
    import torch.distributed as dist

    from ..files.data import TextDataset, check_answers_present, collate, read_jsonl
    from ..files.rundir import RunDirectory
    from .training_run import check_training_inputs, save_trained_model, train

    config = _training_config(args)
    # The data first: a bad file fails at once, not after a (possibly large) model has been loaded.
    texts, sources = read_jsonl(args.data)
    eval_texts, eval_sources = read_jsonl(args.eval_data) if args.eval_data else (None, None)
    if eval_texts is not None:
        check_answers_present(eval_texts, eval_sources)
    model, tokenizer = _model_to_train(args, config.preset)
    train_set = TextDataset(texts, tokenizer, args.max_length, sources)
    eval_batch = None
    if eval_texts is not None:
        eval_set = TextDataset(eval_texts, tokenizer, args.max_length, eval_sources)
        eval_batch = collate(eval_set.items, tokenizer.pad_token_id)
    check_training_inputs(model, train_set, config)  # every option checked before anything is written to --out
    writer = not dist.is_initialized() or dist.get_rank() == 0  # only rank 0 writes
    run_dir = (
        RunDirectory.claim(args.out, "train", resume=args.resume, overwrite=args.overwrite, option_names=FLAG_NAMES)
        if writer
        else None
    )
    interrupted = False
    try:
        train(
            model,
            train_set,
            config,
            eval_batch=eval_batch,
            eval_texts=(tokenizer, [_as_text(row) for row in eval_texts]) if eval_texts is not None else None,
            out_dir=run_dir if writer else args.out,
            resume=args.resume,
            allow_changed_settings=args.allow_changed_settings,
            print_eval=True,
        )
        if writer:
            for what, path in save_trained_model(args.out, model, tokenizer, lora=config.preset == "lora"):
                print(f"{what} written to {path}")
    except KeyboardInterrupt:  # Ctrl-C: reported below, after the frames (and the progress bar) of train are gone
        interrupted = True
    finally:
        if run_dir is not None:
            run_dir.release()
    if interrupted:
        if writer:
            _report_interrupted_training(args)
        return INTERRUPTED
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _as_text(row) -> str:
    """A JSONL row as the text its bits per byte are measured on: a text, or a prompt and its completion joined."""
    return row if isinstance(row, str) else row.prompt + row.completion


def _training_config(args):
    """The `TrainingConfig` of ``train``'s options, after the checks of options that apply only with others."""
    from ..training import TrainingConfig

    config = TrainingConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        warmup_steps=args.warmup_steps,
        warmup_ratio=args.warmup_ratio,
        max_grad_norm=args.max_grad_norm,
        preset=args.preset,
        eval_every=args.eval_every,
        save_every=args.save_every,
        save_total_limit=args.save_total_limit,
        log_every=args.log_every,
        seed=args.seed,
        report_to=args.report_to,
        max_u_divergence=args.max_u_divergence,
        divergence_dual_lr=1.0 if args.divergence_dual_lr is None else args.divergence_dual_lr,
    )
    if args.allow_changed_settings and not args.resume:
        raise ValueError("--allow-changed-settings applies to --resume only")
    if args.divergence_dual_lr is not None and args.max_u_divergence is None:
        raise ValueError("--divergence-dual-lr applies to --max-u-divergence only")
    lora = {"--lora-rank": args.lora_rank, "--lora-alpha": args.lora_alpha}
    given = [option for option, value in lora.items() if value is not None]
    if given and config.preset != "lora":
        raise ValueError(f"{' and '.join(given)} apply to --preset lora only (the preset is {config.preset!r})")
    return config


def _model_to_train(args, preset: str):
    """``(model, tokenizer)`` of ``--base`` (with LoRA adapters for preset ``lora``) on this process's device, the
    process group started when ``torchrun`` launched the command."""
    import torch
    import torch.distributed as dist

    from ..kernels.mixed_precision import check_trainable_dtypes

    if args.dtype == "float16":  # before a (possibly large) model is loaded
        raise ValueError(
            "--dtype float16 cannot train: float16 gradients need loss scaling, which causalqwen train "
            "does not do; use --dtype float32 (the default) or bfloat16"
        )
    model, tokenizer = load_model_and_tokenizer(args.base, seed=args.seed, init=init_keywords(args), dtype=args.dtype)
    check_trainable_dtypes(model)  # --dtype auto on a float16 checkpoint: refused before --out is claimed
    if preset == "lora":
        from ..integrations.lora import add_lora

        if args.lora_rank is not None and args.lora_rank > model.config.hidden_size:  # before peft allocates
            raise ValueError(  # [rank, hidden] matrices
                f"--lora-rank {args.lora_rank} exceeds the base's hidden size {model.config.hidden_size}: the rank "
                "of a LoRA update is at most the smaller dimension of its layer"
            )
        options = {"rank": args.lora_rank, "alpha": args.lora_alpha}
        model = add_lora(model, **{name: value for name, value in options.items() if value is not None})
    if torch.cuda.is_available():  # one device per process, chosen before NCCL builds its communicator
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        model.to(device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():  # launched by torchrun
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return model, tokenizer


def _holds_causalqwen_model(directory: str) -> bool:
    import json

    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as handle:
            return json.load(handle).get("model_type") == "causal_qwen"
    except (OSError, ValueError, AttributeError):
        return False


def convert_command(args) -> int:
    """``causalqwen convert``: from_qwen + save_pretrained, model and tokenizer."""
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"output {args.out!r} is a file, not a directory")
    if os.path.isdir(args.out) and os.listdir(args.out):
        if not args.overwrite:
            raise ValueError(f"output directory {args.out!r} exists and is not empty; pass --overwrite to replace it")
        if not _holds_causalqwen_model(args.out):  # save_pretrained would delete its own kind of weight files there
            raise ValueError(
                f"output directory {args.out!r} does not hold a CausalQwen model; --overwrite replaces only an earlier "
                "convert's output, never another directory: choose a new or empty one"
            )
    model, tokenizer = load_model_and_tokenizer(args.base, init=init_keywords(args), dtype=args.dtype)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    config = model.config
    dtype = str(model.dtype).removeprefix("torch.")
    print(
        f"CausalQwen (V = {config.vocab_size}, <NUM> id {config.num_token_id}, "
        f"gamma = {config.abduction_scale_init:g}, "
        f"C = {config.ovr_threshold:.6g} ({config.ovr_threshold_init}), {dtype}) written to {args.out}"
    )
    return 0


def one_line(error: BaseException) -> str:
    """The message of ``error`` on one line (a CLI error never prints a traceback or a multi-line block)."""
    return " ".join(str(error).split()) or type(error).__name__


def load_base(adapter_dir, **kwargs):
    """The `CausalQwenForCausalLM` the adapter in ``adapter_dir`` records as its base (`adapter_base`), loaded
    without the network (``local_files_only=True``; ``kwargs`` go to ``from_pretrained``, e.g. ``dtype``).
    Put the adapter on it with ``causalqwen.integrations.lora.load_lora(load_base(adapter_dir), adapter_dir)``."""
    from ..integrations.lora_base import adapter_base
    from ..modeling import CausalQwenForCausalLM

    base = adapter_base(adapter_dir)
    kwargs.setdefault("local_files_only", True)
    try:
        return CausalQwenForCausalLM.from_pretrained(base, **kwargs)
    except OSError as error:
        if os.path.isdir(base):
            raise
        raise OSError(
            f"the base model {base!r} recorded by the adapter in {os.fspath(adapter_dir)!r} is no local "
            f"directory and is not in the local Hugging Face cache (no download is made): {error}"
        ) from error
