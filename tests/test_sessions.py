"""A session per request (issue 10 item 4): one loaded llama.cpp model holds several sessions, each on
its own sequence id, and sessions driven from different threads decode together in one llama_batch.

Fast tests drive the batcher over a fake llama.cpp; slow ones load the embedded model and show that
4 sessions decoded together, with rewinds, give the replies each gives alone on the one-context backend
(greedy), measuring the logit differences at every step.

Measured numbers (logit differences, argmax changes, tokens/s batched vs one after another) go to
results/sessions/sessions.json with:

    .venv/bin/python tests/test_sessions.py --out results/sessions/sessions.json
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from surprisegate.backends import Sampling, Session
from surprisegate.errors import BackendError

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DEMO_QUESTION = "What is the capital of Burkina Faso?"  # `surprisegate demo`'s question (cli.DEMO_QUESTION)
DEMO_EVIDENCE = "The capital of Burkina Faso is Ouagadougou."  # what the demo memory grounds it with
N_SESSIONS = 4
MAX_TOKENS = 32
SEED = 10  # which 20 factqa_dev questions


# ------------------------------------------------------------------------------------------------
# Fast: the batcher over a fake llama.cpp
# ------------------------------------------------------------------------------------------------
class FakeLlamaCpp:
    """The few llama.cpp calls `_Batcher` makes. A decode's logits row is one-hot at (token + pos + seq),
    so every session can check it got its own row; decodes record what they held and may take time."""

    def __init__(self, n_vocab: int = 64, delay: float = 0.0, fail: int = 0) -> None:
        self.n_vocab, self.delay, self.fail = n_vocab, delay, fail
        self.decodes: list[list[tuple[int, int, int]]] = []  # (seq, pos, token) per decode
        self.removed: list[tuple[int, int]] = []
        self.in_decode = False
        self.overlaps = 0  # cache edits seen while a decode ran (must stay 0)
        self._rows = None

    def llama_get_memory(self, ctx):
        return "memory"

    def llama_batch_init(self, n, embd, n_seq_max):
        return SimpleNamespace(
            n_tokens=0, token=[0] * n, pos=[0] * n, n_seq_id=[0] * n, seq_id=[[0] for _ in range(n)], logits=[False] * n
        )

    def llama_batch_free(self, batch):
        pass

    def llama_memory_seq_rm(self, mem, seq, p0, p1):
        self.overlaps += self.in_decode and threading.current_thread().name != "decoder"
        self.removed.append((seq, p0))
        return True

    def llama_memory_seq_pos_max(self, mem, seq):
        return -1

    def llama_decode(self, ctx, batch):
        self.in_decode = True
        try:
            held = [(batch.seq_id[i][0], batch.pos[i], batch.token[i]) for i in range(batch.n_tokens)]
            self.decodes.append(held)
            if self.delay:
                time.sleep(self.delay)
            if self.fail:
                return self.fail
            self._rows = (ctypes.c_float * (batch.n_tokens * self.n_vocab))()
            for i, (seq, pos, token) in enumerate(held):
                self._rows[i * self.n_vocab + (token + pos + seq) % self.n_vocab] = 1.0
            return 0
        finally:
            self.in_decode = False

    def llama_get_logits_ith(self, ctx, i):
        return ctypes.cast(ctypes.byref(self._rows, i * self.n_vocab * 4), ctypes.POINTER(ctypes.c_float))


def fake_batcher(gather_ms=5.0, n_batch=16, **kw):
    from surprisegate.backends.llamacpp import _Batcher

    lc = FakeLlamaCpp(**kw)
    return lc, _Batcher(lc, SimpleNamespace(ctx="ctx"), lc.n_vocab, n_batch, gather_ms / 1000)


def test_steps_submitted_together_share_one_decode_and_each_gets_its_own_row():
    lc, batcher = fake_batcher(delay=0.05)
    got = {}
    start = threading.Barrier(4)

    def session(seq):
        start.wait()
        logits, shared = batcher.forward(seq, 10 * seq, [seq + 1])
        got[seq] = (int(np.argmax(logits)), shared)

    threads = [threading.Thread(target=session, args=(s,)) for s in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for seq in range(4):  # token seq+1 at position 10*seq of sequence seq
        assert got[seq][0] == (seq + 1 + 10 * seq + seq) % lc.n_vocab
    # The first arrival may decode alone; the others queue during its decode and go in one batch.
    assert len(lc.decodes) <= 2 and sum(len(d) for d in lc.decodes) == 4
    assert max(shared for _, shared in got.values()) >= 3


def test_sessions_in_lockstep_settle_into_one_decode_per_step():
    lc, batcher = fake_batcher(delay=0.01, gather_ms=50)
    steps = 10

    def session(seq):
        for i in range(steps):
            batcher.forward(seq, i, [seq])
            time.sleep(0.001)  # sampling the next token

    threads = [threading.Thread(target=session, args=(s,)) for s in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sum(len(d) for d in lc.decodes) == 4 * steps
    assert len(lc.decodes) <= steps + 2  # not one decode per session per step


def test_a_lone_session_never_waits_for_others():
    lc, batcher = fake_batcher(gather_ms=300)
    batcher.forward(1, 0, [1])  # session 1 decodes once, then goes off (to ground a claim, say)
    started = time.monotonic()
    batcher.forward(0, 0, [5])  # the next decode waits for session 1 once, at most gather_ms ...
    assert batcher.gather_timeouts == 1 and time.monotonic() - started >= 0.25
    for pos in range(1, 11):  # ... and then no more: the last decode did not serve it
        batcher.forward(0, pos, [7])
    assert batcher.gather_timeouts == 1
    lc2, alone = fake_batcher(gather_ms=5000)
    started = time.monotonic()
    for pos in range(20):
        alone.forward(0, pos, [3])
    assert alone.gather_timeouts == 0 and time.monotonic() - started < 5.0
    assert all(len(d) == 1 for d in lc.decodes + lc2.decodes)


def test_a_closed_session_is_no_longer_waited_for():
    lc, batcher = fake_batcher(gather_ms=5000)
    batcher.forward(0, 0, [1])  # session 0 is expected back ...
    batcher.forget(0)  # ... until it closes
    batcher.forward(1, 0, [2])
    assert batcher.gather_timeouts == 0


def test_a_failed_decode_reaches_every_session_in_it():
    lc, batcher = fake_batcher(fail=1, delay=0.05)
    errors = []
    start = threading.Barrier(3)

    def session(seq):
        start.wait()
        try:
            batcher.forward(seq, 0, [seq])
        except BackendError as err:
            errors.append(str(err))

    threads = [threading.Thread(target=session, args=(s,)) for s in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(errors) == 3 and all("llama_decode returned 1" in e and "no KV slot" in e for e in errors)
    lc.fail = 0
    assert batcher.forward(0, 0, [1])[0].shape == (lc.n_vocab,)  # the batcher is usable again


def test_cache_edits_never_run_during_a_decode():
    lc, batcher = fake_batcher(delay=0.02)
    stop = threading.Event()

    def decoder():
        pos = 0
        while not stop.is_set():
            batcher.forward(0, pos, [1])
            pos += 1

    t = threading.Thread(target=decoder, name="decoder")
    t.start()
    for _ in range(20):
        assert batcher.seq_rm(1, 0)
    stop.set()
    t.join()
    assert lc.overlaps == 0 and (1, 0) in lc.removed


def test_a_session_rewinding_is_not_waited_for():
    lc, batcher = fake_batcher(gather_ms=5000)
    batcher.forward(1, 0, [1])  # session 1 is expected back with its next step ...
    other = threading.Thread(target=batcher.forward, args=(0, 0, [2]))
    other.start()  # ... so session 0's decode gathers
    time.sleep(0.2)
    started = time.monotonic()
    assert batcher.seq_rm(1, 0)  # ... but session 1 rewinds instead: the decode goes, then the edit
    other.join()
    assert time.monotonic() - started < 4.0 and batcher.gather_timeouts == 0


def test_steps_that_do_not_fit_wait_for_the_next_decode():
    lc, batcher = fake_batcher(n_batch=2, delay=0.05)
    start = threading.Barrier(5)

    def session(seq):
        start.wait()
        batcher.forward(seq, 0, [seq])

    threads = [threading.Thread(target=session, args=(s,)) for s in range(5)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert max(len(d) for d in lc.decodes) <= 2 and sum(len(d) for d in lc.decodes) == 5
    with pytest.raises(ValueError):
        batcher.forward(0, 0, [1, 2, 3])


def test_a_longer_part_goes_alone_and_whole():
    # Beside others, llama.cpp would feed it in pieces, and after a rewind that schedule rounds differently.
    lc, batcher = fake_batcher(delay=0.05)
    start = threading.Barrier(4)

    def session(seq, n):
        start.wait()
        batcher.forward(seq, 0, [seq] * n)

    threads = [threading.Thread(target=session, args=(s, n)) for s, n in enumerate((1, 5, 1, 1))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sum(len(d) for d in lc.decodes) == 8
    assert [(1, pos, 1) for pos in range(5)] in lc.decodes  # the 5-token part of sequence 1, alone and whole
    assert all(len({seq for seq, _, _ in d}) == len(d) for d in lc.decodes if d[0][0] != 1)  # steps: one each


def test_sessions_must_be_a_whole_number():
    from surprisegate.backends.llamacpp import from_llamacpp
    from surprisegate.errors import InputError

    for bad in (0, -1, 1.5, True, 10_000):
        with pytest.raises(InputError, match="sessions="):
            from_llamacpp(None, sessions=bad)


# ------------------------------------------------------------------------------------------------
# Slow: the embedded model
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sessions_backend(llama_backend):  # llama_backend: skips when the model is not installed
    from surprisegate.backends.llamacpp import from_llamacpp

    return from_llamacpp(None, n_ctx=4096, sessions=N_SESSIONS)


def contract_backend(request):
    """For tests/test_backend_contract.py: the embedded model with N_SESSIONS sessions."""
    request.getfixturevalue("llama_backend")  # skips when the embedded model is not installed
    from surprisegate.backends.llamacpp import from_llamacpp

    return from_llamacpp(None, n_ctx=4096, sessions=N_SESSIONS)


class StaticMemory:
    """A memory arm that always finds the gold passage: grounding never fails, so rewinds happen."""

    name = "memory"

    def __init__(self, item):
        from surprisegate.arms import Evidence

        self.evidence = [
            Evidence(
                claim=item["question"],
                evidence=item["evidence"],
                confidence=0.9,
                source="memory:" + item.get("kb_id", "demo"),
            )
        ]

    def ground(self, query, deadline):
        return list(self.evidence)


def demo_item():
    return {"id": "demo", "question": DEMO_QUESTION, "evidence": DEMO_EVIDENCE, "kb_id": "country:BF"}


def factqa_items(n=20, seed=SEED, data=SHARED_DATA):
    path = Path(data) / "factqa_dev.jsonl"
    items = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return random.Random(seed).sample(items, n)


class _Recorder(threading.local):
    sampling = None


RECORDER = _Recorder()


class RecordingSampling(Sampling):
    """The loop's Sampling, keeping a copy of the logits of every step of the reply."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.logits: list[np.ndarray] = []
        RECORDER.sampling = self

    def step(self, logits, token, piece, stats=None, hidden=None):
        self.logits.append(np.array(logits, dtype=np.float32, copy=True))
        return super().step(logits, token, piece, stats, hidden)


