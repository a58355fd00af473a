/*
 * verify.h: what vmd checks before a VMM reads a file (issue 14): the
 * snapshot key, a local snapshot's seal (a digest of each artifact and
 * an HMAC-SHA256 over them and the catalog entry's fields a restore
 * uses), and a guest image's files against its manifest.json, whose
 * SHA-256 is the image's id. A verified-once cache keyed by each file's
 * (dev, inode, size, mtime ns, ctime ns) keeps repeated checks cheap: a
 * changed byte changes ctime, so a changed file is hashed again. Not
 * for: the snapshot catalog (snapshot.c) or building images.
 */
#ifndef MOAT_VMD_VERIFY_H
#define MOAT_VMD_VERIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "snapshot.pb-c.h"
#include "vm.pb-c.h"

struct moat_rpc_call;
struct vmd;

#define VMD_SNAPSHOT_KEY_LEN 32u
#define VMD_DIGEST_LEN 32u
/* The artifacts a sealed snapshot lists: ram, disk, device_state. */
#define VMD_SEAL_N 3u
/* An artifact's digest hashes it in chunks of this size (a chunk that
 * is a hole is not read): SHA-256 over "moat-artifact-v1", the size as
 * 8 bytes little-endian, then each chunk's SHA-256. */
#define VMD_DIGEST_CHUNK (1u << 20)

struct vmd_verify; /* the key and the cache; opaque */

/* vmd_verify_key_load: the 32-byte key in `path`, made (32 random
 * bytes, mode 0600) when it does not exist; *created says so. A key
 * file of another size or readable by group or others is refused.
 * Returns 0 or a status with *errmsg (heap). */
int vmd_verify_key_load(const char *path, uint8_t key[VMD_SNAPSHOT_KEY_LEN],
    bool *created, char **errmsg) __attribute__((warn_unused_result));

/* vmd_verify_new: a verifier with `key` and an empty cache (NULL when
 * out of memory). */
struct vmd_verify *vmd_verify_new(const uint8_t key[VMD_SNAPSHOT_KEY_LEN]);
void vmd_verify_free(struct vmd_verify *v);

/* vmd_verify_file: the digest of `path` (an artifact's chunked digest,
 * or with `plain` the SHA-256 of its bytes) and its size, from the cache
 * when the file's stat key did not change; *cached (may be NULL) says
 * so. Returns 0 or an errno. */
int vmd_verify_file(struct vmd_verify *v, const char *path, bool plain,
    uint8_t out[VMD_DIGEST_LEN], uint64_t *size, bool *cached);

/* vmd_verify_cache_clear: forgets every verified file (benchmarks). */
void vmd_verify_cache_clear(struct vmd_verify *v);

/* vmd_seal_mac: the HMAC-SHA256 under `key` of m's sealed fields
 * (tenant, sandbox_id, image, image_stamp, accel, vmm, vcpus,
 * memory_mib, scratch_mib, template, and each digest's name, size and
 * sha256), in a length-prefixed encoding. Pure. */
void vmd_seal_mac(const uint8_t key[VMD_SNAPSHOT_KEY_LEN],
    const Moat__V1__LocalSnapshot *m, uint8_t mac[VMD_DIGEST_LEN]);

/* Storage for a seal that m's digests and seal point into (the caller's
 * message borrows it). */
struct vmd_seal {
	Moat__V1__SnapshotDigest d[VMD_SEAL_N];
	Moat__V1__SnapshotDigest *p[VMD_SEAL_N];
	uint8_t sha[VMD_SEAL_N][VMD_DIGEST_LEN];
	uint8_t mac[VMD_DIGEST_LEN];
	char names[VMD_SEAL_N][16];
};

/* vmd_snapshot_seal: digests the artifacts in `dir` (a snapshot just
 * captured) and seals `m` (its fields filled already) with them; m
 * borrows `buf`. Without a verifier (unit tests) m stays unsealed.
 * Returns 0 or a status with *errmsg (heap). */
int vmd_snapshot_seal(struct vmd *vmd, Moat__V1__LocalSnapshot *m,
    const char *dir, struct vmd_seal *buf, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_snapshot_verify: checks m's seal and every artifact in `dir`
 * before a VMM loads them: an unsealed snapshot is FAILED_PRECONDITION
 * (take a new one), a seal or artifact that does not match DATA_LOSS
 * naming it; errors go through moat_rpc_error (call may be NULL: then
 * *errmsg, may be NULL, gets the text). No-op without a verifier. */
int vmd_snapshot_verify(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__LocalSnapshot *m, const char *dir, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_seal_label: label i (0: "seal", the MAC; 1..VMD_SEAL_N:
 * "digest.<name>", "<size>:<sha256 hex>") of m's seal for a push to
 * snapd; false when m is unsealed. vmd_seal_from_info: a pulled
 * snapshot's seal from those labels into m (borrowing buf); no "seal"
 * label leaves m unsealed; false when a label is malformed. */
#define VMD_SEAL_LABEL_MAX 96u
bool vmd_seal_label(const Moat__V1__LocalSnapshot *m, size_t i,
    char key[VMD_SEAL_LABEL_MAX], char value[VMD_SEAL_LABEL_MAX]);
bool vmd_seal_from_info(const Moat__V1__SnapshotInfo *info,
    Moat__V1__LocalSnapshot *m, struct vmd_seal *buf);

/* vmd_image_verify: the image's manifest.json hashed (its id, 64 hex
 * digits and a NUL, into id_hex) and every file it lists checked for
 * its size and SHA-256, through the cache. Returns 0 or a status with
 * *errmsg (heap) saying which file and what to do. No-op (id "")
 * without a verifier. */
int vmd_image_verify(struct vmd *vmd, const char *image, char id_hex[65],
    char **errmsg) __attribute__((warn_unused_result));

/* vmd_image_check: the image's files still match its manifest.json
 * (verify.h; cheap while they have not changed since the last check):
 * MOAT_OK, or a status after moat_rpc_error naming the file and what to
 * do. Called for every create and restore, and when a template is built;
 * vmd checks every image at start too. */
int vmd_image_check(struct vmd *vmd, struct moat_rpc_call *call,
    const char *image) __attribute__((warn_unused_result));

/* vmd_images_verify_all: vmd_image_verify on every image present, each
 * result logged (at start). Returns how many were refused. */
unsigned vmd_images_verify_all(struct vmd *vmd);

#endif
