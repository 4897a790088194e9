#!/usr/bin/env bash
# On the development machine: the device programs of a variant of this tree (wip patches
# applied) without a full build.  The library sources the patches change or add, and those whose
# build-dev dependency files name a changed header, are compiled with build-dev's own flags;
# the objects replace theirs in a copy of build-dev's libspattn.a and the programs are relinked
# with build-dev's link lines (a changed kernel file costs its compile, ~1.5-5 min on 2 cores,
# instead of a full CUDA build).
#   bash bench/gpu/variant_build.sh NAME [PATCH ...]
#     -> build-NAME/tools/spattn and build-NAME/{sfa,sfa_varlen,robust,bsa}_cuda_check (stripped)
#   VARIANT_DEFINES="-DSPATTN_CTA_TRACE" adds defines to the recompiled sources only (a trace build
#   of the kernel file a patch changes: its launcher is in the same file)
# build-dev must be built (bench/gpu/carry_build.sh builds it) at the commit the patches apply
# to; with no patch the programs are build-dev's (a base for an A/B).  Sources outside src/ may
# not change (the CLI and the checks are relinked, not recompiled).  Pack variants together, so
# that xz's dictionary shares their identical bytes (six builds ~42 MB):
#   tar cf - build-A build-B | xz --lzma2=preset=9,dict=256MiB > build-v/NAME.tar.xz
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
NAME=${1:?usage: variant_build.sh NAME [PATCH ...]}
shift
DEV=$ROOT/build-dev
OBJD=$DEV/CMakeFiles/spattn_obj.dir
[ -f "$DEV/libspattn.a" ] && [ -d "$OBJD" ] || { echo "variant_build: build build-dev first" >&2; exit 1; }
OUT=$ROOT/build-$NAME
WORK=$(mktemp -d /tmp/variant_XXXXXX)
TREE=$WORK/tree
trap 'git -C "$ROOT" worktree remove --force "$TREE" > /dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
git worktree add -q --detach "$TREE" HEAD
for p in "$@"; do git -C "$TREE" apply "$(realpath "$p")"; done
git -C "$TREE" add -A  # new files of the patches too
mapfile -t changed < <(git -C "$TREE" diff --cached --name-only HEAD)
if git -C "$TREE" diff --cached --name-only --diff-filter=D HEAD | grep -q '^src/'; then
  echo "variant_build: a patch deletes a source (its object would stay in the library)" >&2; exit 1
fi
for f in "${changed[@]}"; do
  case "$f" in src/*|docs/*|bench/*|README.md) ;; *) echo "variant_build: $f changes outside src/ (not handled)" >&2; exit 1 ;; esac
done

# objects to rebuild: changed sources, and sources whose dependency file names a changed header
declare -A redo=()
for f in "${changed[@]}"; do
  case "$f" in
  src/*.cu|src/*.c) redo[$f]=1 ;;
  src/*.cuh|src/*.h)
    while IFS= read -r d; do
      s=${d#"$OBJD"/}; s=${s%.o.d}
      redo[$s]=1
    done < <(grep -l -- "$ROOT/$f" $(find "$OBJD" -name '*.o.d') || true) ;;
  esac
done

flag() { sed -n "s/^$1 = //p" "$OBJD/flags.make"; }
CUDA_DEFINES="$(flag CUDA_DEFINES) ${VARIANT_DEFINES:-}" CUDA_FLAGS=$(flag CUDA_FLAGS)
C_DEFINES="$(flag C_DEFINES) ${VARIANT_DEFINES:-}" C_FLAGS=$(flag C_FLAGS)
INC="-I$TREE/include -I$TREE/src"
mkdir -p "$WORK/obj"
cp "$DEV/libspattn.a" "$WORK/libspattn.a"
for s in "${!redo[@]}"; do
  o=$WORK/obj/$(basename "$s").o
  echo "variant_build: compiling $s"
  if [[ $s == *.cu ]]; then
    # shellcheck disable=SC2086
    /usr/local/cuda/bin/nvcc -forward-unknown-to-host-compiler $CUDA_DEFINES $INC -isystem=/usr/local/cuda/include \
      $CUDA_FLAGS -x cu -c "$TREE/$s" -o "$o" > "$o.log" 2>&1 || { tail -20 "$o.log" >&2; exit 1; }
  else
    # shellcheck disable=SC2086
    cc $C_DEFINES $INC -isystem /usr/local/cuda/include $C_FLAGS -c "$TREE/$s" -o "$o"
  fi
  (cd "$WORK/obj" && ar r "$WORK/libspattn.a" "$(basename "$o")")  # replaced, or added (a new source)
done

# relink with build-dev's link lines, libspattn.a replaced
rm -rf "$OUT" && mkdir -p "$OUT/tools"
relink() {  # DIR TARGET DEST: the target's link line run in DIR, the library swapped
  local dir=$1 tgt=$2 dest=$3 cmd
  cmd=$(sed -e "s#@CMakeFiles/$tgt.dir/objects1#$(tr '\n' ' ' < "$dir/CMakeFiles/$tgt.dir/objects1")#" \
            -e "s#@CMakeFiles/$tgt.dir/linkLibs.rsp#$(tr '\n' ' ' < "$dir/CMakeFiles/$tgt.dir/linkLibs.rsp")#" \
            -e "s# -o [^ ]*# -o $dest#" "$dir/CMakeFiles/$tgt.dir/link.txt")
  cmd=$(sed -e "s#\(^\| \)\(\.\./\)\{0,1\}libspattn\.a#\1$WORK/libspattn.a#" <<< "$cmd")
  (cd "$dir" && eval "$cmd")
}
relink "$DEV/tools" spattn_cli_main "$OUT/tools/spattn"
for c in sfa_cuda_check sfa_varlen_cuda_check robust_cuda_check bsa_cuda_check; do
  [ -f "$DEV/CMakeFiles/$c.dir/link.txt" ] && relink "$DEV" "$c" "$OUT/$c"
done
strip "$OUT/tools/spattn" "$OUT"/*_cuda_check
for s in "${!redo[@]}"; do  # ptxas's spill warnings per compiled kernel file (compare with main's)
  if [[ $s == *.cu ]]; then
    echo "variant_build: $s: $(tr -cd '\11\12\15\40-\176' < "$WORK/obj/$(basename "$s").o.log" | grep -c 'spill' || true) ptxas spill warnings"
  fi
done
ls -la "$OUT" "$OUT/tools"
