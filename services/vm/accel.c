/*
 * accel.c: which accelerator sandboxes boot with. accel=tcg and accel=kvm
 * are taken as said. accel=auto uses KVM only when /dev/kvm opens *and* a
 * guest actually comes up under it: some hosts (nested, paravirtual) have
 * a /dev/kvm on which the guest kernel hangs. The first boot is then the
 * probe, with a short deadline; if the guest never answers, vmd falls back
 * to TCG with one warning and writes the result to <cache-dir>/accel-probe,
 * keyed by host kernel release, QEMU version and guest kernel hash, so
 * later vmd runs skip the probe. TCG is emulation, not a security
 * boundary QEMU supports, so accel=auto never falls back to it silently:
 * without [vmd] allow-tcg = true a node whose KVM is missing or broken
 * refuses sandboxes (FAILED_PRECONDITION naming the key); accel=tcg,
 * said outright, runs with a warning. Not for: QEMU's command line.
 */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "accel.h"
#include "node.h"
#include "sync.h"

#define ACCEL_CACHE_FILE "accel-probe"
#define ACCEL_CACHE_MAX (64u * 1024u)

/* sha256 of a file as hex into out[65]; false when it cannot be read. */
static bool
file_sha256_hex(const char *path, char out[65])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	unsigned char md[32];
	unsigned int mdlen = 0;
	unsigned char *buf = malloc(1 << 16);
	bool ok = false;
	int fd = -1;
	ssize_t n;

	if (ctx == NULL || buf == NULL)
		goto out;
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		goto out;
	if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1)
		goto out;
	while ((n = read(fd, buf, 1 << 16)) > 0)
		if (EVP_DigestUpdate(ctx, buf, (size_t)n) != 1)
			goto out;
	if (n < 0 || EVP_DigestFinal_ex(ctx, md, &mdlen) != 1 || mdlen != 32)
		goto out;
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
	ok = true;
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	EVP_MD_CTX_free(ctx);
	return ok;
}

/* The cache key for this host, QEMU and guest kernel: one token with no
 * spaces. Heap; NULL when the kernel cannot be hashed. */
static char *
accel_cache_key(struct vmd *vmd, const char *kernel)
{
	struct utsname u;
	char hash[65];
	char *key;

	if (uname(&u) != 0 || !file_sha256_hex(kernel, hash))
		return NULL;
	key = moat_asprintf("%s|%s|%s", u.release,
	    vmd->vmm_version ? vmd->vmm_version : "?", hash);
	if (key != NULL)
		for (char *p = key; *p; p++)
			if (*p == ' ' || *p == '\n' || *p == '\t')
				*p = '_';
	return key;
}

static char *
accel_cache_path(struct vmd *vmd)
{
	return moat_asprintf("%s/" ACCEL_CACHE_FILE, vmd->cfg.cache_dir);
}

/* The cached decision for `key`: "kvm", "tcg" or NULL. */
static const char *
accel_cache_lookup(struct vmd *vmd, const char *key)
{
	char *path = accel_cache_path(vmd);
	char *text = NULL;
	size_t len;
	const char *found = NULL;

	if (path == NULL ||
	    moat_read_file(path, ACCEL_CACHE_MAX, &text, &len) != 0) {
		free(path);
		return NULL;
	}
	for (char *line = strtok(text, "\n"); line != NULL;
	     line = strtok(NULL, "\n")) {
		char *sp = strrchr(line, ' ');

		if (sp == NULL || (size_t)(sp - line) != strlen(key) ||
		    strncmp(line, key, (size_t)(sp - line)) != 0)
			continue;
		if (strcmp(sp + 1, "kvm") == 0)
			found = "kvm";
		else if (strcmp(sp + 1, "tcg") == 0)
			found = "tcg";
	}
	free(text);
	free(path);
	return found;
}

/* Adds (or replaces) the line for `key`. Failures are logged only: the
 * cache saves time, it is not state. */
static void
accel_cache_store(struct vmd *vmd, const char *key, const char *accel)
{
	char *path = accel_cache_path(vmd);
	char *text = NULL;
	char *out = NULL;
	size_t len = 0, used = 0;
	int err;

	if (path == NULL)
		return;
	if ((err = moat_mkdir_p(vmd->cfg.cache_dir, 0755)) != 0) {
		moat_info(0,
		    "accel: cannot create cache dir %s (%s); the "
		    "probe will run again next time",
		    vmd->cfg.cache_dir, strerror(err));
		goto out;
	}
	if (moat_read_file(path, ACCEL_CACHE_MAX, &text, &len) != 0) {
		text = NULL;
		len = 0;
	}
	if ((out = malloc(len + strlen(key) + 16)) == NULL)
		goto out;
	if (text != NULL) {
		for (char *line = strtok(text, "\n"); line != NULL;
		     line = strtok(NULL, "\n")) {
			char *sp = strrchr(line, ' ');
			if (sp != NULL && (size_t)(sp - line) == strlen(key) &&
			    strncmp(line, key, strlen(key)) == 0)
				continue;
			used += (size_t)sprintf(out + used, "%s\n", line);
		}
	}
	used += (size_t)sprintf(out + used, "%s %s\n", key, accel);
	if ((err = moat_write_file_atomic(path, out, used, 0644)) != 0)
		moat_info(0,
		    "accel: cannot write %s (%s); the probe will run "
		    "again next time",
		    path, strerror(err));
out:
	free(out);
	free(text);
	free(path);
}

