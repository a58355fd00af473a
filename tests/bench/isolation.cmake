# The VMM jail's cost (tests/bench/bench_isolation.c), included by
# tests/bench/CMakeLists.txt. It starts its own moat-vmd per round; run as
#   build/bin/moat-bench-isolation IMAGE_DIR tests/bench/results/isolation.json [ROUNDS] [CALLS]
add_executable(moat-bench-isolation ${CMAKE_CURRENT_LIST_DIR}/bench_isolation.c)
target_compile_definitions(moat-bench-isolation PRIVATE
  MOAT_VMD_BIN="$<TARGET_FILE:moat-vmd>")
target_link_libraries(moat-bench-isolation PRIVATE moat_bench_stats moat_rpc
  moat_proto PkgConfig::JANSSON)
add_dependencies(moat-bench-isolation moat-vmd)
