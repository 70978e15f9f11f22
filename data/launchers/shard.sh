# Body of LAUNCH/shard.sh, which `opforge slurm` and `opforge ray` write with these variables set
# above it: OPFORGE (the binary), BASE (the crawled workspace), ROOT (--workspace-root, on a
# filesystem every node sees), SHARDS, STAGES, COMPOSE_ARGS and FILTER_ARGS (arrays), and CONFIG
# (a hash of the stages and options, kept in the marker).
# `shard.sh I` runs shard I of SHARDS: copy the base's database to node-local disk, run the stages
# there, write the completion marker, then stage the workspace to ROOT/shards/I in one rename.
# A shard whose marker is already in ROOT/shards/I is skipped, so a resubmitted array (or a
# retried Ray task) repeats only unfinished shards; an unfinished one starts over from the base.
set -euo pipefail
i=${1:?usage: shard.sh SHARD_INDEX}
tag="shard-$i-of-$SHARDS"
dest=$ROOT/shards/$i
marker=done/launch.$tag.json
log() { printf '[opforge %s %s] %s\n' "$tag" "$(date -u +%H:%M:%S)" "$*" >&2; }
# Whether ROOT/shards/I holds a marker of this stages-and-options hash.
finished_here() { grep -q "\"config\": \"$CONFIG\"" "$dest/$marker" 2> /dev/null; }

if [ -f "$dest/$marker" ]; then
  if ! finished_here; then
    log "$dest finished with other options than these ($CONFIG): remove it, or run with those options"
    exit 1
  fi
  log "already finished ($dest/$marker exists): skipping"
  exit 0
fi
# Node-local scratch: Slurm's per-job folder where the site sets one, else TMPDIR, else /tmp.
scratch=${SLURM_TMPDIR:-${TMPDIR:-/tmp}}
work=$(mktemp -d "$scratch/opforge-$tag.XXXXXX")
trap 'rm -rf "$work"' EXIT
ws=$work/ws
mkdir -p "$ws"
[ -f "$BASE/opforge.db" ] || { log "no opforge.db in the base workspace $BASE: crawl it first (opforge crawl --workspace $BASE)"; exit 1; }
# The database (with its WAL when one was left) is all a stage reads of the base; nothing writes it now.
for f in "$BASE/opforge.db" "$BASE/opforge.db-wal"; do [ -f "$f" ] && cp "$f" "$ws/"; done
log "on $(hostname), workspace $ws${CUDA_VISIBLE_DEVICES:+, CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES}"

start=$(date +%s)
for stage in "${STAGES[@]}"; do
  case $stage in
    compose) args=(--shard "$i/$SHARDS" "${COMPOSE_ARGS[@]}") ;;
    # After compose --shard the workspace holds this shard's candidates only (its blocks of
    # indices), and the filter judges them all: its own --shard splits by task id, another rule,
    # for shards that filter one composed base.
    filter) args=("${FILTER_ARGS[@]}")
      [[ " ${STAGES[*]} " == *" compose "* ]] || args=(--shard "$i/$SHARDS" "${args[@]}") ;;
    *) log "unknown stage $stage (known: compose, filter)"; exit 2 ;;
  esac
  log "opforge $stage ${args[*]}"
  "$OPFORGE" "$stage" --workspace "$ws" "${args[@]}" >&2
done

mkdir -p "$ws/done"
printf '{"shard": %d, "shards": %d, "config": "%s", "stages": "%s", "host": "%s", "seconds": %d, "finished": "%s"}\n' \
  "$i" "$SHARDS" "$CONFIG" "${STAGES[*]}" "$(hostname)" $(($(date +%s) - start)) "$(date -u +%FT%TZ)" > "$ws/$marker"
# Staged under a hidden name first (ROOT/shards/* never matches it), then renamed: ROOT/shards/I
# appears whole or not at all. Two attempts of one shard (a retried task) stage apart.
mkdir -p "$ROOT/shards"
partial=$ROOT/shards/.$i.partial.$(hostname).$$
rm -rf "$partial"
cp -r "$ws" "$partial"
if ! mv -T "$partial" "$dest" 2> /dev/null; then
  if finished_here; then
    log "another attempt staged $dest first: keeping it"
    rm -rf "$partial"
    exit 0
  fi
  rm -rf "$dest"  # an unfinished copy from before markers: replaced
  mv -T "$partial" "$dest"
fi
log "staged to $dest"
