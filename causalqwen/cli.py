"""The ``causalqwen`` command.

Subcommands so far:

* ``walkthrough`` -- one screen that runs the whole forward pass on the embedded tiny Qwen2 base:
  text with numbers -> ``<NUM>`` tokens and values -> Qwen2 features -> U -> decisions -> loss,
  and checks the initialization equivalence on the spot.
* ``generate`` -- text in, text out, with any of the five inference modes, from a saved CausalQwen
  directory, a Qwen2 checkpoint (converted on load) or the embedded tiny base.

* ``demo`` -- the main job: train from the tiny base on the synthetic corpus and show that it learns.
* ``train`` -- train a CausalQwen converted from a real Qwen2 checkpoint on a JSONL file.
* ``convert`` -- ``from_qwen`` plus ``save_pretrained`` (model and tokenizer).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys

from .inference import MODES
from .training import SEED_MAX

DEFAULT_TEXT = "The price is 99.9 yuan; 温度-15.5度 in 2020-2021, up 1,250 units."

# Integer options. A count goes into torch and C code as a 64-bit integer; a seed seeds torch, Python and numpy,
# whose seeds are 32-bit. Values beyond these are refused by argparse, naming the option and the range. The
# lower bounds of counts are left to the settings' own checks (TrainingConfig, generate, TextDataset), which
# name the setting, except where noted.
INT64_MAX = 2**63 - 1
_BOUND_NAMES = {INT64_MAX: "2**63 - 1", SEED_MAX: "2**32 - 1"}


def _shown(text: str) -> str:
    """``text`` as an error message shows it: whole if short, else its start and its length."""
    return text if len(text) < 40 else f"{text[:12]}... ({len(text)} {'digits' if text.isdecimal() else 'characters'})"


def integer(low: int | None = None, high: int = INT64_MAX):
    """An argparse ``type``: a decimal integer at most ``high`` and, when ``low`` is given, at least ``low``.

    Anything else is an ``argparse.ArgumentTypeError``, which argparse reports as ``argument --OPTION:
    must be an integer from LOW to HIGH, got VALUE`` with exit status 2. An integer of more digits than
    Python converts (``sys.get_int_max_str_digits``) is out of range the same way, never a ``ValueError``.
    """
    bound = f"{high} ({_BOUND_NAMES[high]})" if high in _BOUND_NAMES else str(high)
    wanted = f"must be an integer from {low} to {bound}" if low is not None else f"must be an integer no larger than {bound}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            if re.fullmatch(r"\s*[+-]?[0-9]+\s*", text):  # more digits than int() converts: out of range
                raise argparse.ArgumentTypeError(f"{wanted}, got {_shown(text)}") from None
            raise argparse.ArgumentTypeError(f"expected an integer, got {_shown(text)!r}") from None
        if value > high or (low is not None and value < low):
            raise argparse.ArgumentTypeError(f"{wanted}, got {_shown(text)}")
        return value

    return parse


SEED = integer(0, SEED_MAX)
COUNT = integer()


def path_text(text: str) -> str:
    """An argparse ``type`` for a file, directory or hub id: anything but an empty (or blank) string."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a file, directory or hub id, got {text!r}")
    return text


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
    print(f"Base: tiny random Qwen2 (hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, "
          f"{cfg.num_attention_heads} heads / {cfg.num_key_value_heads} kv heads), "
          f"tokenizer K = {len(hf_tokenizer) - 1} tokens + <NUM> (id {tokenizer.num_token_id}), V = {cfg.vocab_size} rows")

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
    print(f"   scale_U at init = {out.scale_U.mean().item():.4f} (gamma = {cfg.abduction_scale_init}), "
          f"|b_noise| = {cfg.noise_init}")

    eq_error = (plain.loc_S - logits).abs().max().item()
    num_positions = (ids[0] == tokenizer.num_token_id).nonzero().flatten()
    changed = (out.loc_S - logits).abs().amax(-1)[0] > 0
    first = int(num_positions[0]) if len(num_positions) else ids.shape[1]
    print("\n3. Initialization equivalence")
    print(f"   values zeroed: max |loc_S - Qwen2 logits| = {eq_error:.2e}")
    print(f"   with numbers: positions that changed = {changed.nonzero().flatten().tolist()} "
          f"(first <NUM> at {first}; earlier positions cannot see it)")

    print("\n4. Loss (labels = input_ids, shifted inside forward)")
    print(f"   total = {out.loss.item():.4f} = cls {out.cls_loss.item():.4f} + reg {out.reg_loss.item():.4f}")
    ok = eq_error <= 1e-5 and not bool(changed[:first].any())
    print(f"\n{'OK' if ok else 'FAILED'}: the forward pass reproduces Qwen2 at initialization.")
    return 0 if ok else 1


