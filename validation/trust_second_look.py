"""Trust boundaries, round three (issue 27), the second look: what a fresh-eyes pass from outside found next.

On a clean clone, beyond the issue's list: optimisation settings that wreck the weights and exit 0,
nonsense backbone fields, a generation mode lost on reload, a ``trainer_state.json`` that contradicts its
checkpoint, a stray checkpoint name, options of transformers' ``generate`` that would lose the values.
`SECOND_LOOK_CASES` closes `validation.trust_round_three.ROUND_THREE_CASES`.
"""

from __future__ import annotations

import os

import torch

from .cases import TrustCase, WrongResult, command_line_refusal, run_cli
from .fixtures import (
    edit_json,
    encoded_batch,
    finished_run,
    fresh_dir,
    fresh_tiny_model,
    jsonl_file,
    load_edited_config,
    model_generate_trigger,
    shared_tiny,
    train_tiny,
)

__all__ = ["SECOND_LOOK_CASES"]


def _training_settings(**settings):
    def trigger():
        from causalqwen.training import TrainingConfig

        TrainingConfig(**settings)

    return trigger


def _rope_theta_zero(config: dict) -> None:
    config["rope_parameters"]["rope_theta"] = 0


def _saved_generation_mode():
    from causalqwen import CausalQwenForCausalLM

    model = fresh_tiny_model()
    model.generation_config.mode = "causal"
    path = os.path.join(fresh_dir("mode"), "model")
    model.save_pretrained(path)
    mode = getattr(CausalQwenForCausalLM.from_pretrained(path).generation_config, "mode", None)
    if mode != "causal":
        raise WrongResult(f"the saved mode 'causal' came back as {mode!r}")


def _trainer_state_edit(edit):
    def trigger():
        out = finished_run()
        edit_json(os.path.join(out, "checkpoint-2", "trainer_state.json"), edit)
        train_tiny(out, resume=True, steps=4, save_every=2)

    return trigger


def _step_100(state: dict) -> None:
    state["step"] = 100


def _weight_decay_1e9(state: dict) -> None:
    state["optimizer_param_groups"][0]["weight_decay"] = 1e9


def _stray_checkpoint_name():
    out = finished_run()
    os.makedirs(os.path.join(out, "checkpoint-0005"))
    train_tiny(out, resume=True, steps=4, save_every=2)


def _tiny_temperature_both_paths():
    from causalqwen import generate

    _, batch = encoded_batch()
    model = shared_tiny().model
    greedy = generate(model, batch["input_ids"], batch["numeric_values"], mode="traditional", top_k=1, max_new_tokens=2)
    sampled = model.generate(batch["input_ids"], numeric_values=batch["numeric_values"], mode="traditional",
                             do_sample=True, temperature=1e-46, max_new_tokens=2, return_dict_in_generate=True)
    if not torch.equal(sampled.sequences, greedy.sequences):
        raise WrongResult(f"temperature 1e-46 gave {sampled.sequences.tolist()}, greedy {greedy.sequences.tolist()}")


def _dual_lr_without_bound():
    data = jsonl_file("data.jsonl", b'{"text": "The price is 12.5 yuan."}\n' * 8)
    run_cli(["train", "--base", "tiny", "--data", data, "--out", os.path.join(fresh_dir("dual"), "run"),
             "--steps", "1", "--divergence-dual-lr", "5"])


SECOND_LOOK_CASES = [
    TrustCase("weight-decay-1e300", "silent", "train --weight-decay 1e300 (exit 0, a model of inf and NaN written)",
              _training_settings(weight_decay=1e300), ValueError, r"weight_decay must be a finite number within float32's range"),
    TrustCase("decay-factor-below-0", "silent", "learning_rate 0.5 with weight_decay 2 (AdamW flips the weights' sign)",
              _training_settings(learning_rate=0.5, weight_decay=2.0), ValueError, r"learning_rate \* weight_decay must be < 1"),
    TrustCase("config-rms-norm-eps-negative", "silent", "config.json with rms_norm_eps -1.0 (every loc_S NaN, exit 0)",
              load_edited_config(lambda config: config.update(rms_norm_eps=-1.0)), ValueError,
              r"config\.json: .*rms_norm_eps must be a number in \(0, 1e\+30\]"),
    TrustCase("config-rope-theta-zero", "silent", "config.json with rope_theta 0 (loc_S silently changed)",
              load_edited_config(_rope_theta_zero), ValueError, r"config\.json: .*rope_theta must be a finite number in \(0"),
    TrustCase("generation-mode-survives-reload", "silent", "a saved generation_config.mode (dropped on reload: standard ran)",
              _saved_generation_mode, None),
    TrustCase("trainer-state-step-edited", "silent", "resume from checkpoint-2 whose trainer_state.json says step 100 (finished at once)",
              _trainer_state_edit(_step_100), OSError, r"trainer_state\.json' records step 100, but its directory is checkpoint-2"),
    TrustCase("trainer-state-weight-decay-edited", "silent", "resume with weight_decay 1e9 in trainer_state.json (weights driven to 1.9e9)",
              _trainer_state_edit(_weight_decay_1e9), OSError, r"contradicts its checkpoint .*weight_decay is 1000000000\.0"),
    command_line_refusal("dual-lr-without-bound", "silent", "train --divergence-dual-lr 5 without --max-u-divergence (ignored)",
                         _dual_lr_without_bound, r".*--divergence-dual-lr applies to --max-u-divergence only"),
    TrustCase("config-hidden-act-unknown", "clarity", 'config.json with hidden_act "bogus" (KeyError)',
              load_edited_config(lambda config: config.update(hidden_act="bogus")), ValueError,
              r"config\.json: .*hidden_act must be one of .*got 'bogus'"),
    TrustCase("config-pad-token-beyond-vocab", "clarity", "config.json with pad_token_id 99999 (AssertionError)",
              load_edited_config(lambda config: config.update(pad_token_id=99999)), ValueError,
              r"config\.json: .*pad_token_id must be null or an id in \[0, vocab_size=\d+\), got 99999"),
    TrustCase("stray-checkpoint-name", "clarity", "resume with a stray checkpoint-0005 directory (went to the hub)",
              _stray_checkpoint_name, OSError, r"checkpoint-0005' is not a checkpoint name this run writes"),
    TrustCase("temperature-0-in-float32", "clarity", "model.generate(do_sample=True, temperature=1e-46) (probability tensor contains nan)",
              _tiny_temperature_both_paths, None),
    TrustCase("generate-prompt-lookup", "clarity", "model.generate(prompt_lookup_num_tokens=2) (AttributeError from inside)",
              model_generate_trigger(prompt_lookup_num_tokens=2), ValueError, r"prompt_lookup_num_tokens is not supported"),
    TrustCase("generate-generator-int", "clarity", "model.generate(mode='causal', generator=123) (a raw torch TypeError)",
              model_generate_trigger(mode="causal", generator=123), TypeError, r"generator must be a torch\.Generator, got int"),
]