def run_reply(backend, item, config):
    """One reply through the real loop; (result, logits of every step: None unless the loop's
    Sampling is RecordingSampling)."""
    from surprisegate.gate.loop import generate

    RECORDER.sampling = None
    result = generate(backend, item["question"], config, {"memory": StaticMemory(item)})
    return result, (RECORDER.sampling.logits if RECORDER.sampling is not None else None)


def run_together(backend, items, config):
    """Each item's reply in its own thread, all on `backend` at once; [(result, logits)] in item order."""
    out: list = [None] * len(items)
    errors: list = []
    start = threading.Barrier(len(items))

    def worker(k):
        try:
            start.wait()
            out[k] = run_reply(backend, items[k], config)
        except BaseException as err:  # noqa: BLE001 - reported by the caller
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(k,), name=f"session-{k}") for k in range(len(items))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    if errors:
        raise errors[0]
    return out


def rounds_view(rounds):
    """What a round decided (not its timings)."""
    keep = (
        "round",
        "trigger",
        "span_class",
        "action",
        "reason",
        "tokens_dropped",
        "tokens_injected",
        "dropped_text",
        "tokens_trimmed",
        "rewind_method",
        "injected_text",
    )
    return [{k: r.get(k) for k in keep} | {"chosen": (r.get("chosen") or {}).get("evidence")} for r in rounds]


