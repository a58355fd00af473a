# Restore from RAM vs from an evicted copy (tests/bench/bench_evict.c),
# included by tests/bench/CMakeLists.txt. It starts its own moat-snapd
# and three moat-vmd (TCG); run it as
#   build/bin/moat-bench-evict IMAGE_DIR tests/bench/results/evict.json
add_executable(moat-bench-evict ${CMAKE_CURRENT_LIST_DIR}/bench_evict.c)
target_compile_definitions(moat-bench-evict PRIVATE
  MOAT_VMD_BIN="$<TARGET_FILE:moat-vmd>")
target_link_libraries(moat-bench-evict PRIVATE moat_bench_stats moat_rpc
  moat_proto PkgConfig::JANSSON)
add_dependencies(moat-bench-evict moat-vmd moat-snapd)