TINY = "tiny"
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model")  # one of them makes a tokenizer directory
SOURCE_HELP = ("A name with no '/' must be an existing directory (else it fails at once); a hub id has the form "
               "owner/name and is read from the local Hugging Face cache or downloaded (HF_HUB_OFFLINE=1: the cache only)")


def load_model_and_tokenizer(model: str = TINY, seed: int = 0, init: dict | None = None):
    """``(CausalQwenForCausalLM, NumericTokenizer)`` from ``model``, in eval mode.

    ``model`` is ``"tiny"`` (the embedded tiny Qwen2 base, converted with ``from_qwen``; random
    weights), a directory written by ``save_pretrained`` (model and tokenizer), or a Qwen2
    checkpoint path / hub id, converted with ``from_qwen`` on load. ``seed`` seeds the
    initialization of whatever is newly built; ``init`` holds ``from_qwen`` keywords for a conversion
    (`init_keywords`; a saved CausalQwen keeps its own, so ``init`` with one is a ``ValueError``).

    Before anything is loaded (`causalqwen.checkpoint.check_local_source`): a name without ``/`` that
    is no directory (``model_nope``) is a ``ValueError`` at once, never a hub lookup; an ``owner/name``
    that is no local directory is a hub id, read from the local Hugging Face cache or downloaded (with
    ``HF_HUB_OFFLINE=1`` from the cache only, without network retries). A corrupt JSON file of a local
    directory is named with its line and column, and a local directory must hold the tokenizer.
    """
    import torch
    from transformers import AutoConfig

    from .checkpoint import check_local_source
    from .modeling import CausalQwenConfig, CausalQwenForCausalLM
    from .tiny import build_tiny_causal_lm
    from .tokenization import NumericTokenizer

    init = init or {}
    torch.manual_seed(seed)
    if model == TINY:
        tiny = build_tiny_causal_lm(seed=seed, **init)
        return tiny.model, tiny.tokenizer
    try:
        check_local_source(model, "model")
    except OSError as error:
        raise ValueError(str(error)) from None
    if os.path.isdir(model) and not any(os.path.isfile(os.path.join(model, name)) for name in TOKENIZER_FILES):
        raise ValueError(  # transformers would build an empty tokenizer from the config alone
            f"cannot load a tokenizer from {model!r}: the directory holds no tokenizer file "
            f"({', '.join(TOKENIZER_FILES[:-1])} or {TOKENIZER_FILES[-1]}); causalqwen reads it from the model's directory"
        )
    try:
        config = AutoConfig.from_pretrained(model)
    except OSError as error:
        if os.path.isdir(model):
            raise
        raise OSError(f"cannot load {model!r} from the Hugging Face hub: {_one_line(error)}") from None
    except ValueError as error:  # a refused field: transformers does not tell the config class its file
        file = os.path.join(model, "config.json")
        if not os.path.isdir(model) or str(error).startswith(file):
            raise
        raise ValueError(f"{file}: {error}") from None
    tokenizer = NumericTokenizer.from_pretrained(model)
    if config.model_type == CausalQwenConfig.model_type:
        if init:
            raise ValueError(f"{model!r} is a saved CausalQwen, which keeps the initialization it was converted with; "
                             "--init, --abduction-scale-init, --ovr-threshold, --threshold-init and "
                             "--threshold-quantile apply when converting a Qwen2 base")
        loaded = CausalQwenForCausalLM.from_pretrained(model)
    else:
        loaded = CausalQwenForCausalLM.from_qwen(model, **init)
    if loaded.config.num_token_id != tokenizer.num_token_id:
        raise ValueError(
            f"{model}: the model's num_token_id ({loaded.config.num_token_id}) differs from the tokenizer's <NUM> id "
            f"({tokenizer.num_token_id})"
        )
    return loaded.eval(), tokenizer


