# Sourced by .ci/run and scripts/test: `stage NAME COMMAND...` runs COMMAND and says on stderr
# how long it took, so a CI log shows where a fresh clone's time goes.
stage() {
  local name="$1" start=$SECONDS status=0
  shift
  "$@" || status=$?
  echo "stage ${name}: $((SECONDS - start)) s (exit ${status})" >&2
  return "$status"
}
