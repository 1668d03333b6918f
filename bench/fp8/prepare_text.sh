#!/usr/bin/env bash
# Real text for the fp8 quality comparison: the King James Bible (public
# domain), from Debian's bible-kjv package, as a byte-level token file
# (uint16 ids 0..255, nanoGPT's train.bin layout; vocab 256).
#
#   bench/fp8/prepare_text.sh OUT_DIR     # writes OUT_DIR/{kjv.txt,train.bin,val.bin}
#   bench/fp8/prepare_text.sh OUT_DIR KJV # the same from a kjv.txt made before
#                                         # (machines without the package mirror)
#
# 4.30 MB of text: the first 95 % (4.08 M tokens) is train.bin, the rest
# (215 k tokens, the end of the New Testament) val.bin, so evaluation reads
# text the run never trains on. Needs root for apt-get (or bible-kjv
# installed); runs where the packages are reachable, then the files travel.
set -euo pipefail
out=${1:?usage: prepare_text.sh OUT_DIR}
mkdir -p "$out"
if [[ -n ${2:-} ]]; then
  [[ $2 -ef $out/kjv.txt ]] || cp "$2" "$out/kjv.txt"
else
  if ! command -v bible > /dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bible-kjv > /dev/null
  fi
  bible "Gen1:1-Rev22:21" > "$out/kjv.txt"
fi
python3 - "$out" <<'PY'
import sys, pathlib
out = pathlib.Path(sys.argv[1])
text = (out / "kjv.txt").read_bytes()
if len(text) < 4_000_000:
    sys.exit(f"kjv.txt has {len(text)} bytes; expected the whole Bible (~4.3 MB)")
ids = bytearray()
for b in text:  # uint16 little-endian per byte
    ids += bytes((b, 0))
cut = (len(text) * 95 // 100) * 2
(out / "train.bin").write_bytes(ids[:cut])
(out / "val.bin").write_bytes(ids[cut:])
print(f"{out}: {len(text)} bytes of text -> train.bin {cut // 2} tokens, "
      f"val.bin {(len(ids) - cut) // 2} tokens")
PY