def generate_text(
    prompts: list[str],
    model: str = TINY,
    mode: str = "standard",
    seed: int = 0,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    normalize: str = "softmax",
    use_cache: bool = True,
) -> list[str]:
    """Generate a continuation of each prompt (one left-padded batch); return prompt + continuation as text, the
    prompt exactly as given (its numbers as written) and the continuation told apart by token counts
    (`NumericTokenizer.decode_continuation`)."""
    import torch

    from .generation import generate

    causal_qwen, tokenizer = load_model_and_tokenizer(model, seed=seed)
    batch = tokenizer(prompts, padding_side="left")
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, normalize=normalize) if mode == "traditional" else {}
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
    texts = []
    for row, prompt in enumerate(prompts):
        kept = out.attention_mask[row].bool()  # the prompt's padding and what follows an EOS are dropped
        _, continuation = tokenizer.decode_continuation(
            out.sequences[row][kept], out.numeric_values[row][kept], int(batch["attention_mask"][row].sum()),
            out_of_vocab="mark", number_texts=batch.number_texts[row])
        texts.append(prompt + continuation)
    return texts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="causalqwen",
        description="CausalQwen reference implementation: a Cauchy abduction-action language model on Qwen2.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    walk = sub.add_parser(
        "walkthrough",
        help="run and print the whole forward pass on the embedded tiny Qwen2 base",
        description="Tokenize a text with numbers, run CausalQwen initialised from a tiny random Qwen2, "
        "print every stage, and check the initialization equivalence.",
    )
    walk.add_argument("--text", default=DEFAULT_TEXT, help="input text (default: %(default)r)")
    walk.add_argument("--seed", type=SEED, default=0, help="seed of the tiny base and the new modules (0 to 2**32 - 1)")

    gen = sub.add_parser(
        "generate",
        help="generate text (with numbers) from prompts, in any of the five inference modes",
        description="Continue each prompt with CausalQwen and print prompt + continuation, one per line; "
        "predicted numbers are written out in shortest float32 form. Ids of reserved rows (which an "
        "untrained model can predict) print as <unk:ID>.",
    )
    gen.add_argument(
        "--model",
        default=TINY,
        type=path_text,
        help="a directory saved with save_pretrained (model + tokenizer), a Qwen2 checkpoint directory or hub id "
        "(converted with from_qwen on load), or 'tiny' for the embedded random tiny base (default). " + SOURCE_HELP,
    )
    gen.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch")
    gen.add_argument("--mode", default="standard", choices=MODES, help="inference mode (default: %(default)s)")
    gen.add_argument("--seed", type=SEED, default=0, help="seed of every random draw, 0 to 2**32 - 1 (default: %(default)s)")
    gen.add_argument("--max-new-tokens", type=COUNT, default=32, help="tokens to add per prompt (default: %(default)s)")
    gen.add_argument("--temperature", type=float, default=1.0, help="traditional mode: softmax temperature")
    gen.add_argument("--top-k", type=COUNT, default=0, help="traditional mode: keep the k most probable tokens (0: all)")
    gen.add_argument("--top-p", type=float, default=1.0, help="traditional mode: nucleus mass in (0, 1]")
    gen.add_argument(
        "--normalize", default="softmax", choices=("softmax", "ovr"), help="traditional mode: softmax of loc_S or P/sum(P)"
    )
    gen.add_argument("--no-cache", action="store_true", help="rerun the whole sequence at every step (slow reference)")

    demo = sub.add_parser(
        "demo",
        help="the main job: train on the synthetic corpus from the tiny base and show that it learns",
        description="Build the embedded tiny Qwen2 base, convert it, train (preset 'all') on the synthetic corpus, "
        "print a before/after table and one sample per inference mode, write plots and the trained model. "
        "Exits 1 if the model did not learn (held-out num_f1 < 0.9 or reg_mdae > 0.5x its value at init). "
        "--out must be new, empty or an earlier demo's directory (replaced); anything else is refused.",
    )
    demo.add_argument("--out", default="artifacts/demo", type=path_text, help="output directory (default: %(default)s)")
    demo.add_argument("--steps", type=COUNT, default=None, help="training steps (default: the demo's 1500)")
    demo.add_argument("--seed", type=SEED, default=0, help="seed, 0 to 2**32 - 1 (default: %(default)s)")

    tr = sub.add_parser(
        "train",
        help="train CausalQwen from a Qwen2 checkpoint on a JSONL file of {\"text\": ...} lines",
        description="Convert --base with from_qwen (or load a saved CausalQwen), train with the chosen preset, "
        "and write metrics.jsonl, checkpoints and the final model (model/) to --out; with --preset lora also "
        "the adapters (adapter/), and model/ has them merged in.",
    )
    tr.add_argument("--base", required=True, type=path_text,
                    help="a Qwen2 checkpoint directory or hub id, or a saved CausalQwen. " + SOURCE_HELP)
    tr.add_argument("--data", required=True, type=path_text, help="training data: JSONL, one {\"text\": ...} per line")
    tr.add_argument("--eval-data", type=path_text, help="held-out JSONL for the eval/* metrics (default: none)")
    tr.add_argument("--out", required=True, type=path_text, help="output directory")
    tr.add_argument("--preset", default="causal",
                    help="causal (default), abduction, all, or lora (LoRA adapters on the Qwen2 stack + causal)")
    tr.add_argument("--lora-rank", type=integer(1), default=8,
                    help="preset lora: the adapters' rank, at most the base's hidden size (default: %(default)s)")
    tr.add_argument("--lora-alpha", type=float, default=16.0, help="preset lora: LoRA's alpha (default: %(default)s)")
    tr.add_argument("--steps", type=COUNT, default=1000)
    tr.add_argument("--batch-size", type=COUNT, default=8)
    tr.add_argument("--learning-rate", type=float, default=1e-4)
    tr.add_argument("--weight-decay", type=float, default=0.01)
    tr.add_argument("--warmup-steps", type=COUNT, default=50)
    tr.add_argument("--max-grad-norm", type=float, default=1.0)
    tr.add_argument("--max-length", type=COUNT, default=512, help="tokens per text (longer texts are cut)")
    tr.add_argument("--eval-every", type=COUNT, default=100)
    tr.add_argument("--save-every", type=COUNT, default=500)
    tr.add_argument("--log-every", type=COUNT, default=10, help="steps between training-metric records")
    tr.add_argument("--seed", type=SEED, default=0, help="seed, 0 to 2**32 - 1 (default: %(default)s)")
    again = tr.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue from the newest checkpoint in --out (same settings and data, checked); "
                       "after a Ctrl-C the command prints the exact command line")
    tr.add_argument("--allow-changed-settings", action="store_true",
                    help="with --resume: continue although settings or data differ from the checkpoint's")
    again.add_argument("--overwrite", action="store_true",
                       help="replace an earlier training run in --out (only the files a run writes are removed)")
    tr.add_argument("--report-to", choices=("tensorboard", "wandb"), help="also log there (package must be installed)")
    tr.add_argument("--max-u-divergence", type=float, default=None, metavar="EPS",
                    help="hold the mean KL divergence of the law of U from the starting model's at or below EPS "
                    "(nats per position, summed over U's components), by a Lagrange multiplier (default: no bound)")
    tr.add_argument("--divergence-dual-lr", type=float, default=None,
                    help="with --max-u-divergence: dual-ascent step of that multiplier (default: 1.0)")
    add_init_arguments(tr)

    conv = sub.add_parser("convert", help="from_qwen + save_pretrained: a Qwen2 checkpoint to a CausalQwen directory",
                          description="Convert a Qwen2 checkpoint (directory or hub id) and save model and tokenizer.")
    conv.add_argument("--base", required=True, type=path_text, help="a Qwen2 checkpoint directory or hub id, or 'tiny'. " + SOURCE_HELP)
    conv.add_argument("--out", required=True, type=path_text, help="output directory (must not exist, unless --overwrite)")
    conv.add_argument("--overwrite", action="store_true")
    add_init_arguments(conv)
    return parser


