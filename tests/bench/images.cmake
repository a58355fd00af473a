# Image pull benchmark (tests/bench/bench_images.c), included by
# tests/bench/CMakeLists.txt. It starts its own moat-snapd and two
# moat-vmds; run it as
#   build/bin/moat-bench-images IMAGE_DIR tests/bench/results/images.json [RUNS]
add_executable(moat-bench-images ${CMAKE_CURRENT_LIST_DIR}/bench_images.c)
target_compile_definitions(moat-bench-images PRIVATE
  MOAT_VMD_BIN="$<TARGET_FILE:moat-vmd>")
target_link_libraries(moat-bench-images PRIVATE moat_bench_stats moat_rpc
  moat_proto PkgConfig::JANSSON PkgConfig::OPENSSL)
add_dependencies(moat-bench-images moat-vmd moat-snapd)
