# Tests of the command line (included from tools/CMakeLists.txt).  Unit tests link the tools
# library; the end-to-end tests run the spattn executable through run_cli.cmake, which checks
# exit codes and output.
enable_testing()
set(cli_tests ${CMAKE_CURRENT_SOURCE_DIR}/tests)
foreach(t test_cli_eco test_cli_cases test_cli_gen test_cli_json test_cli_varlen)
  add_executable(${t} ${cli_tests}/${t}.c)
  target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${t} PRIVATE SPATTN_TEST_CASES_DIR="${PROJECT_SOURCE_DIR}/cases")
  target_link_libraries(${t} PRIVATE spattn_cli)
  add_test(NAME ${t} COMMAND ${t})
  set_tests_properties(${t} PROPERTIES TIMEOUT 300)
endforeach()

set(out ${CMAKE_CURRENT_BINARY_DIR})
function(cli_test name rc args)
  cmake_parse_arguments(T "" "MATCH;NOMATCH;CHECK_KIND;CHECK_FILE;EXISTS_FILE;FILE_MATCH" "" ${ARGN})
  set(extra)
  if(T_CHECK_KIND)
    list(APPEND extra -DCHECKER=$<TARGET_FILE:test_cli_json> -DCHECK_KIND=${T_CHECK_KIND}
         -DCHECK_FILE=${T_CHECK_FILE})
  endif()
  if(T_EXISTS_FILE)
    list(APPEND extra -DEXISTS_FILE=${T_EXISTS_FILE})
  endif()
  if(T_FILE_MATCH) # regexes CHECK_FILE must contain
    list(APPEND extra "-DFILE_MATCH=${T_FILE_MATCH}")
    if(NOT T_CHECK_KIND)
      list(APPEND extra -DCHECK_FILE=${T_CHECK_FILE})
    endif()
  endif()
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:spattn_cli_main>
           "-DARGS=${args}" -DRC=${rc} "-DMATCH=${T_MATCH}" "-DNOMATCH=${T_NOMATCH}" ${extra}
           -P ${cli_tests}/run_cli.cmake)
  set_tests_properties(${name} PROPERTIES TIMEOUT 600 ENVIRONMENT "OMP_NUM_THREADS=2")
endfunction()

# Arguments and MATCH regexes are separated by '@' (regexes use '|').
# verify: the tiny suite passes on the CPU, scaled, with a JSON report.
cli_test(cli_verify_tiny 0
  "verify@--backend@cpu@--suite@${cli_tests}/tiny.cases@--scale@0.75@--json@${out}/verify_tiny.json"
  MATCH "bsa 5/5 passed@sfa 4/4 passed@SCALED RUN: sequence lengths x0.75@scaled run"
  CHECK_KIND verify CHECK_FILE ${out}/verify_tiny.json)
# Filters: one pass, one dtype, a regex; unscaled output must not claim scaling.
cli_test(cli_verify_filters 0
  "verify@--backend@cpu@--suite@${cli_tests}/tiny.cases@--scale@1@--pass@fwd@--dtype@fp16@--case@causal$"
  MATCH "bsa 1/1 passed@fwd.lse" NOMATCH "SCALED|bwd.dq")
# The public suites' smallest cases at a small scale (quick smoke test of the real files).
cli_test(cli_verify_public_smoke 0
  "verify@--backend@cpu@--scale@0.03125@--case@^(bsa01|bsa12|sfa01)_"
  MATCH "bsa 2/2 passed@sfa 1/1 passed@x0.03125")
# A case the backend rejects is a failed case: exit 1, message with file:line.
cli_test(cli_verify_unsupported 1
  "verify@--backend@cpu@--suite@${cli_tests}/unsupported.cases"
  MATCH "unsupported.cases:4: case odd_head_dim@NOT_SUPPORTED@bsa 1/2 passed@odd_head_dim +UNSUP@1 not supported by the cpu backend")
