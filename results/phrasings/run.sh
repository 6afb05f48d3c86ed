#!/usr/bin/env bash
# The gate on questions worded as people word them (issue 45): factqa_dev's seeded 100-item sample (SET=factqa,
# the default) or longform_dev's seeded 60 prompts at 160 tokens (SET=longform) asked in the dev template and in
# each family of scripts/phrasings.py (the same items, answers and grading), off and intervening, memory = the
# factkb store. Families lowercase and indirect are held out: never read while tuning.
#   [SET=longform] bash results/phrasings/run.sh MODEL [FAMILY ...]   MODEL = smollm2 | qwen (a family done is skipped)
set -euo pipefail
MODEL=${1:?smollm2 or qwen}
shift || true
FAMILIES=(${@:-template conversational extra_words lowercase indirect})
[[ -f factkb.sqlite ]] || .venv/bin/surprisegate memory add --memory factkb.sqlite ../shared/data/factkb_passages.jsonl
[[ -f results/phrasings/sets/factqa_indirect.jsonl ]] || .venv/bin/python scripts/phrasings.py
source results/model_args.sh  # M: the model arguments (and the second model's calibration home)
SET=${SET:-factqa}
case $SET in
  factqa) SIZE=(--sample 100) ;;
  longform) SIZE=(--sample 60 --max-tokens 160) ;;  # the paragraph rows' length (README Paragraphs)
  *) echo "unknown SET $SET (factqa or longform)" >&2; exit 2 ;;
esac
for family in "${FAMILIES[@]}"; do
  out=results/phrasings/$MODEL/${SET}_$family
  [[ -f $out/summary.json ]] && continue
  data=results/phrasings/sets/${SET}_$family.jsonl
  [[ $family == template ]] && data=../shared/data/${SET}_dev.jsonl
  .venv/bin/surprisegate eval "${M[@]}" --data "$data" --modes off,intervene "${SIZE[@]}" --memory factkb.sqlite \
      --out "$out"
done
.venv/bin/python scripts/phrasing_table.py results/phrasings/$MODEL
