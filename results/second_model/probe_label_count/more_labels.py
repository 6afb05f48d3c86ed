"""Experiment: does a Qwen probe fitted on more fact-question labels pass the half-B bar?"""
import json, random, sys, time
from pathlib import Path
from surprisegate.config import ConfigLayers, load_config
from surprisegate.runtime import assemble
from surprisegate.research.labeling import label as label_items, iter_labels, read_items
from surprisegate.research.probe_fit import fit_model_probe
from surprisegate.research.evaluate import *  # noqa
M = sys.argv[1]; N = int(sys.argv[2]); OUT = Path(sys.argv[3])
OUT.mkdir(parents=True, exist_ok=True)
dev = read_items("../shared/data/factqa_dev.jsonl")
sample = set(r["id"] for r in random.Random(0).sample(dev, 100))
calib_rows = [json.loads(l) for l in open("results/second_model/calibration/labels.jsonl")]
calib_ids = {r["id"] for r in calib_rows}
pool = sorted(r["id"] for r in dev if r["id"] not in sample and r["id"] not in calib_ids)
pick = set(random.Random(1).sample(pool, N))
extra = OUT / "extra.jsonl"
extra.write_text("".join(json.dumps(r) + "\n" for r in dev if r["id"] in pick))
runtime = assemble(ConfigLayers(None, {"backend": "llamacpp", "model": M}).load(), tools=False)
backend = runtime.backend
cfg = load_config("results/second_model/calibration/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf--full.toml", env={})
label_cfg = runtime.config.replace(max_tokens=32)
t = time.monotonic()
def prog(done, total, note, _last=[0]):
    if time.monotonic() - _last[0] > 30:
        _last[0] = time.monotonic(); print(f"label {done}/{total} {time.monotonic()-t:.0f}s", flush=True)
label_items(extra, OUT / "labels", backend, label_cfg, progress=prog)
print("labelled in", round(time.monotonic() - t), "s", flush=True)
rows = calib_rows + list(iter_labels([OUT / "labels"]))
print("rows", len(rows), "wrong extra", sum(not r["correct"] for r in iter_labels([OUT / "labels"])), flush=True)
t = time.monotonic()
report = fit_model_probe(backend, rows, cfg.replace(mode="detect", max_tokens=32), OUT / "probe.npz",
                         progress=lambda d, n, s: print(f"probe {d}/{n} {time.monotonic()-t:.0f}s", flush=True) if d % 160 == 0 else None)
print("probe in", round(time.monotonic() - t), "s", flush=True)
(OUT / "probe_fit.json").write_text(json.dumps(report, indent=2))
print(json.dumps({k: v for k, v in report.items() if not isinstance(v, (list,))}, indent=1)[:3000])
