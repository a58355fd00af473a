/*
 * fake_node.h: a vmd node in process for the unit tests of
 * tests/unit/vm_lifecycle (test_lifecycle.c, test_tenant.c,
 * test_bounds.c): a temporary root with an image "default" of empty
 * files, a state directory, the node's usual small config and the fake
 * driver (fake_vmm.h). Each test keeps its own env struct and what it
 * adds (an RPC server, a snapshot directory, other bounds). Not for: a
 * vmd as a process (tests/integration/vm/vmd_harness.h).
 */
#ifndef MOAT_TEST_FAKE_NODE_H
#define MOAT_TEST_FAKE_NODE_H

#include <stddef.h>
#include <stdint.h>

#include "moat/rpc.h"
#include "node.h"

/* Creates the empty file dir/name (the test fails if it cannot). Not
 * for: content (moat_write_file). */
void fake_node_touch(const char *dir, const char *name);

/* Makes root (root_size bytes: /tmp/moat-<name>-XXXXXX, made with
 * mkdtemp) with images/default/{vmlinux,initrd.img,rootfs.ext4}, and sets
 * vmd up on it: state dir <root>/state, image dir <root>/images, node
 * "node-test", `accel` with `kvm_device`, 8 vCPUs and 4096 MiB in all,
 * at most 4 vCPUs and 1024 MiB a sandbox, boot timeout 3 s, the fake
 * driver, its mutexes, the accelerator decision and the snapshot index;
 * then fake_vmm_reset. Not for: starting vmd's RPC service (the test
 * does, with vmd_service). */
void fake_node_init(struct vmd *vmd, char *root, size_t root_size,
    const char *name, const char *accel, const char *kvm_device);

/* A call context as vmd's RPC server makes one: request id 1, tenant
 * "tenant-a" (every sandbox call names one), a deadline 60 s away. Not
 * for: calls through a real RPC server (those get theirs from it). */
void fake_node_call_init(struct moat_rpc_call *call);

/* A sandbox of image "default" for tenant "tenant-a", 128 MiB and a 64
 * MiB scratch disk, boot_timeout_ms (0: the node's), checked by
 * vmd_sandbox_validate as `call` and allocated (SANDBOX_BOOTING, no VMM
 * yet); the test fails if either refuses. Not for: a refused request
 * (call vmd_sandbox_validate and check its status). */
struct sandbox *fake_node_sandbox(struct vmd *vmd, struct moat_rpc_call *call,
    uint32_t boot_timeout_ms);

/* Destroys every sandbox of vmd, closes its snapshot index, removes
 * root and frees what fake_node_init allocated. Not for: a node whose
 * RPC server still runs (stop it first). */
void fake_node_fini(struct vmd *vmd, const char *root);

#endif
