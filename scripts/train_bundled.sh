#!/usr/bin/env bash
# Train both bundled models from scratch on this machine's standard-library source and ship them:
# checkpoints to src/specframe/assets/models/<name>/, training records to docs/models/training/<name>/.
# Both runs go at once, one thread each (about 50 minutes on a 2-core machine; each run alone with 2 threads
# takes under 30). A run resumes from its work folder when restarted. `specframe train` comes from the
# specframe-training plugin (pip install ./plugins/specframe-training). Then regenerate the docs page:
#   python scripts/bundled_docs.py
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${WORK:-runs}"
THREADS="${THREADS:-1}"
mkdir -p "$WORK"
train() {  # family, name
  specframe train "$1" --work-dir "$WORK/$2" --threads "$THREADS" \
    --ship "src/specframe/assets/models/$2" --records "docs/models/training/$2" > "$WORK/$2.log" 2>&1
}
train nemotron-labs-diffusion nemotron-stdlib-tiny &
nemotron=$!
train setdlm setdlm-stdlib-tiny &
setdlm=$!
status=0
wait "$nemotron" || { echo "nemotron training failed: see $WORK/nemotron-stdlib-tiny.log"; status=1; }
wait "$setdlm" || { echo "setdlm training failed: see $WORK/setdlm-stdlib-tiny.log"; status=1; }
exit "$status"
