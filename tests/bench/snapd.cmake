# The snapshot store's benchmark (tests/bench/bench_snapd.c), included by
# tests/bench/CMakeLists.txt. It starts its own moat-snapd; run it as
#   build/bin/moat-bench-snapd tests/bench/results/snapd.json
add_executable(moat-bench-snapd ${CMAKE_CURRENT_LIST_DIR}/bench_snapd.c)
target_link_libraries(moat-bench-snapd PRIVATE moat_snap_client moat_rpc
  moat_proto PkgConfig::JANSSON)
add_dependencies(moat-bench-snapd moat-snapd)
