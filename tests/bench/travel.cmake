# Included by tests/bench/CMakeLists.txt: restore versus fork-of-8 wall
# time through the gateway (bench_travel.c). It needs a started stack:
#   build/bin/moat-bench-travel ipc://STATE/gateway.sock \
#     tests/bench/results/travel.json [ROUNDS]
add_executable(moat-bench-travel ${CMAKE_CURRENT_LIST_DIR}/bench_travel.c)
target_link_libraries(moat-bench-travel PRIVATE moat_bench_stats moat_client
  PkgConfig::JANSSON)
