#!/usr/bin/env bash
# Grounded structured output (issue 44, README "Serve it"): the factqa capital questions of dev (100, seeded)
# as plain text and as JSON under {country, capital}, the gate off and intervening, memory = factkb.
#   bash results/structured/run.sh MODEL      MODEL = smollm2 | qwen   (resumes where it stopped)
set -euo pipefail
MODEL=${1:?smollm2 or qwen}
[[ -f factkb.sqlite ]] || .venv/bin/surprisegate memory add --memory factkb.sqlite ../shared/data/factkb_passages.jsonl
case $MODEL in
  smollm2) M=() ;;
  qwen)
    M=(--model "${Q:-$(cat .second-model 2>/dev/null || ../shared/models/fetch-second-model.sh)}")
    export SURPRISEGATE_HOME=${SURPRISEGATE_HOME:-/tmp/hq2}  # the second model's calibration, as the peers' runs
    mkdir -p "$SURPRISEGATE_HOME/calibrations"
    cp -n results/second_model/calibration/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf--full.{toml,probe.npz} \
        "$SURPRISEGATE_HOME/calibrations/"
    ;;
  *) echo "unknown model $MODEL (smollm2 or qwen)" >&2; exit 2 ;;
esac
.venv/bin/python scripts/structured_capitals.py "${M[@]}" --sample 100 --out results/structured/$MODEL
