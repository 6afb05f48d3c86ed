import json, pickle, sys, time, random
from pathlib import Path
from surprisegate.config import ConfigLayers, load_config
from surprisegate.runtime import assemble
from surprisegate.research.labeling import iter_labels
from surprisegate.research import probe_fit as pf
from surprisegate.gate.signals import question_kind
M, OUT = sys.argv[1], Path(sys.argv[2])
calib_rows = [json.loads(l) for l in open("results/second_model/calibration/labels.jsonl")]
rows = calib_rows + list(iter_labels([OUT / "labels"]))
cache = OUT / "replayed.pkl"
if not cache.exists():
    runtime = assemble(ConfigLayers(None, {"backend": "llamacpp", "model": M}).load(), tools=False)
    backend = runtime.backend
    cfg = load_config("results/second_model/calibration/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf--full.toml", env={}).replace(mode="detect", max_tokens=32)
    questions = [r for r in rows if pf.is_question(r)]
    layers = pf.candidate_layers(backend.n_layer)
    kinds = {question_kind(r["question"]) for r in questions}
    replayed = []; t = time.monotonic()
    for start in range(0, len(questions), pf.REPLAY_BATCH):
        batch = questions[start:start + pf.REPLAY_BATCH]
        prompts = [pf.prompt_tokens(backend, row, cfg) for row in batch]
        states = backend.sequence_states([p + list(r["token_ids"]) for p, r in zip(prompts, batch)], layers)
        replayed += [pf.replay_row(r, p, s, cfg, kinds) for r, p, s in zip(batch, prompts, states)]
        if start % 160 == 0: print("replay", len(replayed), len(questions), round(time.monotonic() - t), flush=True)
    print("replay s", round(time.monotonic() - t), flush=True)
    pickle.dump((replayed, layers, backend.model_id), open(cache, "wb"))
replayed, layers, model = pickle.load(open(cache, "rb"))
calib_ids = {r["id"] for r in calib_rows}
base = [r for r in replayed if r.id in calib_ids]
extra = sorted([r for r in replayed if r.id not in calib_ids], key=lambda r: r.id)
random.Random(5).shuffle(extra)
for n in [0, 100, 200, 300, 400, len(extra)]:
    probe, rep = pf.fit_and_judge(base + extra[:n], model, layers)
    print(n, len(base) + n, {k: rep.get(k) for k in ["layer", "c", "auroc_cv_a", "auroc_cv_a_window_margin", "auroc_b", "half_b_window", "half_b_probe", "half_b_probe_at_window_recall", "half_b_probe_wins", "written"]}, flush=True)
    if n == len(extra) and probe is not None:
        probe.save(OUT / "probe_all.npz")
