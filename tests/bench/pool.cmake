# Warm VMM pool benchmark (tests/bench/bench_pool.c), included by
# tests/bench/CMakeLists.txt. It starts its own moat-vmds (TCG, pool off
# then on); run it as
#   build/bin/moat-bench-pool IMAGE_DIR tests/bench/results/pool.json
add_executable(moat-bench-pool ${CMAKE_CURRENT_LIST_DIR}/bench_pool.c)
target_compile_definitions(moat-bench-pool PRIVATE
  MOAT_VMD_BIN="$<TARGET_FILE:moat-vmd>")
target_link_libraries(moat-bench-pool PRIVATE moat_bench_stats moat_rpc
  moat_proto PkgConfig::JANSSON)
add_dependencies(moat-bench-pool moat-vmd)
