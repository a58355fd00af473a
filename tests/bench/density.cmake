# Idle sandboxes per host (issue 18, tests/bench/bench_density.c),
# included by tests/bench/CMakeLists.txt. It starts its own moat-vmd (TCG)
# per [vmd] ram-sharing mode; run it as
#   build/bin/moat-bench-density IMAGE_DIR tests/bench/results/density.json \
#     [copy,private [10,30 [IDLE_S]]]
add_executable(moat-bench-density ${CMAKE_CURRENT_LIST_DIR}/bench_density.c)
target_compile_definitions(moat-bench-density PRIVATE
  MOAT_VMD_BIN="$<TARGET_FILE:moat-vmd>")
target_link_libraries(moat-bench-density PRIVATE moat_bench_stats moat_rpc
  moat_proto PkgConfig::JANSSON Threads::Threads)
add_dependencies(moat-bench-density moat-vmd moat-qemu-ramro)
