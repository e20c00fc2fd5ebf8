"""The ``causalqwen`` command.

Subcommands so far:

* ``walkthrough`` -- one screen that runs the whole forward pass on the embedded tiny Qwen2 base:
  text with numbers -> ``<NUM>`` tokens and values -> Qwen2 features -> U -> decisions -> loss,
  and checks the initialization equivalence on the spot.

``demo``, ``train``, ``generate`` and ``convert`` arrive with the training and inference work.
"""

from __future__ import annotations

import argparse
import sys

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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "walkthrough":
        return walkthrough(args.text, args.seed)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
