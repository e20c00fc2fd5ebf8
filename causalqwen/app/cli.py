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

This module is the argument table (`build_parser`) and the dispatch (`main`); what each command does is in
`causalqwen.app.commands`.
"""

from __future__ import annotations

import argparse
import sys

from ..inference import MODES
from ..training import DEFAULT_WARMUP_RATIO
from .arguments import COUNT, SEED, input_text, integer, number_resolution, path_text
from .commands import (
    DEFAULT_SAVE_TOTAL_LIMIT,
    DEFAULT_TEXT,
    DTYPES,
    INTERRUPTED,
    SOURCE_HELP,
    TINY,
    convert_command,
    generate_text,
    one_line,
    train_command,
    walkthrough,
)
from .threads import THREADS_HELP, set_threads

# The subcommands, in the order ``causalqwen --help`` lists them: name -> (one-line help, description).
COMMANDS = {
    "walkthrough": (
        "run and print the whole forward pass on the embedded tiny Qwen2 base",
        "Tokenize a text with numbers, run CausalQwen initialised from a tiny random Qwen2, "
        "print every stage, and check the initialization equivalence.",
    ),
    "generate": (
        "generate text (with numbers) from prompts, in any of the five inference modes",
        "Continue each prompt with CausalQwen and print prompt + continuation, one per line; "
        "predicted numbers are written out in shortest float32 form. Ids of reserved rows (which an "
        "untrained model can predict) print as <unk:ID>.",
    ),
    "demo": (
        "the main job: train on the synthetic corpus from the tiny base and show that it learns",
        "Build the embedded tiny Qwen2 base, convert it, train (preset 'all') on the synthetic corpus, "
        "print a before/after table and one sample per inference mode, write plots and the trained model. "
        "Exits 1 if the model did not learn (held-out num_f1 < 0.9 or reg_mdae > 0.5x its value at init). "
        "--out must be new, empty or an earlier demo's directory (replaced); anything else is refused.",
    ),
    "train": (
        'train CausalQwen from a Qwen2 checkpoint on a JSONL file of {"text": ...} lines',
        "Convert --base with from_qwen (or load a saved CausalQwen), train with the chosen preset, "
        "and write metrics.jsonl, checkpoints and the final model (model/) to --out; with --preset lora also "
        "the adapters (adapter/), and model/ has them merged in.",
    ),
    "convert": (
        "from_qwen + save_pretrained: a Qwen2 checkpoint to a CausalQwen directory",
        "Convert a Qwen2 checkpoint (directory or hub id) and save model and tokenizer.",
    ),
}


# How the help of every option shows its default: "(default: %(default)s)" where the default is a value, else a
# phrase saying what the option's absence means ("(default: none)", "(default: off)"), or "(required)".
OFF = "(default: off)"


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, ``causalqwen COMMAND: error: ...``, with exit status 2,
    instead of argparse's usage block followed by the error; its sub-parsers are of the same class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="causalqwen",
        description="CausalQwen reference implementation: a Cauchy abduction-action language model on Qwen2.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    walk, gen, demo, tr, conv = (
        sub.add_parser(name, help=summary, description=description) for name, (summary, description) in COMMANDS.items()
    )
    walk.add_argument("--text", type=input_text, default=DEFAULT_TEXT, help="input text (default: %(default)r)")
    walk.add_argument(
        "--seed",
        type=SEED,
        default=0,
        help="seed of the tiny base and the new modules, 0 to 2**32 - 1 (default: %(default)s)",
    )

    gen.add_argument(
        "--model",
        default=TINY,
        type=path_text,
        help="a directory saved with save_pretrained (model + tokenizer), a Qwen2 checkpoint directory or hub id "
        "(converted with from_qwen on load), or 'tiny' for the embedded random tiny base. "
        + SOURCE_HELP
        + " (default: %(default)s)",
    )
    gen.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch (required)")
    gen.add_argument("--mode", default="standard", choices=MODES, help="inference mode (default: %(default)s)")
    gen.add_argument(
        "--seed", type=SEED, default=0, help="seed of every random draw, 0 to 2**32 - 1 (default: %(default)s)"
    )
    gen.add_argument("--max-new-tokens", type=COUNT, default=32, help="tokens to add per prompt (default: %(default)s)")
    gen.add_argument(
        "--temperature", type=float, default=1.0, help="traditional mode: softmax temperature (default: %(default)s)"
    )
    gen.add_argument(
        "--top-k",
        type=COUNT,
        default=0,
        help="traditional mode: keep the k most probable tokens, 0: all (default: %(default)s)",
    )
    gen.add_argument(
        "--top-p", type=float, default=1.0, help="traditional mode: nucleus mass in (0, 1] (default: %(default)s)"
    )
    gen.add_argument(
        "--normalize",
        default="softmax",
        choices=("softmax", "ovr"),
        help="traditional mode: softmax of loc_S or P/sum(P) (default: %(default)s)",
    )
    gen.add_argument(
        "--no-cache", action="store_true", help="rerun the whole sequence at every step (slow reference) " + OFF
    )
    gen.add_argument(
        "--number-resolution",
        type=number_resolution,
        default="prompt",
        metavar="H",
        help='how generated numbers are written: "prompt", at the prompt\'s finest resolution (the unit '
        "without a number), refined to keep two significant digits (causalqwen.writing); a power of "
        "ten (0.01 writes "
        '2.50); or "none", every digit of the float32 value (2.4996202); only the text is rounded '
        "(default: %(default)s)",
    )

    demo.add_argument("--out", default="artifacts/demo", type=path_text, help="output directory (default: %(default)s)")
    demo.add_argument("--steps", type=COUNT, default=None, help="training steps (default: the demo's 1500)")
    demo.add_argument("--seed", type=SEED, default=0, help="seed, 0 to 2**32 - 1 (default: %(default)s)")

    tr.add_argument(
        "--base",
        required=True,
        type=path_text,
        help="a Qwen2 checkpoint directory or hub id, or a saved CausalQwen. " + SOURCE_HELP + " (required)",
    )
    tr.add_argument(
        "--data",
        required=True,
        type=path_text,
        help='training data: JSONL, one {"text": ...} per line (every token scored) or one {"prompt": ..., '
        '"completion": ...} per line (the completion alone scored) (required)',
    )
    tr.add_argument(
        "--eval-data",
        type=path_text,
        help="held-out JSONL for the eval/* and dist/* metrics, printed and logged every --eval-every "
        "steps; prompt-completion rows add the answer's own figures, eval/answer_* (default: none)",
    )
    tr.add_argument(
        "--out",
        required=True,
        type=path_text,
        help="output directory: new, empty, or an earlier training run (with --resume or --overwrite) (required)",
    )
    tr.add_argument(
        "--preset",
        default="causal",
        help="what trains: causal, abduction, all, or lora (LoRA adapters on "
        "the Qwen2 stack + causal) (default: %(default)s)",
    )
    tr.add_argument(
        "--lora-rank",
        type=integer(1),
        help="preset lora only: the adapters' rank, at most the base's hidden size (default: add_lora's, 8)",
    )
    tr.add_argument("--lora-alpha", type=float, help="preset lora only: LoRA's alpha (default: add_lora's, 16)")
    tr.add_argument("--steps", type=COUNT, default=1000, help="optimizer steps (default: %(default)s)")
    tr.add_argument("--batch-size", type=COUNT, default=8, help="texts per step and process (default: %(default)s)")
    tr.add_argument(
        "--learning-rate",
        type=float,
        default=1e-4,
        help="AdamW's peak learning rate, reached after the warm-up, then cosine decay to 0 at --steps; the "
        "default suits a pretrained base: on the embedded random base (--base tiny), whose backbone learns from "
        "scratch, use about 3e-3 with --preset all, as the demo does (default: %(default)s)",
    )
    tr.add_argument(
        "--weight-decay",
        type=float,
        default=0.01,
        help="AdamW's decoupled weight decay, on matrices only (default: %(default)s)",
    )
    warmup = tr.add_mutually_exclusive_group()
    warmup.add_argument(
        "--warmup-steps",
        type=COUNT,
        default=None,
        metavar="N",
        help=f"steps of linear warm-up (default: ceil({DEFAULT_WARMUP_RATIO} x --steps), from "
        "--warmup-ratio; with --resume, the run's own warm-up)",
    )
    warmup.add_argument(
        "--warmup-ratio",
        type=float,
        default=None,
        metavar="R",
        help=f"warm-up as a fraction of --steps, in [0, 1]: ceil(R x steps) steps (default: "
        f"{DEFAULT_WARMUP_RATIO}; with --resume, the run's own warm-up)",
    )
    tr.add_argument(
        "--max-grad-norm",
        type=float,
        default=1.0,
        help="clip the global gradient norm at this value (default: %(default)s)",
    )
    tr.add_argument(
        "--max-length", type=COUNT, default=512, help="tokens per text, longer texts are cut (default: %(default)s)"
    )
    tr.add_argument(
        "--eval-every",
        type=COUNT,
        default=100,
        help="steps between eval metrics on --eval-data, one printed line each (default: %(default)s)",
    )
    tr.add_argument(
        "--save-every",
        type=COUNT,
        default=500,
        help="steps between checkpoints; the last step is always saved (default: %(default)s)",
    )
    tr.add_argument(
        "--save-total-limit",
        type=COUNT,
        default=DEFAULT_SAVE_TOTAL_LIMIT,
        metavar="N",
        help="keep the newest N checkpoints this run wrote, removing older ones; 0: keep all (default: %(default)s)",
    )
    tr.add_argument(
        "--log-every", type=COUNT, default=10, help="steps between training-metric records (default: %(default)s)"
    )
    tr.add_argument("--seed", type=SEED, default=0, help="seed, 0 to 2**32 - 1 (default: %(default)s)")
    tr.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="the parameters' dtype while training and in model/: float32 trains every parameter as "
        "float32, 4 bytes each (a 0.5B model takes 2 GB where its bfloat16 checkpoint takes 1 GB), plus "
        "AdamW's two float32 moments per trained parameter; bfloat16 keeps the frozen weights in "
        "bfloat16 and trains float32 master copies of the trained ones, written rounded to bfloat16; "
        "auto: the checkpoint's dtype; float16 is refused (its gradients need loss scaling) "
        "(default: %(default)s)",
    )
    again = tr.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in --out (same settings and data, checked); "
        "after a Ctrl-C the command prints the exact command line " + OFF,
    )
    tr.add_argument(
        "--allow-changed-settings",
        action="store_true",
        help="with --resume: continue although settings or data differ from the checkpoint's " + OFF,
    )
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier training run in --out (only the files a run writes are removed) " + OFF,
    )
    tr.add_argument(
        "--report-to",
        choices=("tensorboard", "wandb"),
        help="also log there, the package must be installed (default: none)",
    )
    tr.add_argument(
        "--max-u-divergence",
        type=float,
        default=None,
        metavar="EPS",
        help="hold the mean KL divergence of the law of U from the starting model's at or below EPS "
        "(nats per position, summed over U's components; EPS > 0), by a Lagrange multiplier and a projection "
        "after each step (default: no bound)",
    )
    tr.add_argument(
        "--divergence-dual-lr",
        type=float,
        default=None,
        help="with --max-u-divergence: dual-ascent step of that multiplier (default: 1.0)",
    )
    add_init_arguments(tr)

    conv.add_argument(
        "--base",
        required=True,
        type=path_text,
        help="a Qwen2 checkpoint directory or hub id, or 'tiny'. " + SOURCE_HELP + " (required)",
    )
    conv.add_argument(
        "--out",
        required=True,
        type=path_text,
        help="output directory, which must not exist unless --overwrite (required)",
    )
    conv.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier convert's output in --out (only a directory holding a CausalQwen model) " + OFF,
    )
    conv.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="the saved model's dtype; auto: the base checkpoint's, as transformers' "
        "from_pretrained(dtype='auto') loads it (its config.json's dtype); the conversion itself runs "
        "in the checkpoint's dtype and the result is cast (default: %(default)s)",
    )
    add_init_arguments(conv)
    for command in (gen, tr, conv):
        command.add_argument("--threads", type=integer(1), default=None, metavar="N", help=THREADS_HELP)
    demo.add_argument(
        "--threads",
        type=integer(1),
        default=None,
        metavar="N",
        help="intra-op threads of torch, at least 1 (default: 1: the tiny model's kernels are too small for a second "
        "thread to pay off, and beside a busy process spinning threads collapse)",
    )
    return parser


def add_init_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a conversion's initial scale and threshold (`causalqwen.initialization`)."""
    group = parser.add_argument_group("initialization of a conversion from Qwen2")
    group.add_argument(
        "--init",
        choices=("calibrated", "drafts"),
        default=None,
        help="calibrated: gamma = 0.1 and the threshold C from the base's own logits "
        "(top_two_midpoint); drafts: the design drafts' gamma = 10, C = 100 (default: calibrated)",
    )
    group.add_argument(
        "--abduction-scale-init",
        type=float,
        default=None,
        metavar="GAMMA",
        help="the initial scale of U (default: the --init choice's)",
    )
    group.add_argument(
        "--ovr-threshold",
        type=float,
        default=None,
        metavar="C",
        help="a fixed OvR threshold C (default: the --init choice's)",
    )
    group.add_argument(
        "--threshold-init",
        choices=("top_two_midpoint", "top_logit_quantile"),
        default=None,
        help="compute C from the base by this rule (default: the --init choice's)",
    )
    group.add_argument(
        "--threshold-quantile",
        type=float,
        default=None,
        metavar="Q",
        help="with --threshold-init top_logit_quantile: the quantile of the top logit, in (0, 1) (default: 0.5)",
    )


