#!/usr/bin/env bash
# The field's triggers beside the gate on the second model (Qwen2.5-Coder-0.5B-Instruct, its own calibration
# and probe from results/second_model/calibration). Run from the repository root; STEP = signals | eval | seakr | all.
# SeaKR (k = 8 samples a step) has its own step: on the embedded model it took 10x any other mode's wall time.
# Each step resumes where it stopped (signals.jsonl, eval rows).
set -euo pipefail
SET=${1:?factqa or halueval}
STEP=${2:-all}
P=results/peers/qwen
M=${M:-$(cat .second-model 2>/dev/null || ../shared/models/fetch-second-model.sh)}
export SURPRISEGATE_HOME=${SURPRISEGATE_HOME:-/tmp/hq2}
mkdir -p "$SURPRISEGATE_HOME/calibrations"
cp -n results/second_model/calibration/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf--full.{toml,probe.npz} \
    "$SURPRISEGATE_HOME/calibrations/"
case $SET in
  factqa) DATA=../shared/data/factqa_dev.jsonl; ARMS=(--memory factkb.sqlite);;
  halueval) DATA=../shared/data/halueval_qa_dev.jsonl; ARMS=(--memory none --web http://127.0.0.1:8899);;
  *) echo "unknown set $SET" >&2; exit 2;;
esac
# The half B items are the model's own split of the same 100-item sample: the same file as the embedded model's.
HALF_B=results/peers/smollm2/${SET}_halfB.jsonl
if [[ $STEP == signals || $STEP == all ]]; then
  .venv/bin/python scripts/peer_signals.py --model "$M" --data "$DATA" --sample 100 --samples 8 --out $P/${SET}_signals
fi
t() { .venv/bin/python -c "import json,sys; print(json.load(open('$P/${SET}_signals/summary.json'))['signals']['$1']['threshold_from_A'])"; }
if [[ $STEP == eval || $STEP == all ]]; then
  .venv/bin/surprisegate eval --backend transformers --model "$M" --data $HALF_B "${ARMS[@]}" \
      --modes off,intervene,dragin,etc,etc-trend,entropy-rule,flare,single-retrieval,fix-sentence-retrieval,fix-length-retrieval,oracle \
      --peer-threshold dragin=$(t dragin) --peer-threshold etc=$(t etc) --peer-threshold etc-trend=$(t etc-trend) \
      --peer-threshold entropy-rule=$(t entropy-mean) \
      --flare-theta $(t flare) --flare-mask-below 0.4 --flare-pre-retrieval --out $P/${SET}_eval
fi
if [[ $STEP == seakr || $STEP == all ]]; then
  .venv/bin/surprisegate eval --backend transformers --model "$M" --data $HALF_B "${ARMS[@]}" \
      --modes off,seakr --peer-threshold seakr=$(t seakr) --out $P/${SET}_seakr
fi
