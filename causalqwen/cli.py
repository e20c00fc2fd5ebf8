"""The ``causalqwen`` command.

Subcommands so far:

* ``walkthrough`` -- one screen that runs the whole forward pass on the embedded tiny Qwen2 base:
  text with numbers -> ``<NUM>`` tokens and values -> Qwen2 features -> U -> decisions -> loss,
  and checks the initialization equivalence on the spot.
* ``generate`` -- text in, text out, with any of the five inference modes, from a saved CausalQwen
  directory, a Qwen2 checkpoint (converted on load) or the embedded tiny base.

``demo``, ``train`` and ``convert`` arrive with the training work.
"""

from __future__ import annotations

import argparse
import os
import sys

from .inference import MODES

DEFAULT_TEXT = "The price is 99.9 yuan; 温度-15.5度 in 2020-2021, up 1,250 units."


def _shape(t) -> str:
    return "[" + ", ".join(str(d) for d in t.shape) + "]"


def walkthrough(text: str = DEFAULT_TEXT, seed: int = 0) -> int:
    """Print the forward pass of CausalQwen on the tiny base for ``text``; return a process exit code."""
    import torch

    from .modeling import CausalQwenForCausalLM
    from .tiny import build_tiny_base
    from .tokenization import NumericTokenizer

    torch.manual_seed(seed)
    qwen, hf_tokenizer = build_tiny_base(seed=seed)
    tokenizer = NumericTokenizer(hf_tokenizer)
    model = CausalQwenForCausalLM.from_qwen(qwen, num_token_id=tokenizer.num_token_id).eval()
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
        out = model(ids, numeric_values=values, labels=ids)
        plain = model(ids)  # the same tokens with every value set to 0
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


def load_model_and_tokenizer(model: str = TINY, seed: int = 0):
    """``(CausalQwenForCausalLM, NumericTokenizer)`` from ``model``, in eval mode.

    ``model`` is ``"tiny"`` (the embedded tiny Qwen2 base, converted with ``from_qwen``; random
    weights), a directory written by ``save_pretrained`` (model and tokenizer), or a Qwen2
    checkpoint path / hub id, converted with ``from_qwen`` on load. ``seed`` seeds the
    initialization of whatever is newly built.
    """
    import torch
    from transformers import AutoConfig

    from .modeling import CausalQwenConfig, CausalQwenForCausalLM
    from .tiny import build_tiny_base
    from .tokenization import NumericTokenizer

    torch.manual_seed(seed)
    if model == TINY:
        qwen, hf_tokenizer = build_tiny_base(seed=seed)
        tokenizer = NumericTokenizer(hf_tokenizer)
        return CausalQwenForCausalLM.from_qwen(qwen, num_token_id=tokenizer.num_token_id).eval(), tokenizer
    if (os.path.isabs(model) or model.startswith((".", "~"))) and not os.path.isdir(os.path.expanduser(model)):
        raise ValueError(f"model directory {model!r} does not exist")
    config = AutoConfig.from_pretrained(model)
    tokenizer = NumericTokenizer.from_pretrained(model)
    if config.model_type == CausalQwenConfig.model_type:
        loaded = CausalQwenForCausalLM.from_pretrained(model)
    else:
        loaded = CausalQwenForCausalLM.from_qwen(model)
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
    """Generate a continuation of each prompt (one left-padded batch); return prompt + continuation as text."""
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
    return tokenizer.batch_decode(out.sequences, out.numeric_values, out_of_vocab="mark")


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
    walk.add_argument("--seed", type=int, default=0, help="seed of the tiny base and the new modules")

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
        help="a directory saved with save_pretrained (model + tokenizer), a Qwen2 checkpoint path or hub id "
        "(converted with from_qwen on load), or 'tiny' for the embedded random tiny base (default)",
    )
    gen.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch")
    gen.add_argument("--mode", default="standard", choices=MODES, help="inference mode (default: %(default)s)")
    gen.add_argument("--seed", type=int, default=0, help="seed of every random draw (default: %(default)s)")
    gen.add_argument("--max-new-tokens", type=int, default=32, help="tokens to add per prompt (default: %(default)s)")
    gen.add_argument("--temperature", type=float, default=1.0, help="traditional mode: softmax temperature")
    gen.add_argument("--top-k", type=int, default=0, help="traditional mode: keep the k most probable tokens (0: all)")
    gen.add_argument("--top-p", type=float, default=1.0, help="traditional mode: nucleus mass in (0, 1]")
    gen.add_argument(
        "--normalize", default="softmax", choices=("softmax", "ovr"), help="traditional mode: softmax of loc_S or P/sum(P)"
    )
    gen.add_argument("--no-cache", action="store_true", help="rerun the whole sequence at every step (slow reference)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "walkthrough":
        return walkthrough(args.text, args.seed)
    if args.command == "generate":
        if args.mode != "traditional" and (args.temperature, args.top_k, args.top_p, args.normalize) != (1.0, 0, 1.0, "softmax"):
            parser.error("--temperature, --top-k, --top-p and --normalize apply to --mode traditional only")
        try:
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
        except (ValueError, TypeError, OSError) as error:
            parser.error(str(error))
        for text in texts:
            print(text)
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
