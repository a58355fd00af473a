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
fake_node_init(struct vmd *vmd, char *root, const char *accel,
    const char *kvm_device)
{
	struct vmd_config *cfg = &vmd->cfg;
	char *images;

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
fake_node_fini(struct vmd *vmd, const char *root)
{
	vmd_sandbox_destroy_all(vmd);
	vmd_snapram_fini(vmd);
	(void)moat_rm_rf(root);
	free(vmd->cfg.state_dir);
	free(vmd->cfg.image_dir);
}