def reply_view(result):
    extra = result.receipt.get("extra", {})
    return {
        "text": result.text,
        "finish_reason": result.finish_reason,
        "n_tokens": result.n_tokens,
        "token_ids": extra.get("token_ids"),
        "rounds": rounds_view(result.rounds),
    }


def compare(alone_logits, batched_logits):
    """Max |logit difference| over the steps both replies took, and how many of them changed their greedy
    argmax (a reply that took another number of steps counts one more change)."""
    max_diff, changed = 0.0, int(len(alone_logits) != len(batched_logits))
    for a, b in zip(alone_logits, batched_logits, strict=False):  # a length mismatch is counted above
        max_diff = max(max_diff, float(np.max(np.abs(a - b))))
        changed += int(np.argmax(a)) != int(np.argmax(b))
    return max_diff, changed


def measure(single, multi, items, config, log=print):
    """Every item alone on `single`, then in groups of N_SESSIONS threads on `multi`; per-item numbers."""
    rows = []
    for g in range(0, len(items), N_SESSIONS):
        group = items[g : g + N_SESSIONS]
        alone = [run_reply(single, item, config) for item in group]
        together = run_together(multi, group, config)
        for item, (ra, la), (rb, lb) in zip(group, alone, together, strict=True):
            assert la is not None and lb is not None, "patch gate.loop.Sampling with RecordingSampling first"
            max_diff, changed = compare(la, lb)
            row = {
                "id": item["id"],
                "question": item["question"],
                "steps": len(la),
                "max_abs_logit_diff": max_diff,
                "argmax_changes": changed,
                "same_reply": reply_view(ra) == reply_view(rb),
                "rounds": [r["action"] for r in ra.rounds],
                "reply": ra.text,
            }
            rows.append(row)
            if not row["same_reply"]:
                row["alone"], row["together"] = reply_view(ra), reply_view(rb)
                row["alone_arms"] = [r.get("arms") for r in ra.rounds]
                row["together_arms"] = [r.get("arms") for r in rb.rounds]
            log(
                f"{row['id']:>28}  steps={row['steps']:3d}  max|dlogit|={max_diff:.3g}  argmax changes={changed}  "
                f"same reply={row['same_reply']}  rounds={row['rounds']}"
            )
    return rows


