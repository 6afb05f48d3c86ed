#!/usr/bin/env bash
# Grounded structured output (issue 44, README "Serve it"): the factqa capital questions of dev (100, seeded)
# as plain text and as JSON under {country, capital}, the gate off and intervening, memory = factkb.
#   bash results/structured/run.sh MODEL [server]   MODEL = smollm2 | qwen   (resumes where it stopped)
# server: the same through llama.cpp's server (its own grammar sampler; make llama-server builds it), in
# results/structured/MODEL_llama_server.
set -euo pipefail
MODEL=${1:?smollm2 or qwen}
[[ -f factkb.sqlite ]] || .venv/bin/surprisegate memory add --memory factkb.sqlite ../shared/data/factkb_passages.jsonl
source results/model_args.sh  # M: the model arguments (and the second model's calibration home)
if [[ ${2:-} == server ]]; then
  S=(--llama-server "${LLAMA_SERVER:-$HOME/.cache/surprisegate/bin/llama-server}")
  OUT=results/structured/${MODEL}_llama_server
else
  S=()
  OUT=results/structured/$MODEL
fi
.venv/bin/python scripts/structured_capitals.py "${M[@]}" "${S[@]}" --sample 100 --out "$OUT"
