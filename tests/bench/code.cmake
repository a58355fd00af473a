# The code contexts benchmark (tests/bench/bench_code.c), included by
# tests/bench/CMakeLists.txt. It starts its own moat-vmd; run it as
#   build/bin/moat-bench-code IMAGE_DIR tests/bench/results/code.json [N]
add_executable(moat-bench-code ${CMAKE_CURRENT_LIST_DIR}/bench_code.c)
target_compile_definitions(moat-bench-code PRIVATE
  MOAT_VMD_BIN="$<TARGET_FILE:moat-vmd>")
target_link_libraries(moat-bench-code PRIVATE moat_bench_stats moat_rpc moat_proto
  PkgConfig::JANSSON)
add_dependencies(moat-bench-code moat-vmd)