def intervene_config(**kw):
    from surprisegate.config import Config

    return Config(**({"mode": "intervene", "max_tokens": MAX_TOKENS} | kw))


@pytest.mark.slow
def test_four_sessions_in_four_threads_give_the_replies_each_gives_alone(
    llama_backend, sessions_backend, shared_data, monkeypatch
):
    import surprisegate.gate.loop as gate_loop

    monkeypatch.setattr(gate_loop, "Sampling", RecordingSampling)
    # A low threshold makes every reply trigger, so each one rewinds (and its rewrite is checked).
    config = intervene_config(threshold=1.0, kind_thresholds={})
    items = [demo_item()] + factqa_items(3, seed=SEED + 1, data=shared_data)
    alone = [run_reply(llama_backend, item, config) for item in items]
    stats_before = dict(sessions_backend.decode_stats)
    together = run_together(sessions_backend, items, config)
    for item, (ra, la), (rb, lb) in zip(items, alone, together, strict=True):
        assert reply_view(rb) == reply_view(ra), item["question"]
        assert compare(la, lb)[1] == 0
    assert all(any(r["action"] == "rewound" for r in ra.rounds) for ra, _ in alone)
    decodes = sessions_backend.decode_stats["decodes"] - stats_before["decodes"]
    parts = sessions_backend.decode_stats["parts"] - stats_before["parts"]
    assert parts > decodes, "the sessions never shared a decode"
    assert sessions_backend.free_sessions == N_SESSIONS  # generate() closed every session


