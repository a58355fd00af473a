# Included by tests/bench/CMakeLists.txt: the gateway's gRPC door against
# its nng and HTTP doors (bench_grpc.c): exec true round trip, and
# GetSandbox calls per second over 32 gRPC streams. It starts and purges
# its own stack (bench_stack.c):
#   MOAT_IMAGE_DIR=images/out build/bin/moat-bench-grpc \
#     tests/bench/results/grpc.json [N] [SECONDS]
pkg_check_modules(BENCH_GRPC_CURL REQUIRED IMPORTED_TARGET libcurl)
add_executable(moat-bench-grpc ${CMAKE_CURRENT_LIST_DIR}/bench_grpc.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_stack.c)
target_compile_definitions(moat-bench-grpc PRIVATE
  MOAT_REPO_DIR="${PROJECT_SOURCE_DIR}"
  MOAT_BIN_DIR="$<TARGET_FILE_DIR:moat-gateway>")
target_link_libraries(moat-bench-grpc PRIVATE moat_bench_stats moat_client
  PkgConfig::JANSSON PkgConfig::BENCH_GRPC_CURL PkgConfig::NGHTTP2)
add_dependencies(moat-bench-grpc moat-gateway moat-vmd moat-sessiond
  moat-snapd moat)
