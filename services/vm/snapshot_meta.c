/*
 * snapshot_meta.c: a local snapshot's catalog entry, <dir>/meta.pb, read
 * and replaced atomically. Shared by the catalog (snapshot.c) and the
 * RAM copies (snapram.c), so neither needs the other for it; and the
 * parent a push names, found among the entries (snapshot.c, pushq.c).
 * Not for: what the entry says (vm.proto's LocalSnapshot) or listing
 * snapshots.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moat/util.h"
#include "snapshot_meta.h"

/* Reads <dir>/meta.pb. Returns 0 with *meta (caller frees), or errno. */
static int
snap_meta_read(const char *dir, Moat__V1__LocalSnapshot **meta)
{
	char *path = moat_asprintf("%s/" VMD_SNAPSHOT_META, dir);
	char *buf = NULL;
	size_t len = 0;
	int err;

	*meta = NULL;
	if (path == NULL)
		return ENOMEM;
	err = moat_read_file(path, VMD_SNAPSHOT_META_MAX, &buf, &len);
	free(path);
	if (err != 0)
		return err;
	*meta = moat__v1__local_snapshot__unpack(NULL, len, (uint8_t *)buf);
	free(buf);
	return *meta ? 0 : EINVAL;
}

int
vmd_snapshot_read_meta(const char *dir, Moat__V1__LocalSnapshot **meta)
{
	return snap_meta_read(dir, meta);
}

int
vmd_snapshot_write_meta(const char *dir, const Moat__V1__LocalSnapshot *meta)
{
	char *path = moat_asprintf("%s/" VMD_SNAPSHOT_META, dir);
	size_t len = moat__v1__local_snapshot__get_packed_size(meta);
	uint8_t *packed = malloc(len ? len : 1);
	int e;

	if (path == NULL || packed == NULL) {
		free(path);
		free(packed);
		return ENOMEM;
	}
	moat__v1__local_snapshot__pack(meta, packed);
	e = moat_write_file_atomic(path, packed, len, 0600);
	free(packed);
	free(path);
	return e;
}

/* A snapshot directory's name: "snap-...", not a ".tmp" being written. */
static bool
snap_name_ok(const char *name)
{
	size_t n = strlen(name);

	return n > 5 && strncmp(name, "snap-", 5) == 0 &&
	    (n < 4 || strcmp(name + n - 4, ".tmp") != 0);
}

char *
vmd_snapshot_parent(const char *root, const char *sandbox_id)
{
	char *best = NULL;
	uint64_t best_ms = 0;
	struct dirent *de;
	DIR *d = opendir(root);

	while (d != NULL && (de = readdir(d)) != NULL) {
		Moat__V1__LocalSnapshot *m = NULL;
		char *dir;

		if (!snap_name_ok(de->d_name) ||
		    (dir = moat_asprintf("%s/%s", root, de->d_name)) == NULL)
			continue;
		if (vmd_snapshot_read_meta(dir, &m) == 0 && m->remote_stored &&
		    strcmp(m->sandbox_id, sandbox_id) == 0 &&
		    m->created_unix_ms >= best_ms) {
			char *id = strdup(m->remote_id);

			if (id != NULL) {
				free(best);
				best = id;
				best_ms = m->created_unix_ms;
			}
		}
		moat__v1__local_snapshot__free_unpacked(m, NULL);
		free(dir);
	}
	if (d != NULL)
		closedir(d);
	return best;
}