# A tensor outside the criterion is a failed case: --perturb shifts our outputs (exit 1).
cli_test(cli_verify_perturb 1
  "verify@--backend@cpu@--suite@${cli_tests}/tiny.cases@--case@^tiny_(bsa|sfa)_causal$@--perturb@0.05"
  MATCH "bsa 0/1 passed@sfa 0/1 passed@FAIL +fwd.o@worst.*got.*want@FAILED: tiny_bsa_causal")
# Input errors: exit 2 with file:line.
cli_test(cli_bad_line 2 "verify@--suite@${cli_tests}/bad.cases"
  MATCH "bad.cases:3: case bad_case: unknown key 'colour'")
cli_test(cli_missing_file 2 "verify@--suite@${out}/no_such_suite.cases"
  MATCH "no_such_suite.cases:0: cannot open case file")
cli_test(cli_missing_suite_name 2 "verify@--cases-dir@${cli_tests}@--suite@nosuch"
  MATCH "nosuch.cases:0: cannot open")
cli_test(cli_bad_option 2 "verify@--frobnicate" MATCH "unknown option '--frobnicate'")
cli_test(cli_bad_scale 2 "verify@--scale@2" MATCH "--scale: expected a number in")
cli_test(cli_bad_regex 2 "verify@--case@(" MATCH "bad regular expression")
cli_test(cli_no_match 2 "verify@--suite@${cli_tests}/tiny.cases@--case@^zzz" MATCH "no case matches")
cli_test(cli_unknown_command 2 "frob" MATCH "unknown command")
# bench: JSON, compare against itself (ratio 1), SVG.
cli_test(cli_bench_tiny 0
  "bench@--backend@cpu@--suite@${cli_tests}/tiny.cases@--case@tiny_(bsa|sfa)_causal@--repeats@3@--warmup@1@--json@${out}/bench_tiny.json"
  MATCH "median_ms@tiny_bsa_causal +fwd@tiny_sfa_causal +bwd"
  CHECK_KIND bench CHECK_FILE ${out}/bench_tiny.json)
cli_test(cli_bench_compare 0
  "bench@--load@${out}/bench_tiny.json@--compare@${out}/bench_tiny.json@--svg@${out}/bench_tiny.svg"
  MATCH "geometric mean vs spattn cpu: 1.000x over 4" EXISTS_FILE ${out}/bench_tiny.svg)
set_tests_properties(cli_bench_compare PROPERTIES DEPENDS cli_bench_tiny)
cli_test(cli_bench_bad_peer 2 "bench@--load@${cli_tests}/bad.cases" MATCH "bad.cases: line 1")
# Issue 16 (defect 9): an unwritable --json / --svg fails before the run, options a command
# would ignore are errors, an empty case file says so.
cli_test(cli_json_unwritable 2
  "verify@--backend@cpu@--suite@${cli_tests}/tiny.cases@--json@${out}/no_such_dir/v.json"
  MATCH "no_such_dir/v.json: cannot open for writing" NOMATCH "passed|tiny_")
cli_test(cli_svg_unwritable 2
  "bench@--backend@cpu@--suite@${cli_tests}/tiny.cases@--svg@${out}/no_such_dir/b.svg"
  MATCH "no_such_dir/b.svg: cannot open for writing" NOMATCH "median_ms")
cli_test(cli_list_json 2 "list@--suite@${cli_tests}/tiny.cases@--json@${out}/list.json"
  MATCH "--json belongs to")
cli_test(cli_verify_repeats 2 "verify@--suite@${cli_tests}/tiny.cases@--repeats@3"
  MATCH "--repeats and --warmup belong to")
cli_test(cli_empty_cases 2 "list@--suite@${cli_tests}/empty.cases"
  MATCH "empty.cases:0: the file holds no case" NOMATCH "no case matches")
