# Included by tests/bench/CMakeLists.txt: the gateway's HTTP door against
# its nng door (bench_http.c): exec round trip and GetSandbox rate with
# 32 clients. It starts and purges its own stack (deploy/moat-stack):
#   MOAT_IMAGE_DIR=images/out build/bin/moat-bench-http \
#     tests/bench/results/http.json [N] [SECONDS]
pkg_check_modules(BENCH_HTTP_CURL REQUIRED IMPORTED_TARGET libcurl)
add_executable(moat-bench-http ${CMAKE_CURRENT_LIST_DIR}/bench_http.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_stack.c)
target_compile_definitions(moat-bench-http PRIVATE
  MOAT_REPO_DIR="${PROJECT_SOURCE_DIR}"
  MOAT_BIN_DIR="$<TARGET_FILE_DIR:moat-gateway>")
target_link_libraries(moat-bench-http PRIVATE moat_bench_stats moat_client
  PkgConfig::JANSSON PkgConfig::BENCH_HTTP_CURL Threads::Threads)
add_dependencies(moat-bench-http moat-gateway moat-vmd moat-sessiond
  moat-snapd moat)
