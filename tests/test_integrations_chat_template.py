"""Chat templates (`causalqwen.integrations.chat_template`): ``apply_chat_template`` keeps the template's
special tokens and the numbers of the messages; a number token typed in a message stays text.
"""

import numpy as np
import pytest

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_apply_chat_template_keeps_the_templates_special_tokens_and_the_numbers(tiny):
    _, tok = tiny
    messages = [{"role": "user", "content": "What is 2.5 plus 37?"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=CHATML)
    assert rendered == "<|im_start|>user\nWhat is 2.5 plus 37?<|im_end|>\n<|im_start|>assistant\n"
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, chat_template=CHATML)
    # oracle: the wrapped tokenizer itself, special-token matching on, the numbers written as <NUM> by hand
    by_hand = "<|im_start|>user\nWhat is <NUM> plus <NUM>?<|im_end|>\n<|im_start|>assistant\n"
    expected = tok.hf_tokenizer(by_hand, add_special_tokens=False)["input_ids"]
    assert enc.input_ids[0].tolist() == expected
    assert enc.input_ids[0, 0].item() == tok.convert_tokens_to_ids("<|im_start|>")
    numbers = enc.numeric_values[0][enc.input_ids[0] == tok.num_token_id].tolist()
    assert numbers == [float(np.float32(2.5)), 37.0] and enc.number_texts == [["2.5", "37"]]
    assert tok.batch_decode(enc, skip_special_tokens=False) == [rendered]


def test_a_typed_number_token_in_a_message_stays_text(tiny):
    _, tok = tiny
    messages = [[{"role": "user", "content": "<NUM> is 4"}], [{"role": "user", "content": "hi"}]]
    enc = tok.apply_chat_template(messages, chat_template=CHATML, return_tensors=None)
    assert [row.count(tok.num_token_id) for row in enc["input_ids"]] == [1, 0]  # the 4 alone
    lengths = [sum(mask) for mask in enc["attention_mask"]]
    assert lengths[1] < lengths[0] and enc["attention_mask"][1][0] == 0  # the shorter row padded on the left
    with pytest.raises(ValueError, match="return_dict=False would give the ids without"):
        tok.apply_chat_template(messages[0], chat_template=CHATML, return_dict=False)