# bsa plans in bench: reused (default) and per call give a result each; bad values and use
# outside bench are usage errors.
cli_test(cli_bench_plan_call 0
  "bench@--backend@cpu@--suite@${cli_tests}/tiny.cases@--case@tiny_bsa_(causal|window)@--repeats@2@--warmup@0@--plan@call@--json@${out}/bench_plan_call.json"
  MATCH "tiny_bsa_causal +fwd@tiny_bsa_window +bwd"
  CHECK_KIND bench CHECK_FILE ${out}/bench_plan_call.json)
cli_test(cli_plan_bad_value 2 "bench@--plan@sometimes" MATCH "--plan: expected reuse or call")
cli_test(cli_plan_not_bench 2 "verify@--plan@call" MATCH "--plan belongs to 'spattn bench'")
# bench --dump (issue 16, deliverable 7): every case's mask / indices and a JSON header for the
# peer scripts; the reused plans are checked bit for bit against plain calls; the reader the
# peers use (bench/peers/spattn_dump.py, standard library only) recounts the pairs from the
# data and must agree with the header.
cli_test(cli_bench_dump 0
  "bench@--backend@cpu@--suite@${cli_tests}/tiny.cases@--scale@1@--repeats@1@--warmup@0@--dump@${out}/dump@--json@${out}/bench_dump.json"
  MATCH "bsa plan reused: 10/10 case-passes bitwise equal"
  CHECK_KIND bench CHECK_FILE ${out}/bench_dump.json EXISTS_FILE ${out}/dump/tiny_sfa_m0_sbs4.json)
find_program(SPATTN_PYTHON3 NAMES python3)
if(SPATTN_PYTHON3)
  add_test(NAME cli_bench_dump_read
           COMMAND ${SPATTN_PYTHON3} ${PROJECT_SOURCE_DIR}/bench/peers/spattn_dump.py ${out}/dump)
  set_tests_properties(cli_bench_dump_read PROPERTIES DEPENDS cli_bench_dump
    PASS_REGULAR_EXPRESSION "tiny_bsa_random .* ok.*tiny_sfa_m0_sbs4 .* ok.*spattn_dump: 0 bad case")
endif()
cli_test(cli_dump_not_bench 2 "verify@--dump@${out}/dump" MATCH "--dump belongs to 'spattn bench'")
cli_test(cli_dump_with_load 2 "bench@--load@${out}/bench_tiny.json@--dump@${out}/dump"
  MATCH "without --load")
# --peak (cpu): the measured FMA peak and each rate as a fraction of it (the former
# spattn_bench_cpu's report), also in the JSON; the public CPU shapes file parses.
cli_test(cli_bench_peak 0
  "bench@--backend@cpu@--suite@${cli_tests}/tiny.cases@--case@tiny_(bsa|sfa)_causal@--repeats@2@--warmup@0@--peak@--json@${out}/bench_peak.json"
  MATCH "fp32 FMA peak \\(measured@%peak +best% +cpu%@tiny_sfa_causal +bwd"
  CHECK_KIND bench CHECK_FILE ${out}/bench_peak.json)
cli_test(cli_peak_not_bench 2 "verify@--peak" MATCH "--peak belongs to 'spattn bench'")
cli_test(cli_cpu_cases 0 "list@--suite@${PROJECT_SOURCE_DIR}/bench/cpu.cases"
  MATCH "22 cases")
# --deterministic 0|1 (verify, bench): spattn_options.deterministic of the backward calls; the
# value lands in the JSON ("deterministic": 0), other values and use with list / --load are
# usage errors; a bench file written before the key existed still loads (deterministic).
cli_test(cli_deterministic_bad_value 2 "bench@--backend@cpu@--deterministic@2"
  MATCH "--deterministic: expected 0 or 1, got '2'" NOMATCH "median_ms")
cli_test(cli_deterministic_bad_value_verify 2 "verify@--deterministic=yes"
  MATCH "--deterministic: expected 0 or 1, got 'yes'")