@pytest.mark.slow
def test_batched_logits_match_alone_on_the_demo_and_20_factqa_questions(
    llama_backend, sessions_backend, shared_data, monkeypatch
):
    import surprisegate.gate.loop as gate_loop

    monkeypatch.setattr(gate_loop, "Sampling", RecordingSampling)
    items = [demo_item()] + factqa_items(20, data=shared_data)
    rows = measure(llama_backend, sessions_backend, items, intervene_config())
    max_diff = max(r["max_abs_logit_diff"] for r in rows)
    changes = sum(r["argmax_changes"] for r in rows)
    print(
        f"\nsessions vs alone over {len(rows)} replies, {sum(r['steps'] for r in rows)} steps: "
        f"max |logit difference| = {max_diff:.3g}, argmax changes = {changes}"
    )
    assert changes == 0
    assert all(r["same_reply"] for r in rows)
    assert max_diff <= 1e-3  # measured 0.0: each sequence has its own KV stream, the kernels are per column


@pytest.mark.slow
def test_closing_a_session_frees_its_sequence_and_a_fifth_is_a_clear_error(sessions_backend):
    from surprisegate.backends.llamacpp import LlamaCppSession, NoFreeSession

    b = sessions_backend
    sessions = [b.session() for _ in range(N_SESSIONS)]
    try:
        assert all(isinstance(s, Session) and isinstance(s, LlamaCppSession) for s in sessions)
        assert sorted(s.seq_id for s in sessions) == list(range(N_SESSIONS)) and b.free_sessions == 0
        with pytest.raises(NoFreeSession, match=rf"all sessions={N_SESSIONS} .* close\(\)"):
            b.session()
        victim = sessions[1]
        steps = victim.steps(b.tokenize("One two three four"), Sampling())
        next(steps)
        assert b.cache_pos_max(victim.seq_id) >= 0
        victim.close()
        victim.close()  # closing twice is harmless
        assert b.cache_pos_max(victim.seq_id) == -1  # its cells are cleared
        with pytest.raises(BackendError, match="closed"):
            next(steps)  # an iterator left open cannot feed a sequence it no longer owns
        with pytest.raises(BackendError, match="closed"):
            victim.steps([1, 2], Sampling())
        again = b.session()
        sessions[1] = again
        assert again.seq_id == victim.seq_id and list(again.tokens) == []
    finally:
        for s in sessions:
            s.close()
    assert b.free_sessions == N_SESSIONS


ONE_CONTEXT = ("append", "logits", "trim", "reset", "can_trim", "n_tokens", "tap_layer", "hidden_state")


def test_sessions_hold_the_loaded_model_and_none_of_the_one_context_primitives():
    from surprisegate.backends.llamacpp import LlamaCppBackend, LlamaCppModel, LlamaCppSessions

    # Composition: what both share (tokens, bytes, EOS ids, the chat template) is a LlamaCppModel each holds;
    # the sessions backend neither inherits the one-context backend nor stubs its primitives to raise.
    assert not issubclass(LlamaCppSessions, LlamaCppBackend)
    assert [name for name in ONE_CONTEXT if hasattr(LlamaCppSessions, name)] == []
    assert all(callable(getattr(LlamaCppModel, name)) for name in ("tokenize", "token_bytes", "chat_prompt"))


@pytest.mark.slow
def test_sessions_declare_what_they_can_do(sessions_backend, llama_backend):
    from surprisegate.backends import (
        ContextSize,
        HiddenStates,
        RequestLog,
        SteerableBackend,
        Tappable,
        TopKSignals,
        VocabSize,
    )
    from surprisegate.model_calibrations import backend_top_k

    b = sessions_backend
    assert isinstance(b, SteerableBackend) and isinstance(b, ContextSize) and isinstance(b, VocabSize)
    assert not isinstance(b, Tappable) and not isinstance(b, HiddenStates)  # a trigger probe needs sessions=1
    assert not isinstance(b, TopKSignals) and backend_top_k(b) is None  # the full distribution, as in process
    assert b.n_ctx == 4096 and b.n_vocab == llama_backend.n_vocab and b.eos_token_ids == llama_backend.eos_token_ids
    assert isinstance(llama_backend, Tappable) and isinstance(llama_backend, HiddenStates)
    text = "Paris.<|im_end|> and <|im_start|>"
    assert b.tokenize(text) == llama_backend.tokenize(text) and b.tokenize(text, special=True) == (
        llama_backend.tokenize(text, special=True)
    )
    ids = llama_backend.tokenize(text, special=True)
    assert [b.token_bytes(t) for t in ids] == [llama_backend.token_bytes(t) for t in ids]
    chat = [{"role": "user", "content": "Hi?"}]
    assert b.chat_prompt(chat) == llama_backend.chat_prompt(chat)
    assert b.chat_prompt(chat, False) == llama_backend.chat_prompt(chat, False)
    with b.session() as session:
        assert not isinstance(session, RequestLog)  # in process: no HTTP requests to record


