"""Recording training data: a given reply is read in one prefill and labelled with the
target's own next tokens; a generated one is the target's greedy reply; both survive the
shards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.train.data import Conversation
from specserve.train.generate import generate_training_data, load_sequences, target_tokens
from specserve.train.run import recorded_layers, target_lm_head


def test_given_and_generated_replies_in_one_run(smollm2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model, tok = smollm2.model, smollm2.tokenizer
    given = Conversation("given", (("user", "Name a colour."),), "Blue, like the sky at noon.")
    generated = Conversation("generated", (("user", "Count to five."),))
    layers = recorded_layers(model.cfg.num_layers)
    lm_head = target_lm_head(model)
    with pytest.raises(ValueError, match="lm_head"):
        generate_training_data(smollm2, [given], tmp_path / "w0", layers, max_tokens=4)
    stats = generate_training_data(smollm2, [given, generated], tmp_path / "w", layers,
                                   max_tokens=12, max_num_seqs=2, lm_head=lm_head)  # fmt: skip
    seqs = {s.id: s for s in load_sequences(tmp_path / "w")}
    assert stats["sequences"] == 2 and set(seqs) == {"given", "generated"}

    g = seqs["given"]
    prompt = tok.encode_chat(given.as_chat())  # the reply is tokenized after the prompt's tokens
    whole = prompt + tok.encode(
        tok.apply_chat_template(given.with_reply(), add_generation_prompt=False)[
            len(tok.apply_chat_template(given.as_chat())) :
        ],
        add_special_tokens=False,
    )
    assert g.tokens.tolist() == whole and g.prompt_len == len(prompt)
    assert tok.decode(whole[len(prompt) :]).startswith(given.reply or "")
    assert g.hidden.shape == (len(whole) - 1, len(layers) * model.cfg.hidden_size)
    assert g.targets is not None and g.targets[0] == whole[0]
    # the labels are the target's argmax after each position, from one plain forward
    cache = SingleSequenceCache(model, len(whole))
    with torch.inference_mode():
        logits = model.compute_logits(cache.forward(whole[:-1]))
    assert (g.targets[1:] == logits.argmax(-1)).float().mean() > 0.98  # bf16 hidden: near-ties
    assert not torch.equal(g.targets, g.tokens)  # the text is not what the model writes
    assert torch.equal(g.labels, g.targets)

    r = seqs["generated"]
    assert r.targets is None and torch.equal(r.labels, r.tokens)
    assert len(r.tokens) - r.prompt_len == stats["tokens"] - (len(whole) - g.prompt_len)
    assert torch.equal(target_tokens(whole, g.hidden, lm_head), g.targets)
