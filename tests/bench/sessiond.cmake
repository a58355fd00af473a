# Included by tests/bench/CMakeLists.txt: the durable AppendStep rate of
# moat-sessiond (bench_sessiond.c). It starts the binary itself:
#   build/bin/moat-bench-sessiond [OUT.json] [SECONDS] [DIR] [SESSIOND]
add_executable(moat-bench-sessiond
  ${CMAKE_CURRENT_LIST_DIR}/bench_sessiond.c)
target_link_libraries(moat-bench-sessiond PRIVATE moat_rpc moat_proto
  PkgConfig::JANSSON Threads::Threads)
target_compile_definitions(moat-bench-sessiond PRIVATE
  SESSIOND_BIN="$<TARGET_FILE:moat-sessiond>")
add_dependencies(moat-bench-sessiond moat-sessiond)