static bool
kvm_opens(const char *dev)
{
	int fd = open(dev, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		return false;
	close(fd);
	return true;
}

void
vmd_accel_init(struct vmd *vmd)
{
	struct vmd_accel *a = &vmd->accel;

	pthread_mutex_init(&a->mu, NULL);
	vmd_cond_init(&a->cv);
	a->decided[0] = '\0';
	a->probing = false;
	if (strcmp(vmd->cfg.accel, "tcg") == 0) {
		snprintf(a->decided, sizeof(a->decided), "tcg");
		moat_warn(0,
		    "accel=tcg: guests run under TCG emulation, "
		    "which is no security boundary: use KVM for "
		    "untrusted code");
	} else if (strcmp(vmd->cfg.accel, "kvm") == 0) {
		snprintf(a->decided, sizeof(a->decided), "kvm");
	} else if (!kvm_opens(vmd->cfg.kvm_device)) {
		snprintf(a->decided, sizeof(a->decided), "tcg");
		if (vmd->cfg.allow_tcg)
			moat_warn(0,
			    "accel=auto: %s cannot be opened; using TCG "
			    "(allow-tcg = true), which is no security "
			    "boundary",
			    vmd->cfg.kvm_device);
		else
			moat_error(0,
			    "accel=auto: %s cannot be opened and [vmd] "
			    "allow-tcg = false: sandboxes are refused "
			    "(give vmd KVM, or set allow-tcg = true to run "
			    "them under TCG, which is no security boundary)",
			    vmd->cfg.kvm_device);
	}
}

int
vmd_accel_permit(struct vmd *vmd, const char *accel, char **why)
{
	*why = NULL;
	if (accel == NULL || strcmp(accel, "tcg") != 0 ||
	    strcmp(vmd->cfg.accel, "tcg") == 0 || vmd->cfg.allow_tcg)
		return 0;
	*why = moat_asprintf(
	    "node %s has no usable KVM (%s) and runs no sandbox under TCG, "
	    "which is no security boundary: give it KVM, or set [vmd] "
	    "allow-tcg = true (MOAT_VMD_ALLOW_TCG=true) to accept TCG",
	    vmd->cfg.node_id ? vmd->cfg.node_id : "?",
	    strcmp(vmd->cfg.accel, "kvm") == 0 ? "accel = kvm" :
	                                         vmd->cfg.kvm_device);
	return MOAT_FAILED_PRECONDITION;
}

const char *
vmd_accel_choose(struct vmd *vmd, const char *kernel, bool *probe)
{
	struct vmd_accel *a = &vmd->accel;
	const char *result;

	*probe = false;
	pthread_mutex_lock(&a->mu);
	while (a->decided[0] == '\0' && a->probing)
		pthread_cond_wait(&a->cv, &a->mu);
	if (a->decided[0] == '\0') {
		char *key = accel_cache_key(vmd, kernel);
		const char *cached = key ? accel_cache_lookup(vmd, key) : NULL;

		if (cached != NULL) {
			moat_info(0,
			    "accel=auto: using %s, as probed before "
			    "(%s/" ACCEL_CACHE_FILE ")",
			    cached, vmd->cfg.cache_dir);
			snprintf(a->decided, sizeof(a->decided), "%s", cached);
		} else {
			a->probing = true;
			*probe = true;
		}
		free(key);
	}
	result =
	    *probe ? "kvm" : (strcmp(a->decided, "kvm") == 0 ? "kvm" : "tcg");
	pthread_mutex_unlock(&a->mu);
	return result;
}

void
vmd_accel_settle(struct vmd *vmd, const char *kernel, bool known,
    bool kvm_works)
{
	struct vmd_accel *a = &vmd->accel;
	const char *accel = kvm_works ? "kvm" : "tcg";
	char *key = NULL;

	pthread_mutex_lock(&a->mu);
	a->probing = false;
	if (known) {
		snprintf(a->decided, sizeof(a->decided), "%s", accel);
		if (!kvm_works && vmd->cfg.allow_tcg)
			moat_warn(0,
			    "accel=auto: /dev/kvm is present but the "
			    "guest never came up under KVM; falling back to "
			    "TCG (allow-tcg = true), which is no security "
			    "boundary. Set accel=tcg to skip this probe");
		else if (!kvm_works)
			moat_error(0,
			    "accel=auto: /dev/kvm is present but the "
			    "guest never came up under KVM, and [vmd] "
			    "allow-tcg = false: sandboxes are refused (fix "
			    "KVM, or set allow-tcg = true to accept TCG)");
		else
			moat_info(0,
			    "accel=auto: the guest came up under "
			    "KVM; using KVM");
	}
	pthread_cond_broadcast(&a->cv);
	pthread_mutex_unlock(&a->mu);
	if (known && (key = accel_cache_key(vmd, kernel)) != NULL) {
		accel_cache_store(vmd, key, accel);
		free(key);
	}
}

void
vmd_accel_current(struct vmd *vmd, char buf[8])
{
	pthread_mutex_lock(&vmd->accel.mu);
	memcpy(buf, vmd->accel.decided, 8);
	pthread_mutex_unlock(&vmd->accel.mu);
}