def add_init_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a conversion's initial scale and threshold (decision D14, `causalqwen.initialization`)."""
    group = parser.add_argument_group("initialization of a conversion from Qwen2 (decision D14)")
    group.add_argument("--init", choices=("d14", "drafts"), default=None,
                       help="d14 (the default): gamma = 0.1 and the threshold C from the base's own logits "
                       "(top_two_midpoint); drafts: the design drafts' gamma = 10, C = 100")
    group.add_argument("--abduction-scale-init", type=float, default=None, metavar="GAMMA",
                       help="the initial scale of U (default: the --init choice's)")
    group.add_argument("--ovr-threshold", type=float, default=None, metavar="C",
                       help="a fixed OvR threshold C (default: the --init choice's)")
    group.add_argument("--threshold-init", choices=("top_two_midpoint", "top_logit_quantile"), default=None,
                       help="compute C from the base by this rule (default: the --init choice's)")
    group.add_argument("--threshold-quantile", type=float, default=None, metavar="Q",
                       help="with --threshold-init top_logit_quantile: the quantile of the top logit, in (0, 1) "
                       "(default: 0.5)")


def init_keywords(args) -> dict:
    """The ``from_qwen`` keywords of `add_init_arguments`' options: nothing for the defaults (D14)."""
    from .initialization import DRAFT_INIT

    init = dict(DRAFT_INIT) if args.init == "drafts" else {}  # None or "d14": from_qwen's defaults
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
    if args.init == "d14" and not init:
        init = {"ovr_threshold_init": "top_two_midpoint"}  # said explicitly: refused for a saved CausalQwen too
    return init


