"""A multi-turn chat on the real embedded model: the last question is grounded from the memory store."""

from __future__ import annotations

import pytest

from surprisegate.config import Config
from surprisegate.gate.loop import generate
from surprisegate.gate.receipts import ConvergenceRecord, conversation_sha256

pytestmark = pytest.mark.slow

CHAT = [
    {"role": "user", "content": "Hi! I am planning a trip to West Africa next spring."},
    {"role": "assistant", "content": "That sounds exciting! Which countries are you thinking of visiting?"},
    {"role": "user", "content": "What is the capital of Burkina Faso?"},
]


@pytest.fixture(scope="module")
def factkb(tmp_path_factory, shared_data):
    from surprisegate.arms.memory import MemoryArm
    from surprisegate.store.open import open_memory

    store = open_memory(str(tmp_path_factory.mktemp("kb") / "factkb.sqlite"), create=True)
    store.add_jsonl(shared_data / "factkb_passages.jsonl")
    return {"memory": MemoryArm(store)}


def test_a_three_turn_chat_is_grounded_on_its_last_question(llama_backend, factkb):
    config = Config(mode="intervene")
    off = generate(llama_backend, CHAT, config.replace(mode="off"))
    assert "Ouagadougou" not in off.text
    on = generate(llama_backend, CHAT, config, factkb)
    assert "Ouagadougou" in on.text
    (first, *_) = on.rounds
    assert first["action"] == "rewound" and first["chosen"]["source"] == "memory:country:BF"
    # The arms were asked the last user turn, not the greeting.
    memory = next(a for a in first["arms"] if a["arm"] == "memory")
    assert memory["query"]["question"] == CHAT[-1]["content"]
    receipt = on.receipt
    sent = [{"role": "system", "content": config.system_prompt}, *CHAT]
    assert receipt["messages"] == sent and receipt["conversation_sha256"] == conversation_sha256(sent)
    assert receipt["prompt"] == CHAT[-1]["content"] and receipt["rounds"][0]["action"] == "rewound"
    # The schema: every round of a real receipt is exactly what a ConvergenceRecord writes.
    for round_ in receipt["rounds"]:
        assert ConvergenceRecord.from_dict(round_).to_dict() == round_
    assert {"tokens_trimmed", "rewind_method", "injected_text"} <= set(first)
    # The same question alone hashes differently: the receipt pins the whole conversation.
    alone = generate(llama_backend, CHAT[-1]["content"], config.replace(mode="off"))
    assert alone.receipt["conversation_sha256"] != receipt["conversation_sha256"]


def test_a_chat_must_end_with_the_users_turn(llama_backend):
    from surprisegate.errors import InputError

    with pytest.raises(InputError, match=r"messages\[-1\].*user turn"):
        generate(llama_backend, CHAT[:2], Config(mode="off"))
    with pytest.raises(InputError, match=r"messages\[0\]"):
        generate(llama_backend, [{"role": "robot", "content": "hi"}], Config(mode="off"))
