# Body of LAUNCH/merge.sh, which `opforge slurm` and `opforge ray` write with these variables set
# above it: OPFORGE, ROOT, SHARDS, STAGES, DEDUP_ARGS and EXPORT_ARGS (arrays).
# Runs after every shard finished: merges ROOT/shards/0..N-1 into ROOT/merged (rebuilt from the
# shards each time, so a rerun after a resubmission sees every shard), then, when the shards were
# filtered, dedup and export on it. Prints the export folder on stdout.
set -euo pipefail
log() { printf '[opforge merge %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

shards=()
missing=()
for ((i = 0; i < SHARDS; i++)); do
  d=$ROOT/shards/$i
  if [ -f "$d/done/launch.shard-$i-of-$SHARDS.json" ]; then shards+=("$d"); else missing+=("$i"); fi
done
if ((${#missing[@]})); then
  log "shards ${missing[*]} of $SHARDS have not finished (no ROOT/shards/I/done/launch.shard-I-of-$SHARDS.json in $ROOT):" \
    "see their logs in $ROOT/logs and submit again; finished shards are skipped"
  exit 1
fi

out=$ROOT/merged
rm -rf "$out"
log "opforge merge --out $out (${#shards[@]} shards)"
# Each stage's stdout (merge's report, export's folder) to the log: this script's is the export folder.
"$OPFORGE" merge --out "$out" "${shards[@]}" >&2
if [[ " ${STAGES[*]} " != *" filter "* ]]; then
  log "the shards were not filtered: no dedup or export"
  echo "$out"
  exit 0
fi
log "opforge dedup ${DEDUP_ARGS[*]}"
"$OPFORGE" dedup --workspace "$out" "${DEDUP_ARGS[@]}" >&2
log "opforge export ${EXPORT_ARGS[*]}"
"$OPFORGE" export --workspace "$out" --out "$out/export" "${EXPORT_ARGS[@]}" >&2
log "done: the export is in $out/export"
echo "$out/export"
