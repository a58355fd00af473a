/*
 * image.c: the guest images in [vmd] image-dir as files: their paths,
 * whether one is complete, the stamp that tells a rebuild, and the list
 * a node reports. Not for: building images (images/build.sh), booting
 * them, or a console log's tail (vmhost.c).
 */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"

static const char *const sandbox_image_files[] = { "vmlinux", "initrd.img",
	"rootfs.ext4" };

char *
vmd_image_path(const struct vmd *vmd, const char *image, const char *file)
{
	return moat_asprintf("%s/%s/%s", vmd->cfg.image_dir, image, file);
}

char *
vmd_image_stamp(const struct vmd *vmd, const char *image)
{
	char *stamp = strdup("");

	for (size_t i = 0; stamp != NULL &&
	     i < sizeof(sandbox_image_files) / sizeof(sandbox_image_files[0]);
	     i++) {
		char *p = vmd_image_path(vmd, image, sandbox_image_files[i]);
		char *next = NULL;
		struct stat st;

		if (p != NULL && stat(p, &st) == 0)
			next = moat_asprintf("%s%s%jd.%jd%09ld", stamp,
			    i ? "/" : "", (intmax_t)st.st_size,
			    (intmax_t)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
		free(p);
		free(stamp);
		stamp = next;
	}
	return stamp;
}

bool
vmd_image_present(const struct vmd *vmd, const char *image)
{
	for (size_t i = 0;
	     i < sizeof(sandbox_image_files) / sizeof(sandbox_image_files[0]);
	     i++) {
		char *p = vmd_image_path(vmd, image, sandbox_image_files[i]);
		bool ok = p != NULL && access(p, R_OK) == 0;

		free(p);
		if (!ok)
			return false;
	}
	return true;
}

int
vmd_images_list(const struct vmd *vmd, char ***names, size_t *n)
{
	DIR *d = opendir(vmd->cfg.image_dir);
	struct dirent *de;
	char **list = NULL;
	size_t count = 0;

	*names = NULL;
	*n = 0;
	if (d == NULL)
		return MOAT_OK;
	while ((de = readdir(d)) != NULL && count < 256) {
		char **grown;

		if (de->d_name[0] == '.' ||
		    !vmd_image_present(vmd, de->d_name))
			continue;
		if ((grown = realloc(list, (count + 1) * sizeof(*list))) ==
		    NULL)
			break;
		list = grown;
		if ((list[count] = strdup(de->d_name)) == NULL)
			break;
		count++;
	}
	closedir(d);
	*names = list;
	*n = count;
	return MOAT_OK;
}

bool
vmd_image_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > 64 || s[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		        (c >= '0' && c <= '9') || c == '-' || c == '_' ||
		        c == '.'))
			return false;
	}
	return true;
}
