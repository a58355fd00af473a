# Long execs through the gateway while GetSandbox is probed
# (tests/bench/bench_async_exec.c), included by tests/bench/CMakeLists.txt.
# Against a running stack (deploy/moat-stack start):
#   build/bin/moat-bench-async-exec ipc://STATE/gateway.sock \
#     "$(cat STATE/api-key)" tests/bench/results/async_exec.json
# tests/integration/stack/async_exec_test.sh runs it with --check.
add_executable(moat-bench-async-exec
  ${CMAKE_CURRENT_LIST_DIR}/bench_async_exec.c)
target_link_libraries(moat-bench-async-exec PRIVATE moat_bench_stats
  moat_rpc moat_proto PkgConfig::JANSSON)
