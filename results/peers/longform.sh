#!/usr/bin/env bash
# The field's triggers beside the gate on paragraphs (longform_dev, 60 prompts: seeded halves of 30), claim by
# claim, on the transformers backend. Run from the repository root.
#   bash results/peers/longform.sh MODEL STEP      MODEL = smollm2 | qwen, STEP = signals | eval | seakr | all
# signals: every trigger's value on each claim sentence of the greedy replies, thresholds chosen on half A
# (scripts/peer_signals.py); eval: half B through every method with those thresholds; seakr (k = 8 samples a
# reply) apart, as on the other sets. Each step resumes where it stopped (signals.jsonl, eval rows).
set -euo pipefail
MODEL=${1:?smollm2 or qwen}
STEP=${2:-all}
DATA=../shared/data/longform_dev.jsonl
MAX_TOKENS=160 # the paragraph rows' length (README "Paragraphs")
source results/model_args.sh  # M: the model arguments (and the second model's calibration home)
P=results/peers/$MODEL
HALF_B=results/peers/longform_halfB.jsonl # the same 30 prompts for both models
[[ -f $HALF_B ]] || .venv/bin/python scripts/peer_signals.py --data $DATA --sample 60 --out /tmp --write-half-b $HALF_B
if [[ $STEP == signals || $STEP == all ]]; then
  .venv/bin/python scripts/peer_signals.py "${M[@]}" --data $DATA --sample 60 --samples 8 --max-tokens $MAX_TOKENS \
      --out $P/longform_signals
fi
t() { .venv/bin/python -c "import json; print(json.load(open('$P/longform_signals/summary.json'))['signals']['$1']['threshold_from_A'])"; }
ARMS=(--memory factkb.sqlite --max-tokens $MAX_TOKENS)
if [[ $STEP == eval || $STEP == all ]]; then
  .venv/bin/surprisegate eval --backend transformers "${M[@]}" --data $HALF_B "${ARMS[@]}" \
      --modes ${MODES:-off,intervene,dragin,etc,etc-trend,entropy-rule,flare,single-retrieval,fix-sentence-retrieval,fix-length-retrieval} \
      --peer-threshold dragin="$(t dragin)" --peer-threshold etc="$(t etc)" --peer-threshold etc-trend="$(t etc-trend)" \
      --peer-threshold entropy-rule="$(t entropy-mean)" \
      --flare-theta "$(t flare)" --flare-mask-below 0.4 --flare-pre-retrieval --out $P/longform_eval
fi
if [[ $STEP == seakr || $STEP == all ]]; then
  .venv/bin/surprisegate eval --backend transformers "${M[@]}" --data $HALF_B "${ARMS[@]}" \
      --modes off,seakr --peer-threshold seakr="$(t seakr)" --out $P/longform_seakr
fi