def greedy(session, tokens, n, **kw):
    steps = session.steps(tokens, Sampling(), **kw)
    out = [next(steps).token for _ in range(n)]
    steps.close()
    return out


@pytest.mark.slow
def test_trimming_one_session_never_touches_another(llama_backend, sessions_backend):
    from test_backend_llamacpp import prompt_tokens

    b = sessions_backend
    pa, pb = prompt_tokens(b, "Write a sentence about the sea."), prompt_tokens(b, "Name three colours.")
    alone = llama_backend.session()
    try:
        reference = greedy(alone, pb, 18)
    finally:
        alone.close()
    a, s = b.session(), b.session()
    try:
        ids_a = greedy(a, pa, 12)  # holds pa + 11 reply tokens (the 12th step is never fed)
        first = greedy(s, pb, 12)
        held_b, pos_b = list(s.tokens), b.cache_pos_max(s.seq_id)
        assert pos_b == len(held_b) - 1 == len(pb) + 10
        # Rewind a far back: only a's cells go.
        greedy(a, pa + ids_a[:3], 2)
        assert a.last_continue == (9, "trim")  # 11 - 3 reply tokens, plus one re-fed for its logits
        assert b.cache_pos_max(a.seq_id) == len(pa) + 3  # the prefix plus the one step fed since
        a.close()  # a's sequence is cleared altogether
        assert b.cache_pos_max(a.seq_id) == -1
        assert b.cache_pos_max(s.seq_id) == pos_b and list(s.tokens) == held_b
        # s continues where it was and writes what it writes alone.
        rest = greedy(s, held_b, 7)
        assert s.last_continue == (0, "trim") and rest[0] == first[11]
        assert first + rest[1:] == reference
    finally:
        a.close()
        s.close()


@pytest.mark.slow
def test_a_lone_session_does_not_wait_for_idle_ones(sessions_backend):
    b = sessions_backend
    idle, busy = b.session(), b.session()
    batcher = b._batcher
    saved, batcher.gather_s = batcher.gather_s, 1.0
    try:
        steps = busy.steps(b.tokenize("The sea is"), Sampling())  # the prompt (a longer part) never waits
        greedy(idle, b.tokenize("Hello there"), 2)  # a step, then idle (say, grounding a claim)
        before = b.decode_stats["gather_timeouts"]
        for _ in range(12):
            next(steps)  # the first step fed waits for `idle` once, at most 1 s; then never again
        steps.close()
        assert b.decode_stats["gather_timeouts"] - before == 1
        assert all(n == 1 for n in busy.batched_with)
    finally:
        batcher.gather_s = saved
        idle.close()
        busy.close()


# ------------------------------------------------------------------------------------------------
# Measurement script: results/sessions/sessions.json
# ------------------------------------------------------------------------------------------------
def throughput(single, multi, items, config, repeats=3, log=print):
    """Tokens decoded per second: the items' replies one after another on the one-context backend vs
    together in N threads on the sessions backend, alternated `repeats` times in the same run."""
    runs = []
    for r in range(repeats):
        t0 = time.perf_counter()
        seq = [run_reply(single, item, config)[0] for item in items]
        t_seq = time.perf_counter() - t0
        before = dict(multi.decode_stats)
        t0 = time.perf_counter()
        bat = [res for res, _ in run_together(multi, items, config)]
        t_bat = time.perf_counter() - t0
        n_seq = sum(res.receipt["extra"]["tokens_decoded"] for res in seq)
        n_bat = sum(res.receipt["extra"]["tokens_decoded"] for res in bat)
        decodes = multi.decode_stats["decodes"] - before["decodes"]
        parts = multi.decode_stats["parts"] - before["parts"]
        run = {
            "load_avg_1min": round(os.getloadavg()[0], 2),
            "one_after_another_s": round(t_seq, 3),
            "together_s": round(t_bat, 3),
            "tokens_decoded": n_seq,
            "tokens_decoded_together": n_bat,
            "one_after_another_tok_s": round(n_seq / t_seq, 2),
            "together_tok_s": round(n_bat / t_bat, 2),
            "ratio": round((n_bat / t_bat) / (n_seq / t_seq), 3),
            "llama_decode_calls_together": decodes,
            "mean_sessions_per_decode": round(parts / max(decodes, 1), 2),
        }
        runs.append(run)
        log(
            f"run {r + 1}: one after another {run['one_after_another_tok_s']} tok/s, together "
            f"{run['together_tok_s']} tok/s, ratio {run['ratio']}, {run['mean_sessions_per_decode']} sessions/decode"
        )
    return runs


