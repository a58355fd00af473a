# Included by tests/bench/CMakeLists.txt: where create time goes
# (bench_create.c): template clones and cold boots, create -> first exec,
# through the HTTP door and the gateway's nng door, with the node's
# phases (CreateTimings). It starts and purges its own stack:
#   MOAT_IMAGE_DIR=images/out build/bin/moat-bench-create \
#     tests/bench/results/create.json [ROUNDS]
pkg_check_modules(BENCH_CREATE_CURL REQUIRED IMPORTED_TARGET libcurl)
add_executable(moat-bench-create ${CMAKE_CURRENT_LIST_DIR}/bench_create.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_stack.c)
target_compile_definitions(moat-bench-create PRIVATE
  MOAT_REPO_DIR="${PROJECT_SOURCE_DIR}"
  MOAT_BIN_DIR="$<TARGET_FILE_DIR:moat-gateway>")
target_link_libraries(moat-bench-create PRIVATE moat_bench_stats moat_client
  PkgConfig::JANSSON PkgConfig::BENCH_CREATE_CURL)
add_dependencies(moat-bench-create moat-gateway moat-vmd moat-sessiond
  moat-snapd moat)
