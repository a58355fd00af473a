/*
 * ramdir.h: the directory guest RAM lives in, [vmd] ram-dir (ramdir.c).
 * Not for: copying files (extents.h).
 */
#ifndef MOAT_VMD_RAMDIR_H
#define MOAT_VMD_RAMDIR_H

#include <stdbool.h>

/* vmd_ram_dir_set: checks and takes `dir` (at start, before threads)
 * and probes whether it has reflinks; MOAT_OK or a status with *errmsg (heap). */
int vmd_ram_dir_set(const char *dir, char **errmsg);
/* vmd_ram_dir: the directory (default /dev/shm). */
const char *vmd_ram_dir(void);
/* vmd_ram_dir_reflinks: files there clone with FICLONE (XFS, btrfs):
 * snapshots clone RAM instead of copying it in the pause. */
bool vmd_ram_dir_reflinks(void);
/* vmd_ram_path_ours: `path` is a moat-* file right in the RAM dir (what
 * a snapshot's ram link may point at, and purge may remove). */
bool vmd_ram_path_ours(const char *path);
/* vmd_ram_sandbox_path: the RAM file of QEMU sandbox `sandbox_id`
 * ("<ram dir>/moat-<id>.ram"); heap, NULL when out of memory. */
char *vmd_ram_sandbox_path(const char *sandbox_id);
/* vmd_ram_create: makes the empty RAM file `path` for a booting VM,
 * mode 0600 (its VMM's jail then owns it: jail.c), so QEMU never
 * creates it with its own umask. Returns 0 or errno. */
int vmd_ram_create(const char *path);
/* vmd_ram_unlink: removes RAM file `path` and, in a RAM dir with
 * reflinks (XFS), forces its log so the freed blocks are discarded now,
 * not at the next periodic log push (tens of seconds): the loop device
 * under the ramfs (deploy/ramfs.sh) then punches them out of its backing
 * file in /dev/shm and the host has the memory back. Returns 0 or errno
 * (ENOENT included). */
int vmd_ram_unlink(const char *path);
/* vmd_ram_dir_record / vmd_ram_dir_recall: <state>/ram-dir keeps the
 * directory so `moat-vmd purge` finds RAM files without the config.
 * Return 0 or errno (recall: 0 when nothing was recorded). */
int vmd_ram_dir_record(const char *state_dir);
int vmd_ram_dir_recall(const char *state_dir);

/* vmd_ram_sharing_set: takes [vmd] ram-sharing (at start, before
 * threads): "copy" (each restored VM gets its own RAM file, a copy of the
 * snapshot's), "private" (the VMM maps the snapshot's RAM file
 * privately: pages a clone has not written stay one copy in the page
 * cache for every clone; needs the LD_PRELOAD library `preload`, see
 * drivers/ramro/ramro.c) or "auto" (private when that library is there
 * and vmd runs as root, else copy). Returns 0, or a status with *errmsg
 * (heap). */
int vmd_ram_sharing_set(const char *mode, const char *preload, char **errmsg);
/* vmd_ram_private: ram-sharing = private. */
bool vmd_ram_private(void);
/* vmd_ram_sharing: "copy" or "private". */
const char *vmd_ram_sharing(void);
/* vmd_ram_preload: the library for ram-sharing = private ("" when
 * copy). */
const char *vmd_ram_preload(void);

#endif