cli_test(cli_deterministic_not_list 2 "list@--deterministic@0"
  MATCH "--deterministic belongs to 'spattn verify' and 'spattn bench'")
cli_test(cli_bench_deterministic_0 0
  "bench@--backend@cpu@--suite@${cli_tests}/tiny.cases@--op@bsa@--case@^tiny_bsa_causal$@--pass@bwd@--repeats@1@--warmup@0@--deterministic@0@--json@${out}/bench_det0.json"
  MATCH "NON-DETERMINISTIC backward@tiny_bsa_causal +bwd@bsa plan reused: 1/1"
  CHECK_KIND bench CHECK_FILE ${out}/bench_det0.json
  FILE_MATCH "\"deterministic\": 0,")
cli_test(cli_bench_deterministic_load 0
  "bench@--load@${cli_tests}/bench_no_det.json@--compare@${out}/bench_det0.json"
  MATCH "tiny_bsa_causal +bwd +[0-9.]+@geometric mean vs spattn cpu nondet: [0-9.]+x over 1 ")
set_tests_properties(cli_bench_deterministic_load PROPERTIES DEPENDS cli_bench_deterministic_0)
cli_test(cli_deterministic_with_load 2 "bench@--load@${cli_tests}/bench_no_det.json@--deterministic@1"
  MATCH "without --load")
cli_test(cli_verify_deterministic_0 0
  "verify@--backend@cpu@--suite@${cli_tests}/tiny.cases@--case@^tiny_(bsa|sfa)_causal$@--deterministic@0@--json@${out}/verify_det0.json"
  MATCH "NON-DETERMINISTIC backward@bsa 1/1 passed@sfa 1/1 passed"
  CHECK_KIND verify CHECK_FILE ${out}/verify_det0.json
  FILE_MATCH "\"deterministic\": 0,")
cli_test(cli_dump_not_dir 2
  "bench@--backend@cpu@--suite@${cli_tests}/tiny.cases@--dump@${cli_tests}/tiny.cases"
  MATCH "not a directory" NOMATCH "median_ms")

# Issue 14: varlen / paged cases (cases/README.md, "Varlen and paged cases").  The tiny suite
# at full size and scaled (every feature: empty sequences, pages, GQA, three dtypes), the
# quick cases of the public varlen suites, bench (paged bsa and sfa with backward rows), list, and a
# bad varlen line.  Together a few seconds on 2 cores.
cli_test(cli_verify_varlen_tiny 0
  "verify@--backend@cpu@--suite@${cli_tests}/tiny_varlen.cases@--scale@1@--json@${out}/verify_varlen.json"
  MATCH "bsa 4/4 passed@sfa 4/4 passed@tvl_bsa_paged +pass +fwd.o@bwd.dv[^t]+tvl_bsa_bigbird@tvl_sfa_paged +pass"
  NOMATCH "SCALED"
  CHECK_KIND verify CHECK_FILE ${out}/verify_varlen.json)
cli_test(cli_verify_varlen_scaled 0
  "verify@--backend@cpu@--suite@${cli_tests}/tiny_varlen.cases@--scale@0.5"
  MATCH "bsa 4/4 passed@sfa 4/4 passed@x0.5")
cli_test(cli_verify_varlen_public_smoke 0
  "verify@--backend@cpu@--suite@bsa_varlen@--suite@sfa_varlen@--scale@0.01@--case@^(bsav03|bsav05|sfav03|sfav05)_"
  MATCH "bsa 2/2 passed@sfa 2/2 passed")
cli_test(cli_verify_varlen_perturb 1
  "verify@--backend@cpu@--suite@${cli_tests}/tiny_varlen.cases@--case@^tvl_(bsa|sfa)_paged$@--perturb@0.05"
  MATCH "bsa 0/1 passed@sfa 0/1 passed")
