# Included by tests/bench/CMakeLists.txt: issue 13's figures across hosts
# (bench_cluster.c), run by tests/bench/cluster.sh, which starts a
# three-host TLS cluster (tests/integration/cluster/cluster_lib.sh) and a
# one-host ipc stack side by side.
add_executable(moat-bench-cluster ${CMAKE_CURRENT_LIST_DIR}/bench_cluster.c)
target_link_libraries(moat-bench-cluster PRIVATE moat_bench_stats
  moat_client PkgConfig::JANSSON)
