/*
 * fake_node.c: a vmd node in process on the fake driver (fake_node.h).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "fake_node.h"
#include "fake_vmm.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "accel.h"
#include "sandbox.h"
#include "snapram.h"

void
fake_node_touch(const char *dir, const char *name)
{
	char *p = moat_asprintf("%s/%s", dir, name);
	FILE *f;

	assert_non_null(p);
	assert_non_null(f = fopen(p, "w"));
	fclose(f);
	free(p);
}

void
fake_node_init(struct vmd *vmd, char *root, size_t root_size, const char *name,
    const char *accel, const char *kvm_device)
{
	struct vmd_config *cfg = &vmd->cfg;
	char *images;

	snprintf(root, root_size, "/tmp/moat-%s-XXXXXX", name);
	assert_non_null(mkdtemp(root));
	images = moat_asprintf("%s/images/default", root);
	assert_int_equal(moat_mkdir_p(images, 0700), 0);
	fake_node_touch(images, "vmlinux");
	fake_node_touch(images, "initrd.img");
	fake_node_touch(images, "rootfs.ext4");
	free(images);
	cfg->state_dir = moat_asprintf("%s/state", root);
	cfg->image_dir = moat_asprintf("%s/images", root);
	assert_int_equal(moat_mkdir_p(cfg->state_dir, 0700), 0);
	cfg->node_id = "node-test";
	cfg->accel = (char *)accel;
	cfg->kvm_device = (char *)kvm_device;
	cfg->vcpus_total = 8;
	cfg->memory_mib_total = 4096;
	cfg->max_vcpus = 4;
	cfg->max_memory_mib = 1024;
	cfg->boot_timeout_ms = 3000;
	vmd->vmm = &fake_vmm_ops;
	vmd->vmm_binary = "fake";
	pthread_mutex_init(&vmd->mu, NULL);
	pthread_mutex_init(&vmd->scratch_mu, NULL);
	pthread_mutex_init(&vmd->fetch_mu, NULL);
	vmd_accel_init(vmd);
	assert_int_equal(vmd_snapram_init(vmd), MOAT_OK);
	fake_vmm_reset();
}

void
fake_node_call_init(struct moat_rpc_call *call)
{
	call->request_id = 1;
	call->tenant = "tenant-a";
	call->deadline_ms = moat_rpc_now_ms() + 60000;
}

struct sandbox *
fake_node_sandbox(struct vmd *vmd, struct moat_rpc_call *call,
    uint32_t boot_timeout_ms)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	const char *test_mode = NULL;
	struct sandbox *sb;

	req.image = "default";
	req.tenant = "tenant-a";
	req.memory_mib = 128;
	req.scratch_mib = 64;
	req.boot_timeout_ms = boot_timeout_ms;
	assert_int_equal(vmd_sandbox_validate(vmd, call, &req, "default",
	                     &test_mode),
	    MOAT_OK);
	assert_non_null(sb = vmd_sandbox_alloc(vmd, &req, "default", NULL));
	return sb;
}

void
fake_node_fini(struct vmd *vmd, const char *root)
{
	vmd_sandbox_destroy_all(vmd);
	vmd_snapram_fini(vmd);
	(void)moat_rm_rf(root);
	free(vmd->cfg.state_dir);
	free(vmd->cfg.image_dir);
}
