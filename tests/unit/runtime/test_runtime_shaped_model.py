"""The benchmark's shaped model (chatfleet_platform.localruntime.shaped): a padded tokenizer and a cut model.

Test design: the padding is checked on a small target vocabulary (fast), the model's shape on one layer
built in memory; the full 151,936-entry build is the benchmark's business.
"""

from __future__ import annotations

import pytest
from needs import need_module


@pytest.fixture(scope="module")
def padded():
    """The tiny model's tokenizer padded to 1,500 entries."""
    need_module("torch", "run `make setup` (the runtime extra)")
    from chatfleet_platform.localruntime.shaped import pad_vocabulary
    from chatfleet_platform.localruntime.tiny import build_tokenizer

    return build_tokenizer(), pad_vocabulary(build_tokenizer(), 1500)


def test_padding_keeps_encoding_and_every_id_decodes(padded):
    from chatfleet_platform.localruntime.shaped import UNK_TOKEN

    trained, tok = padded
    messages = [{"role": "user", "content": "How do pods scale on Kubernetes? Thank you very much."}]
    render = {"add_generation_prompt": True, "tokenize": True}
    assert len(tok) == 1500
    assert tok.apply_chat_template(messages, **render) == trained.apply_chat_template(messages, **render)
    assert tok.convert_ids_to_tokens(1499) == UNK_TOKEN and tok.unk_token_id == 1499
    assert all(tok.decode([i]) for i in range(len(trained), 1499))
    assert tok.eos_token_id == trained.eos_token_id and tok.chat_template == trained.chat_template


def test_a_vocabulary_too_large_to_pad_is_refused(padded):
    from chatfleet_platform.localruntime.shaped import pad_vocabulary

    trained, _ = padded
    with pytest.raises(ValueError, match="cannot pad"):
        pad_vocabulary(trained, 10**7)


def test_model_has_qwen2_shape_cut_to_the_layers_asked(padded):
    from chatfleet_platform.localruntime.shaped import QWEN2_0_5B, build_model

    _, tok = padded
    model = build_model(tok, layers=1)
    cfg = model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        896,
        4864,
        14,
        2,
    )
    assert cfg.num_hidden_layers == 1 and len(model.model.layers) == 1
    assert cfg.vocab_size == QWEN2_0_5B["vocab_size"] and cfg.tie_word_embeddings
    with pytest.raises(ValueError, match="layers: 25"):
        build_model(tok, layers=25)
