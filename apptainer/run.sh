#!/usr/bin/env bash
# Build and use the lab's Apptainer image.
#   apptainer/run.sh build [apptainer build options]   # apptainer/lab.sif from apptainer/lab.def
#   apptainer/run.sh exec CMD [ARGS...]                # run CMD in the image
#   apptainer/run.sh shell                             # interactive shell in the image
# The repository, data/ and results/ are bind-mounted (LAB_DATA / LAB_RESULTS
# may point elsewhere, e.g. a scratch file system); --nv is added on machines
# with NVIDIA GPUs. LAB_CONTAINER overrides the image path (the same variable
# that makes the batch script and the ranks use the image). --print shows the
# command instead of running it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGE=${LAB_CONTAINER:-$ROOT/apptainer/lab.sif}
DATA=${LAB_DATA:-$ROOT/data}
RESULTS=${LAB_RESULTS:-$ROOT/results}
PRINT=0
if [ "${1:-}" = "--print" ]; then PRINT=1; shift; fi
run() {
    if [ $PRINT = 1 ]; then printf '%q ' "$@"; echo; return; fi
    # `type -P` looks at PATH only: a directory named apptainer/ (this one) is never taken for the program
    if ! type -P apptainer >/dev/null; then
        echo "error: apptainer is not installed on $(hostname) (not on PATH); load it (e.g. 'module load apptainer')" \
             "or unset LAB_CONTAINER to use the project's .venv" >&2
        exit 127
    fi
    exec "$@"
}
gpu_flag() {
    if [ -n "${LAB_NV:-}" ]; then [ "$LAB_NV" = 1 ] && echo --nv; return; fi
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo --nv; fi
}
binds=(--bind "$ROOT:$ROOT" --bind "$DATA:$ROOT/data" --bind "$RESULTS:$ROOT/results")
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    build)
        run apptainer build "$@" "$IMAGE" "$ROOT/apptainer/lab.def" ;;
    exec)
        [ $# -gt 0 ] || { echo "usage: $0 exec CMD [ARGS...]" >&2; exit 2; }
        # shellcheck disable=SC2046
        run apptainer exec $(gpu_flag) "${binds[@]}" --pwd "$ROOT" "$IMAGE" "$@" ;;
    shell)
        # shellcheck disable=SC2046
        run apptainer shell $(gpu_flag) "${binds[@]}" --pwd "$ROOT" "$IMAGE" ;;
    *)
        echo "usage: $0 [--print] build|exec|shell [ARGS...]" >&2
        exit 2 ;;
esac
