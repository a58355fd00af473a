# Local snapshot benchmark (tests/bench/bench_snapshot.c), included by
# tests/bench/CMakeLists.txt. It starts its own moat-vmd (TCG); run it as
#   build/bin/moat-bench-snapshot IMAGE_DIR tests/bench/results/snapshot.json
add_executable(moat-bench-snapshot ${CMAKE_CURRENT_LIST_DIR}/bench_snapshot.c)
target_compile_definitions(moat-bench-snapshot PRIVATE
  MOAT_VMD_BIN="$<TARGET_FILE:moat-vmd>")
target_link_libraries(moat-bench-snapshot PRIVATE moat_bench_stats moat_rpc moat_proto
  PkgConfig::JANSSON)
add_dependencies(moat-bench-snapshot moat-vmd)
