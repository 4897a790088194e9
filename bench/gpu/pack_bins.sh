#!/usr/bin/env bash
# Pack the device binaries of a CUDA build for a binary-vs-binary A/B (bench/gpu/ab_bins.sh):
#   bash bench/gpu/pack_bins.sh NAME [BUILD]    -> build-x/NAME.tar.xz (unpacks to build-NAME/)
# spattn and the GPU checks, stripped (~6 MB; build-x/ is ignored by git: pass carry: ["build-x"]
# to the device call).  Build first, e.g. cmake --build build-dev -j2 --target spattn_cli_main
# bsa_cuda_check bsa_varlen_cuda_check sfa_cuda_check sfa_varlen_cuda_check.
set -euo pipefail
cd "$(dirname "$0")/../.."
NAME=$1 BUILD=${2:-build-dev}
rm -rf "build-$NAME" && mkdir -p "build-$NAME/tools" build-x
cp "$BUILD/tools/spattn" "build-$NAME/tools/"
for p in bsa_cuda_check bsa_varlen_cuda_check sfa_cuda_check sfa_varlen_cuda_check; do
  [ -x "$BUILD/$p" ] && cp "$BUILD/$p" "build-$NAME/"
done
strip "build-$NAME/tools/spattn" "build-$NAME"/*_cuda_check 2>/dev/null || true
tar cJf "build-x/$NAME.tar.xz" "build-$NAME" && rm -rf "build-$NAME"
ls -la "build-x/$NAME.tar.xz"