def _run(parser: argparse.ArgumentParser, args) -> int:
    if args.command == "walkthrough":
        return walkthrough(args.text, args.seed)
    if args.command == "demo":
        from .demo import DEMO_STEPS, DEMO_THREADS, run_demo

        steps = DEMO_STEPS if args.steps is None else args.steps
        return run_demo(args.out, steps, args.seed, threads=DEMO_THREADS if args.threads is None else args.threads)
    if args.command in ("train", "convert", "generate"):
        set_threads(args.threads)
    if args.command == "train":
        return train_command(args)
    if args.command == "convert":
        return convert_command(args)
    # generate
    if args.mode != "traditional" and (args.temperature, args.top_k, args.top_p, args.normalize) != (
        1.0,
        0,
        1.0,
        "softmax",
    ):
        raise ValueError("--temperature, --top-k, --top-p and --normalize apply to --mode traditional only")
    texts = generate_text(
        args.prompt,
        args.model,
        args.mode,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        normalize=args.normalize,
        use_cache=not args.no_cache,
        number_resolution=args.number_resolution,
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
        parser.exit(2, f"causalqwen {args.command}: error: {one_line(error)}\n")  # SystemExit(2), as a usage error
    except RuntimeError as error:
        print(f"causalqwen {args.command}: error: {one_line(error)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
