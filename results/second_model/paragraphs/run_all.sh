#!/usr/bin/env bash
# Issue 45: the second model (Qwen2.5-Coder-0.5B-Instruct, its own calibration and sentence threshold) on all 187
# longform_dev prompts, off, intervene and always, memory = the factkb store, 160 tokens. Resumes where it stopped.
#   bash results/second_model/paragraphs/run_all.sh          (about 30 min on 2 cores)
set -euo pipefail
MODEL=qwen
source results/model_args.sh
[[ -f factkb.sqlite ]] || .venv/bin/surprisegate memory add --memory factkb.sqlite ../shared/data/factkb_passages.jsonl
.venv/bin/surprisegate eval "${M[@]}" --data ../shared/data/longform_dev.jsonl --modes off,intervene,always \
    --memory factkb.sqlite --max-tokens 160 --out results/second_model/paragraphs/longform_dev_all
.venv/bin/python scripts/paragraph_halves.py results/second_model/paragraphs/longform_dev_all \
    --data ../shared/data/longform_dev.jsonl   # writes halves.json beside the run
