#!/usr/bin/env bash
# The demo corpus: the King James Bible (Debian's bible-kjv, 4.3 MB) as byte-level token shards
# in runs/kjv/data (train and a 5% validation split), made once. Needs a build (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p runs/kjv
if [ ! -f runs/kjv/data/train_000000.bin ]; then
  bible Gen1:1-Rev22:21 </dev/null >runs/kjv/kjv.txt
  ./build/launch/nsatron data prepare --input runs/kjv/kjv.txt --output runs/kjv/data --tokenizer bytes --val-fraction 0.05
fi
