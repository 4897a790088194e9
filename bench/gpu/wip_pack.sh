#!/usr/bin/env bash
# On the development machine: everything the open wip patches' device calls carry, from a clean
# checkout, in one command (18 min 51 s measured on the 2-core dev machine; build*/ is
# git-ignored, so each session rebuilds it).
#   bash bench/gpu/wip_pack.sh   -> build-v/pk.tar.xz (~43 MB) + build-v/racecheck_barred
# Builds build-dev (Release, CUDA, the checks), then the variants with variant_build.sh:
#   main    build-dev's own programs (spattn, sfa_cuda_check)
#   pl2     docs/wip/sfa_group_stpipe.patch (+ sfa_varlen_cuda_check, robust_cuda_check: its landing checks)
#   pl2tma  stpipe + docs/wip/sfa_group_tma.patch
#   pl2tr   stpipe, sfa_fwd_group.cu with -DSPATTN_CTA_TRACE (spattn only: step_trace.py)
#   vote2   docs/wip/sfa_vote_barsync.patch
#   pad     docs/wip/sfa_racecheck_pad.patch (+ sfa_varlen_cuda_check)
# and packs spattn + sfa_cuda_check of each (xz with one dictionary: the builds share most bytes).
# The device calls that use it: bench/gpu/wip_call.sh.  A patch that no longer applies stops it.
set -euo pipefail
cd "$(dirname "$0")/../.."
log=/tmp/wip_pack; mkdir -p $log build-v
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DSPATTN_CUDA=ON -DSPATTN_TESTS=ON > /dev/null
cmake --build build-dev -j"$(nproc)" --target spattn spattn_cli_main sfa_cuda_check \
  sfa_varlen_cuda_check robust_cuda_check bsa_cuda_check > $log/dev.log 2>&1 || { tail -20 $log/dev.log; exit 1; }
V=bench/gpu/variant_build.sh W=docs/wip
bash $V main > $log/main.log 2>&1
bash $V pl2 $W/sfa_group_stpipe.patch > $log/pl2.log 2>&1
bash $V pl2tma $W/sfa_group_stpipe.patch $W/sfa_group_tma.patch > $log/pl2tma.log 2>&1
VARIANT_DEFINES=-DSPATTN_CTA_TRACE bash $V pl2tr $W/sfa_group_stpipe.patch > $log/pl2tr.log 2>&1
bash $V vote2 $W/sfa_vote_barsync.patch > $log/vote2.log 2>&1
bash $V pad $W/sfa_racecheck_pad.patch > $log/pad.log 2>&1
grep -h 'spill warnings' $log/*.log
/usr/local/cuda/bin/nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc/cuda \
  -o build-v/racecheck_barred bench/gpu/racecheck_barred.cu
P=$(mktemp -d)
for v in main pl2 pl2tma pl2tr vote2 pad; do
  mkdir -p $P/build-$v/tools && cp build-$v/tools/spattn $P/build-$v/tools/
  [ $v = pl2tr ] || cp build-$v/sfa_cuda_check $P/build-$v/
done
cp build-pl2/sfa_varlen_cuda_check build-pl2/robust_cuda_check $P/build-pl2/
cp build-pad/sfa_varlen_cuda_check $P/build-pad/
(cd $P && tar cf - build-* | xz -T2 --lzma2=preset=9,dict=256MiB > "$OLDPWD/build-v/pk.tar.xz")
rm -rf $P
ls -la build-v