cli_test(cli_bench_varlen 0
  "bench@--backend@cpu@--suite@${cli_tests}/tiny_varlen.cases@--repeats@2@--warmup@0@--json@${out}/bench_varlen.json"
  MATCH "tvl_bsa_paged +fwd@tvl_bsa_paged +bwd@tvl_sfa_paged +bwd@tvl_sfa_decode +fwd"
  CHECK_KIND bench CHECK_FILE ${out}/bench_varlen.json)
# --varlen-baselines (issue 14, item 6): the loop of dense calls and the block-diagonal dense
# call beside the packed one, checked against it, on the public varlen suites (padded bsa
# layouts, sfa mode 3 and sbs 4, paged keys, empty sequences) and the tiny ones at full size.
# About 30 s on 2 cores in the Release build; the sanitizer build (many times slower) runs the
# quick cases only.
if(SPATTN_SANITIZE)
  set(vlb_cases "@--case@^(bsav03|bsav05|sfav03|sfav05)_")
  set(vlb_match "bsav05_paged_p16_empty +bwd@sfav03_empty_seqs_m0 +bwd")
else()
  set(vlb_cases "")
  set(vlb_match "bsav08_causal_32k_b128 +fwd@sfav07_packed_32k +bwd")
endif()
cli_test(cli_bench_varlen_baselines 0
  "bench@--backend@cpu@--scale@0.0625@--varlen-baselines@--suite@bsa_varlen@--suite@sfa_varlen@--repeats@1@--warmup@0${vlb_cases}@--json@${out}/bench_varlen_base.json"
  MATCH "loop/packed@${vlb_match}@block-diagonal padded@sfav05_paged_gqa_p16 bwd: .*block-diagonal skipped"
  NOMATCH "FAIL|ERROR"
  CHECK_KIND bench CHECK_FILE ${out}/bench_varlen_base.json
  FILE_MATCH "\"varlen_baselines\": true@\"loop_median_ms\": [0-9]@\"blockdiag_flops\": [0-9]@\"packed_over_blockdiag\": [0-9]@\"loop_over_packed\": [0-9]@\"baselines_match\": true")
cli_test(cli_bench_varlen_baselines_load 0 "bench@--load@${out}/bench_varlen_base.json"
  MATCH "loop_ms +diag_ms +packed/diag +loop/packed@sfav05_paged_gqa_p16 +fwd( +[0-9.e+-]+)+ +- +- +[0-9.]+")
set_tests_properties(cli_bench_varlen_baselines_load PROPERTIES DEPENDS cli_bench_varlen_baselines)
cli_test(cli_bench_varlen_baselines_tiny 0
  "bench@--backend@cpu@--scale@1@--varlen-baselines@--suite@${cli_tests}/tiny_varlen.cases@--suite@${cli_tests}/varlen_baselines.cases@--repeats@1@--warmup@0"
  MATCH "loop/packed@tvl_bsa_paged +bwd@tvl_sfa_paged +bwd@vlb_sfa_sbs4 +bwd +[0-9.e+-]+ +[0-9.e+-]+ +[0-9.e+-]+ +[0-9.e+-]+ +[0-9.e+-]+ +[0-9.e+-]+ +[0-9.e+-]+ +[0-9.e+-]+ +[0-9.e+-]+@vlb_sfa_sbs4_odd bwd: block-diagonal skipped"
  NOMATCH "FAIL|ERROR|vlb_bsa_aligned [a-z]+: block-diagonal padded")
cli_test(cli_varlen_baselines_not_bench 2 "verify@--varlen-baselines"
  MATCH "--varlen-baselines belongs to 'spattn bench' without --load")
cli_test(cli_list_varlen 0 "list@--backend@cpu@--suite@bsa_varlen@--suite@sfa_varlen"
  MATCH "bsav04_paged_gqa_prefill .* page=64@sfav06_paged_decode .*Tq=64@15 cases")
cli_test(cli_bad_varlen_line 2 "verify@--suite@${cli_tests}/bad_varlen.cases"
  MATCH "bad_varlen.cases:3: case bad_varlen: key 'B' is derived")