# How the command's messages name the library's resume and overwrite keywords.
FLAG_NAMES = {"resume": "--resume", "overwrite": "--overwrite"}
INTERRUPTED = 130  # the exit status of a command ended by Ctrl-C (128 + SIGINT), as shells report it


def _report_interrupted_training(args) -> None:
    """Two lines on stderr after a Ctrl-C during ``train``: the last checkpoint (or that there is none) and
    the command that continues the run: this one, with ``--resume`` and without ``--overwrite``."""
    from .training import latest_checkpoint

    given = getattr(args, "argv", None) or ["train", "..."]
    words = [word for word in given if not (word.startswith("--ov") and "--overwrite".startswith(word))]
    again = shlex.join(["causalqwen", *words, *([] if args.resume else ["--resume"])])
    try:
        checkpoint = latest_checkpoint(args.out)
    except OSError as error:  # a checkpoint-N that is a link: resuming would refuse it
        print(f"causalqwen train: interrupted; {_one_line(error)}", file=sys.stderr)
        return
    if checkpoint is None:
        print(f"causalqwen train: interrupted before the first checkpoint (--save-every {args.save_every}): "
              "no step is saved", file=sys.stderr)
        print(f"start again with: {again}", file=sys.stderr)
    else:
        step = checkpoint.rsplit("-", 1)[1]
        print(f"causalqwen train: interrupted; the last checkpoint is {checkpoint} (step {step} of {args.steps})",
              file=sys.stderr)
        print(f"continue with: {again}", file=sys.stderr)