def decode_throughput(single, multi, prompts, n_tokens=64, repeats=3, log=print):
    """Steady greedy decoding, `n_tokens` per prompt (no end-of-turn stop, no grounding): the prompts one
    after another on the one-context backend vs together, one thread each, on the sessions backend."""

    def decode(backend, prompt):
        session = backend.session()
        try:
            steps = session.steps(prompt, Sampling())
            for _ in range(n_tokens):
                next(steps)
            steps.close()
        finally:
            session.close()

    runs = []
    for r in range(repeats):
        t0 = time.perf_counter()
        for prompt in prompts:
            decode(single, prompt)
        t_seq = time.perf_counter() - t0
        start = threading.Barrier(len(prompts))

        def worker(prompt, start=start):
            start.wait()
            decode(multi, prompt)

        threads = [threading.Thread(target=worker, args=(p,)) for p in prompts]
        t0 = time.perf_counter()
        [t.start() for t in threads]
        [t.join() for t in threads]
        t_bat = time.perf_counter() - t0
        n = n_tokens * len(prompts)
        run = {
            "load_avg_1min": round(os.getloadavg()[0], 2),
            "one_after_another_s": round(t_seq, 3),
            "together_s": round(t_bat, 3),
            "tokens": n,
            "one_after_another_tok_s": round(n / t_seq, 2),
            "together_tok_s": round(n / t_bat, 2),
            "ratio": round(t_seq / t_bat, 3),
        }
        runs.append(run)
        log(
            f"decode run {r + 1}: one after another {run['one_after_another_tok_s']} tok/s, together "
            f"{run['together_tok_s']} tok/s, ratio {run['ratio']}"
        )
    return runs


def best_of(runs):
    """Best tokens/s together over best tokens/s one after another: interference only slows runs down."""
    return round(max(r["together_tok_s"] for r in runs) / max(r["one_after_another_tok_s"] for r in runs), 3)


