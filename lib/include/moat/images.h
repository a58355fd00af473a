/*
 * images.h: how guest images are kept in moat-snapd (issue 17), the one
 * place vmd and the gateway read it from: a snapshot of the tenant
 * MOAT_IMAGES_TENANT whose labels say it is an image and name it, with
 * the image's files as artifacts. Not for: building images
 * (images/build.sh) or a node's image directory (services/vm/image.c).
 */
#ifndef MOAT_IMAGES_H
#define MOAT_IMAGES_H

/* The snapd tenant that holds images. Tenants named "moat.*" are
 * reserved: the gateway makes no API key for one, so no client's calls
 * act for this tenant. */
#define MOAT_IMAGES_TENANT "moat.images"

/* Labels of an image's snapd entry. */
#define MOAT_IMAGE_LABEL_KIND "kind"
#define MOAT_IMAGE_KIND "image"
#define MOAT_IMAGE_LABEL_NAME "name"
#define MOAT_IMAGE_LABEL_ID "image_id" /* SHA-256 hex of manifest.json */
#define MOAT_IMAGE_LABEL_SOURCE "source"
/* "FILE=SEC.NSEC,..." of the pushing node's files: a pull gives its
 * files the same mtimes, so the image's build stamp (size and mtime,
 * which snapshots and templates are keyed by) is the same on every node
 * and a snapshot of it restores on any of them. */
#define MOAT_IMAGE_LABEL_MTIMES "mtimes"

/* The files of an image, as artifact names; manifest.json last. */
#define MOAT_IMAGE_FILES                                                      \
	{                                                                     \
		"vmlinuz", "vmlinux", "initrd.img", "rootfs.ext4",            \
		    "manifest.json"                                           \
	}

#endif
