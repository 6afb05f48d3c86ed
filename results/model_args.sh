# shellcheck shell=bash
# Sourced by the results' run scripts (from the repository root) with MODEL set: smollm2 (the embedded
# default) or qwen (the second model). Sets M, the model arguments for surprisegate and the scripts; for qwen,
# SURPRISEGATE_HOME holds its own calibration (the shipped one, copied in once). Q overrides the GGUF path.
case ${MODEL:?smollm2 or qwen} in
  smollm2) M=() ;;
  qwen)
    Q=${Q:-$(cat .second-model 2>/dev/null || ../shared/models/fetch-second-model.sh)}
    M=(--model "$Q")
    export SURPRISEGATE_HOME=${SURPRISEGATE_HOME:-/tmp/hq2}
    mkdir -p "$SURPRISEGATE_HOME/calibrations"
    cp -n results/second_model/calibration/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf--full.{toml,probe.npz} \
        "$SURPRISEGATE_HOME/calibrations/"
    ;;
  *) echo "unknown model $MODEL (smollm2 or qwen)" >&2; exit 2 ;;
esac