def main(argv=None) -> int:
    import argparse
    import platform
    import sys

    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import surprisegate.gate.loop as gate_loop
    from surprisegate.backends.llamacpp import from_llamacpp

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/sessions/sessions.json")
    parser.add_argument("--data", default=str(SHARED_DATA))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    gate_loop.Sampling = RecordingSampling
    single = from_llamacpp(None, n_ctx=4096)
    multi = from_llamacpp(None, n_ctx=4096, sessions=N_SESSIONS)
    items = [demo_item()] + factqa_items(20, data=args.data)
    config = intervene_config()
    rows = measure(single, multi, items, config)
    forced = intervene_config(threshold=1.0, kind_thresholds={})
    rewind_items = [demo_item()] + factqa_items(3, seed=SEED + 1, data=args.data)
    rewind_rows = measure(single, multi, rewind_items, forced)
    gate_loop.Sampling = Sampling  # no copies of the logits while timing
    speed_items = factqa_items(N_SESSIONS, seed=SEED + 2, data=args.data)
    speed = throughput(single, multi, speed_items, config, repeats=args.repeats)
    from test_backend_llamacpp import prompt_tokens

    prompts = [prompt_tokens(single, item["question"]) for item in speed_items]
    steady = decode_throughput(single, multi, prompts, repeats=args.repeats)
    ratios = sorted(r["ratio"] for r in speed)
    steady_ratios = sorted(r["ratio"] for r in steady)
    all_rows = rows + rewind_rows
    result = {
        "what": f"{N_SESSIONS} sessions on one loaded llama.cpp model (one sequence id each), each driven from its "
        "own thread through gate.loop.generate (mode=intervene, greedy, a memory arm returning the gold "
        "passage), vs the same replies alone on the one-context backend",
        "command": ".venv/bin/python tests/test_sessions.py --out results/sessions/sessions.json",
        "model": Path(multi.model_id).name,
        "llama_cpp_python": llama_cpp.__version__,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "max_tokens": MAX_TOKENS,
        "logits": {
            "questions": "the demo question + 20 factqa_dev questions (random.Random(10).sample), shipped config; "
            "plus the demo question + 3 more with threshold=1.0 so every reply rewinds",
            "replies": len(all_rows),
            "steps": sum(r["steps"] for r in all_rows),
            "replies_with_a_rewind": sum("rewound" in r["rounds"] for r in all_rows),
            "max_abs_logit_diff": max(r["max_abs_logit_diff"] for r in all_rows),
            "argmax_changes": sum(r["argmax_changes"] for r in all_rows),
            "same_replies": sum(r["same_reply"] for r in all_rows),
            "per_question": all_rows,
        },
        "throughput": {
            "loop": {
                "what": f"generate() replies (mode=intervene, shipped config, max_tokens={MAX_TOKENS}) to {N_SESSIONS} "
                f"factqa_dev questions (random.Random({SEED + 2}).sample): prompts, rewinds, injected evidence "
                "and end-of-turn stops included; tokens = tokens decoded",
                "baseline": "the same replies one after another on the default one-context backend, same process",
                "median_ratio": ratios[len(ratios) // 2],
                "best_of_ratio": best_of(speed),
                "runs": speed,
            },
            "steady_decoding": {
                "what": f"{N_SESSIONS} sessions x 64 greedy tokens after the same {N_SESSIONS} prompts (no stop, no "
                "grounding): decode steps only, besides one prompt each",
                "baseline": "the same decoding one prompt after another on the default one-context backend",
                "median_ratio": steady_ratios[len(steady_ratios) // 2],
                "best_of_ratio": best_of(steady),
                "runs": steady,
            },
            "note": "wall-clock on a shared 2-core CPU machine where other processes (test suites, a llama-server) "
            "come and go: each run records the 1-minute load average (this process alone adds about 2). A "
            "busy machine slows the one-token decodes of the one-context backend far more than 4-token "
            "ones (descheduled threads stall llama.cpp's per-op barriers), so runs at a high load inflate "
            "the ratio; hence runs "
            "alternated, their median ratio, and best_of_ratio = best together tok/s / best one-after-another "
            "tok/s (interference only ever slows a run down). On 2 cores a "
            "4-token llama_decode of this 135M model costs about 3x a 1-token one, so batching can give "
            "at most about 1.3-1.4x here; the rest of each step (sampling, surprise, the loop) is Python.",
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(
        f"max |logit difference| {result['logits']['max_abs_logit_diff']:.3g}, argmax changes "
        f"{result['logits']['argmax_changes']}, same replies {result['logits']['same_replies']}/{len(all_rows)}, "
        f"throughput ratio (median / best-of) loop {result['throughput']['loop']['median_ratio']} / "
        f"{result['throughput']['loop']['best_of_ratio']}, steady decoding "
        f"{result['throughput']['steady_decoding']['median_ratio']} / "
        f"{result['throughput']['steady_decoding']['best_of_ratio']} → {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


@pytest.mark.slow
def test_lockstep_rate_decodes_the_sequences_together_and_leaves_them_free(sessions_backend):
    b = sessions_backend
    prompt = b.tokenize("One two three four")
    before = b.decode_stats["decodes"]
    rate = b.lockstep_rate(N_SESSIONS, prompt, 5)
    assert rate > 0
    # N prefills (alone) and 5 decodes of N sequences each
    assert b.decode_stats["decodes"] - before == N_SESSIONS + 5
    assert b.free_sessions == N_SESSIONS
    assert all(b.cache_pos_max(seq) == -1 for seq in range(N_SESSIONS))  # cells cleared afterwards
    held = b.session()
    try:
        with pytest.raises(BackendError, match="all free"):
            b.lockstep_rate(1, prompt, 1)  # never under an open session
    finally:
        held.close()
    with pytest.raises(BackendError, match="1..4"):
        b.lockstep_rate(N_SESSIONS + 1, prompt, 1)