def train_command(args) -> int:
    """``causalqwen train``: a real checkpoint and JSONL data through the same loop as the demo.

    A Ctrl-C ends it with exit status 130 and two lines: the last checkpoint and the command that continues
    the run (``--resume``)."""
    from .data import TextDataset, collate, read_jsonl
    from .rundir import RunDirectory
    from .training import TrainingConfig, train

    config = TrainingConfig(
        steps=args.steps, batch_size=args.batch_size, learning_rate=args.learning_rate, weight_decay=args.weight_decay,
        warmup_steps=args.warmup_steps, max_grad_norm=args.max_grad_norm, preset=args.preset,
        eval_every=args.eval_every, save_every=args.save_every, log_every=args.log_every, seed=args.seed,
        report_to=args.report_to, max_u_divergence=args.max_u_divergence,
        divergence_dual_lr=1.0 if args.divergence_dual_lr is None else args.divergence_dual_lr,
    )
    if args.allow_changed_settings and not args.resume:
        raise ValueError("--allow-changed-settings applies to --resume only")
    if args.divergence_dual_lr is not None and args.max_u_divergence is None:
        raise ValueError("--divergence-dual-lr applies to --max-u-divergence only")
    # The data first: a bad file fails at once, not after a (possibly large) model has been loaded.
    texts, sources = read_jsonl(args.data)
    eval_texts, eval_sources = read_jsonl(args.eval_data) if args.eval_data else (None, None)
    import torch
    import torch.distributed as dist

    model, tokenizer = load_model_and_tokenizer(args.base, seed=args.seed, init=init_keywords(args))
    if config.preset == "lora":
        from .lora import add_lora

        if args.lora_rank > model.config.hidden_size:  # before peft allocates [rank, hidden] matrices
            raise ValueError(
                f"--lora-rank {args.lora_rank} exceeds the base's hidden size {model.config.hidden_size}: the rank "
                "of a LoRA update is at most the smaller dimension of its layer"
            )
        model = add_lora(model, rank=args.lora_rank, alpha=args.lora_alpha)
    if torch.cuda.is_available():  # one device per process, chosen before NCCL builds its communicator
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        model.to(device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():  # launched by torchrun
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    train_set = TextDataset(texts, tokenizer, args.max_length, sources)
    eval_batch = None
    if eval_texts is not None:
        eval_set = TextDataset(eval_texts, tokenizer, args.max_length, eval_sources)
        eval_batch = collate(eval_set.items, tokenizer.pad_token_id)
    writer = not dist.is_initialized() or dist.get_rank() == 0  # only rank 0 writes
    run_dir = RunDirectory.claim(args.out, "train", resume=args.resume, overwrite=args.overwrite,
                                 option_names=FLAG_NAMES) if writer else None
    interrupted = False
    try:
        train(model, train_set, config, eval_batch=eval_batch, out_dir=run_dir if writer else args.out,
              resume=args.resume, allow_changed_settings=args.allow_changed_settings)
        if writer:
            if config.preset == "lora":  # the adapters, then the model with them merged in
                from .lora import merge_lora, save_lora

                save_lora(model, os.path.join(args.out, "adapter"))
                print(f"LoRA adapters written to {os.path.join(args.out, 'adapter')}")
                model = merge_lora(model)
            model.save_pretrained(os.path.join(args.out, "model"))
            tokenizer.save_pretrained(os.path.join(args.out, "model"))
            print(f"trained model written to {os.path.join(args.out, 'model')}")
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
    model, tokenizer = load_model_and_tokenizer(args.base, init=init_keywords(args))
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    config = model.config
    print(f"CausalQwen (V = {config.vocab_size}, <NUM> id {config.num_token_id}, gamma = {config.abduction_scale_init:g}, "
          f"C = {config.ovr_threshold:.6g} ({config.ovr_threshold_init})) written to {args.out}")
    return 0


def _one_line(error: BaseException) -> str:
    """The message of ``error`` on one line (a CLI error never prints a traceback or a multi-line block)."""
    return " ".join(str(error).split()) or type(error).__name__


def _run(parser: argparse.ArgumentParser, args) -> int:
    if args.command == "walkthrough":
        return walkthrough(args.text, args.seed)
    if args.command == "demo":
        from .demo import DEMO_STEPS, run_demo

        return run_demo(args.out, DEMO_STEPS if args.steps is None else args.steps, args.seed)
    if args.command == "train":
        return train_command(args)
    if args.command == "convert":
        return convert_command(args)
    # generate
    if args.mode != "traditional" and (args.temperature, args.top_k, args.top_p, args.normalize) != (1.0, 0, 1.0, "softmax"):
        parser.error("--temperature, --top-k, --top-p and --normalize apply to --mode traditional only")
    texts = generate_text(
        args.prompt,
        args.model,
        args.mode,
        args.seed,
        args.max_new_tokens,
        args.temperature,
        args.top_k,
        args.top_p,
        args.normalize,
        use_cache=not args.no_cache,
    )
    for text in texts:
        print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the ``causalqwen`` command. Usage and data errors (a bad argument, file, setting or checkpoint)
    print one line naming what is wrong and exit with status 2; any other failure prints one line and
    exits with status 1; a Ctrl-C prints one line (``train``: two, the last checkpoint and the command
    that continues) and exits with status 130."""
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError

    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = argv  # for the command that continues an interrupted run
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return _run(parser, args)
    except KeyboardInterrupt:
        print(f"causalqwen {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except (ValueError, TypeError, OSError, StrictDataclassError, SafetensorError) as error:
        parser.error(_one_line(error))
    except RuntimeError as error:
        print(f"causalqwen {args.command}: error: {_one_line(error)}", file=sys.stderr)
        return 1

if __name__ == "__main__":
    sys.exit(main())
