import pytest

from mlxspec.targets.tokenizer import encode_prompt

pytestmark = pytest.mark.model

TEXTS = [
    "Hello world! 12345 The quick brown fox.",
    "  leading spaces\n\ttabs, émoji 🙂 and 中文",
    "def f(x):\n    return x ** 2  # comment\n",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(lm, text):
    tok = lm.tokenizer
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_digits_split_individually(lm):
    tok = lm.tokenizer
    ids = tok.encode("2024", add_special_tokens=False)
    assert [tok.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_special_tokens_are_single_ids(lm):
    tok = lm.tokenizer
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
    assert tok.eos_token_ids and 2 in tok.eos_token_ids  # <|im_end|> ends a turn


def test_chat_template_renders_expected_string(lm):
    ids = encode_prompt(lm.tokenizer, "What is 2+2?")
    assert lm.tokenizer.decode(ids) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_raw_prompt_skips_template(lm):
    assert lm.tokenizer.decode(encode_prompt(lm.tokenizer, "Once upon", raw=True)) == "Once upon"


def test_multi_turn_messages(lm):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    text = lm.tokenizer.decode(encode_prompt(lm.tokenizer, msgs))
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert text.endswith("<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n")


def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


BYTE_DECODER = _byte_decoder()


@pytest.mark.parametrize("pre, pieces", [
    ("llama-bpe", ["123", "45", " apples"]),  # llama3: digits in threes
    ("qwen2", ["1", "2", "3", "4", "5", " apples"]),
    ("smollm", ["1", "2", "3", "4", "5", " apples"]),
    (None, ["12345", " apples"]),  # GPT-2's regex keeps a number whole
])
def test_gguf_pre_tokenizer_follows_the_model(pre, pieces):
    from mlxspec.targets.tokenizer import pre_tokenizer

    split = [p for p, _ in pre_tokenizer(pre).pre_tokenize_str("12345 apples")]
    decoded = [bytes(bytearray(BYTE_DECODER[c] for c in p)).decode() for p in split]
    assert decoded == pieces
